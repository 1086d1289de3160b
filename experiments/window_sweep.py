"""`python -m experiments.window_sweep`: what deferring the readback k steps buys and costs, on one
engine. The code: `experiments/policy/window_sweep.py`."""

from experiments.policy.window_sweep import main

if __name__ == "__main__":
    main()
