"""`python -m experiments.serve_bench`: a load generator against serve.py."""

from experiments.bench.serve_bench import main

if __name__ == "__main__":
    main()
