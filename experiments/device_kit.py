"""`python -m experiments.device_kit`: pack what a lent GPU machine needs to run nanoserve. The
code: `experiments/device/device_kit.py`."""

from experiments.device.device_kit import main

if __name__ == "__main__":
    main()
