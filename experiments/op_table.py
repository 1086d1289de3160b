"""`python -m experiments.op_table`: one layer's operators timed on this GPU."""

from experiments.device.op_table import main

if __name__ == "__main__":
    raise SystemExit(main())
