"""`python -m experiments.same_behaviour --base REF`: every count and output token of a fixed set
of runs at a git ref and in the working tree, compared. The code:
`experiments/bench/same_behaviour.py`."""

from experiments.bench.same_behaviour import main

if __name__ == "__main__":
    main()
