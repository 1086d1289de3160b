"""`python -m experiments.soak`: a long overloaded open-loop run: invariants, memory, schedule
cost. The code: `experiments/policy/soak.py`."""

from experiments.policy.soak import main

if __name__ == "__main__":
    main()
