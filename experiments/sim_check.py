"""`python -m experiments.sim_check`: the simulated executor against the real one."""

from experiments.sim.sim_check import main

if __name__ == "__main__":
    main()
