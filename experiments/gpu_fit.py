"""`python -m experiments.gpu_fit`: fit a GPU's kernel families and all-reduce to published tables.
The code: `experiments/gpu/gpu_fit.py`."""

from experiments.gpu.gpu_fit import main

if __name__ == "__main__":
    raise SystemExit(main())
