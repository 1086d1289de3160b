"""`python -m experiments.goodput`: the highest request rate that meets an SLO."""

from framework.studies.goodput import main

if __name__ == "__main__":
    raise SystemExit(main())
