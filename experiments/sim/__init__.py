"""The simulated executor's tools.

- `calibrate`: time the real executor over a grid of steps and fit a profile (`grid` the
  points, `points` one point measured, `gate` other processes kept out, `fitting` the fit,
  `profile_file` what the file says besides it);
- `sim_check`: the simulated executor against the real one on the same workloads
  (`check_cases`, `check_sides` the two engines, `check_machine` the probes and rounds,
  `check_rows`, `check_report`, `twins` the machine's noise measured in the check itself);
- `sim_scale`: whole traces through the simulator, and the engine's host cost per step.
"""
