"""`python -m experiments.goodput_study SWEEP_DIR`: a finished goodput study's table (the
disaggregation study's), its searches run again. The code: `experiments/policy/goodput_study.py`."""

from experiments.policy.goodput_study import main

if __name__ == "__main__":
    main()
