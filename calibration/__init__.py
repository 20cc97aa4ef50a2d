"""calibration: what measures (timer, problem space, optuna search, results, the bench harness).

Entry points: `session.calibrate(config)` (an `attn-dispatch calibrate` run, `config.CalibrationConfig`),
`measure.measure` (one trusted point, never raising for a kernel's failure), `timer.time_repetitions`,
`inputs.make_inputs`, `results.ResultsStore`, `plan.sample_problems`, `finish.apply_numerics_gate`.
Submodules are imported by their users; this package imports nothing itself.
"""
