"""What every tool of `experiments/` shares, written once.

- `paths`: where the repository, its configs, its outputs and the shared traces live;
- `config`: composing a run config from Hydra overrides (`compose_cfg`), the reference policy;
- `engine`: the loaded model the runs of one tool share, silent engine hooks, torch threads;
- `workloads`: the request sets the benchmark, the simulator check and the calibration build
  alike (the Azure slice, the straggler preset, the chat queue, open loops);
- `machine`: probes of the machine itself (CPU seconds, other processes' share, timing);
- `report`: number formats for tables (`percentile`, `percent`, `num`, `cell`);
- `tracking`: one tool run logged to MLflow (`log_run`);
- `cli`: the command-line arguments the tools have in common, spelled once.
"""
