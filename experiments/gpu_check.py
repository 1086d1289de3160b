"""`python -m experiments.gpu_check`: the analytic GPU model against a table."""

from experiments.gpu.gpu_check import main

if __name__ == "__main__":
    raise SystemExit(main())
