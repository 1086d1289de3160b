"""`python -m experiments.window_sweep`: the deferral window swept in one process."""

from experiments.policy.window_sweep import main

if __name__ == "__main__":
    main()
