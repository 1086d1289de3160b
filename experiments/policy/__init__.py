"""The serving policies studied: the classic studies' tables of a Hydra sweep (`studies`, on
the sweep's jobs read by `sweep_runs`), the deferral window swept in one process
(`window_sweep`), and a long overloaded run (`soak`)."""
