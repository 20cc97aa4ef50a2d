"""calibration: what measures (timer, problem space, optuna search, results, the bench harness).

Public entry points:

- `calibrate(config)` (`calibration.session`): a whole `attn-dispatch calibrate` run.
- `CalibrationConfig` (`calibration.config`): its options and id.
- `measure(kernel, problem, device, ...)` (`calibration.measure`): one trusted point; never raises
  for a kernel's failure.
- `time_repetitions`, `TimerSettings`, `QUICK` (`calibration.timer`), `make_inputs`
  (`calibration.inputs`), `measure_peak_bytes` (`calibration.measure`).
- `ResultsStore` (`calibration.results`), `sample_problems` (`calibration.plan`),
  `apply_numerics_gate` (`calibration.finish`).

Submodules are imported lazily by their users; this package imports nothing heavy itself.
"""
