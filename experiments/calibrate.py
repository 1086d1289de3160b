"""`python -m experiments.calibrate`: time the real executor over a grid of steps and fit a
simulator profile. The code: `experiments/sim/calibrate.py`."""

from experiments.sim.calibrate import main

if __name__ == "__main__":
    main()
