"""Configs run to be compared: what `conf/experiment/*.yaml` and users rely on.

- The end-of-sweep studies (Hydra callbacks named by `conf/experiment/*.yaml`):
  `study_report` (`StudyReport`, the classic studies that `classic` defines) and
  `goodput_study` (`GoodputStudy`, each job searched for its goodput), both reading the
  sweep's jobs through `sweep_runs`.
- The capacity search: `goodput` (`python -m experiments.goodput`), on the search in
  `goodput_search`, its conditions in `slo`, its probes in `goodput_probes` and its report
  in `goodput_report`.
- `notebook`: a run, a sweep and a capacity search called from Python, their results as
  pandas DataFrames.
"""
