"""`python -m experiments.graph_check`: the decode graphs on a GPU (experiments/device/)."""

from experiments.device.graph_check import main

if __name__ == "__main__":
    raise SystemExit(main())
