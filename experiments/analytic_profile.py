"""`python -m experiments.analytic_profile`: write an analytic profile from a hardware spec and a
model config. The code: `experiments/gpu/analytic_profile.py`."""

from experiments.gpu.analytic_profile import main

if __name__ == "__main__":
    main()
