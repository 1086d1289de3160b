"""`python -m experiments.sim_scale`: whole traces through the simulator."""

from experiments.sim.sim_scale import main

if __name__ == "__main__":
    main()
