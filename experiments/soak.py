"""`python -m experiments.soak`: a long overloaded run: invariants, memory, cost."""

from experiments.policy.soak import main

if __name__ == "__main__":
    main()
