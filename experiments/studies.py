"""`python -m experiments.studies`: the classic studies' tables. The code, and the sweeps'
Hydra callback `StudyReport`: `experiments/policy/studies.py`."""

from experiments.policy.studies import main

if __name__ == "__main__":
    main()
