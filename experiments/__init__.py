"""Nanoserve's experiments: one toolset, run as `python -m experiments.<tool>`.

Each `<tool>.py` here is the command a user types; its code lives in the package of its job:
`bench` (the engine's speed), `sim` (the simulated executor: calibrate, check, scale), `gpu`
(the analytic GPU cost model), `device` (a lent GPU machine), `policy` (the serving
policies' studies), all built on `toolkit` (what they share). See README.md.
"""
