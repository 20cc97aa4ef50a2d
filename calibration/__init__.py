"""calibration: what measures (device identity, timer, problem space, optuna search, results)."""
