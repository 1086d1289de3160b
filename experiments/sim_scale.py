"""`python -m experiments.sim_scale`: whole traces through the simulated executor, and the engine's
host cost per step. The code: `experiments/sim/sim_scale.py`."""

from experiments.sim.sim_scale import main

if __name__ == "__main__":
    main()
