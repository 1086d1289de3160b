"""`python -m experiments.gpu_fit`: fit a GPU's kernels to published tables."""

from framework.calibration.gpu_fit import main

if __name__ == "__main__":
    raise SystemExit(main())
