"""`python -m experiments.goodput_study`: a goodput study's table, searched again."""

from framework.studies.goodput_study import main

if __name__ == "__main__":
    main()
