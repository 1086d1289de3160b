"""The simulator's cost models, measured and fitted: the code that writes the profiles and
hardware specs shipped under `framework/executors/simulated/`.

- A measured profile (`python -m experiments.calibrate`): `calibrate` times the real
  executor over the step shapes of `grid`, each point served and timed as a `point_run`
  while `machine_watch` keeps other processes' work out (`machine_load` reads it), and
  `fitting` fits the profile, which `profile_file` describes.
- An analytic GPU: `gpu_fit` fits a GPU's kernels and all-reduce to published tables read by
  `gpu_tables` (`python -m experiments.gpu_fit`), and `analytic_profile` writes the profile
  of a model on a GPU spec (`python -m experiments.analytic_profile`).
"""
