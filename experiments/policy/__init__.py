"""The serving policies studied in one process: the deferral window swept (`window_sweep`),
and a long overloaded run (`soak`). The studies of a Hydra sweep are `framework.studies`."""
