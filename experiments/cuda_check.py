"""`python -m experiments.cuda_check`: the CUDA paths end to end on a machine with a GPU. The code:
`experiments/device/cuda_check.py`."""

from experiments.device.cuda_check import main

if __name__ == "__main__":
    raise SystemExit(main())
