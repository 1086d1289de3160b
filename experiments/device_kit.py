"""`python -m experiments.device_kit`: pack what a GPU machine lacks."""

from experiments.device.device_kit import main

if __name__ == "__main__":
    main()
