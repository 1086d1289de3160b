"""`python -m experiments.gpu_check`: the analytic GPU cost model against a published table, row by
row. The code: `experiments/gpu/gpu_check.py`."""

from experiments.gpu.gpu_check import main

if __name__ == "__main__":
    raise SystemExit(main())
