"""`python -m experiments.calibrate`: a simulator profile measured on this machine."""

from framework.calibration.calibrate import main

if __name__ == "__main__":
    main()
