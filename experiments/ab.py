"""`python -m experiments.ab`: two engine settings on one workload, in alternating rounds, as one
ratio. The code: `experiments/bench/ab.py`."""

from experiments.bench.ab import main

if __name__ == "__main__":
    main()
