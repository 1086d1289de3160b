"""`python -m experiments.same_speed`: the simulator's steps/s and a model's tokens/s against a git
ref."""

from experiments.bench.same_speed import main

if __name__ == "__main__":
    main()
