"""Nanoserve's tools run by hand, each a command: `python -m experiments.<tool>`.

Each `<tool>.py` here is only the command's entry point. The code of the maintainers' tools
lives in the package of its job: `bench` (the engine's speed and behaviour), `sim` (the
simulated executor checked and scaled), `gpu` (the analytic GPU model checked), `device` (a
GPU machine), `policy` (the serving policies studied in one process), all on `toolkit`
(what they share). The tools whose code writes shipped files or that users rely on run code
under `framework/` (`framework.calibration`, `framework.studies`). See README.md.
"""
