"""`python -m experiments.cuda_check`: the CUDA paths end to end on a GPU."""

from experiments.device.cuda_check import main

if __name__ == "__main__":
    raise SystemExit(main())
