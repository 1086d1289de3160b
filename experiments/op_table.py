"""`python -m experiments.op_table`: one layer's operators timed on this GPU, in the published
tables' format, for `experiments.gpu_check`. The code: `experiments/device/op_table.py`."""

from experiments.device.op_table import main

if __name__ == "__main__":
    raise SystemExit(main())
