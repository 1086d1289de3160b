"""`python -m experiments.benchmark`: nanoserve against Hugging Face's serving paths."""

from experiments.bench.benchmark import main

if __name__ == "__main__":
    main()
