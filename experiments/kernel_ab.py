"""`python -m experiments.kernel_ab`: the paged decode kernel's source against a git ref's, in one
process. The code: `experiments/bench/kernel_ab.py`."""

from experiments.bench.kernel_ab import main

if __name__ == "__main__":
    main()
