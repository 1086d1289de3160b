"""`python -m experiments.benchmark`: nanoserve against Hugging Face's own serving paths, on one
loaded model. The code: `experiments/bench/benchmark.py`."""

from experiments.bench.benchmark import main

if __name__ == "__main__":
    main()
