"""The simulated executor checked and scaled.

- `sim_check`: the simulated executor against the real one on the same workloads
  (`check_cases`, `check_sides` the two engines, `check_machine` the probes and rounds,
  `check_rows`, `check_report`, `check_noise` the machine's noise measured in the check
  itself, from cases that took the same steps);
- `sim_scale`: whole traces through the simulator, and the engine's host cost per step;
- `cluster_scale`: a trace on 1 to 8 simulated replicas, wall time and memory.

The calibration that writes the profiles these check is `framework.calibration`.
"""
