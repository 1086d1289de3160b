"""`python -m experiments.analytic_profile`: an analytic profile of a model on a GPU spec."""

from framework.calibration.analytic_profile import main

if __name__ == "__main__":
    main()
