"""`python -m experiments.same_behaviour`: every count and token against a git ref."""

from experiments.bench.same_behaviour import main

if __name__ == "__main__":
    main()
