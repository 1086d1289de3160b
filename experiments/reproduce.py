"""`python -m experiments.reproduce NAME`: a paper's published result reproduced on the
simulated executor (`framework/studies/reproductions/`; `--list` names them)."""

from framework.studies.reproductions.command import main

if __name__ == "__main__":
    raise SystemExit(main())
