"""`python -m experiments.ab`: two engine settings on one workload, as one ratio."""

from experiments.bench.ab import main

if __name__ == "__main__":
    main()
