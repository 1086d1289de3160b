"""`python -m experiments.studies`: a finished study's table, written again."""

from framework.studies.study_report import main

if __name__ == "__main__":
    main()
