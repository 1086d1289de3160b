"""What every tool of `experiments/` shares, written once.

- `config`: the reference policy and the timing tools' overrides;
- `engine`: the loaded model the runs of one tool share;
- `workloads`: the request sets the benchmark and the simulator check build alike (the Azure
  slice, the straggler preset, the chat queue, open loops);
- `report`: number formats for tables (`percentile`, `percent`, `num`);
- `cli`: the command-line arguments the tools have in common, spelled once.

What the framework's own tools share too is under `framework/`: where things are
(`framework.run.paths`), composing a config (`framework.run.compose`), silent engine hooks
and torch threads (`framework.run.in_process`), the machine's load
(`framework.calibration.machine_load`), a tool run logged to MLflow
(`framework.tracking.tool_run`).
"""
