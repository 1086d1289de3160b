"""`python -m experiments.studies`: the classic studies' tables; `StudyReport` is the sweeps' Hydra
callback. The code: `experiments/policy/studies.py`."""

from experiments.policy.studies import StudyReport, main

__all__ = ["StudyReport", "main"]

if __name__ == "__main__":
    main()
