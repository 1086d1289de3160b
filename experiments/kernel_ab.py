"""`python -m experiments.kernel_ab`: the paged decode kernel against a git ref's."""

from experiments.bench.kernel_ab import main

if __name__ == "__main__":
    main()
