"""The simulated executor: the same engine and policies, with each step's cost predicted from
a profile instead of measured on a model. It loads no weights.

- `features`: what a step's cost depends on, read from the engine's `StepBatch` alone;
- `cost`: the `CostModel` protocol, and loading a profile file into one;
- `profile`: measured profiles, a linear fit over the features (`experiments.calibrate`);
- `analytic`: per-operator GPU profiles from a hardware spec (`gpu/`) and a model config
  (no such hardware at hand needed);
- `tokens`: deterministic token streams that honour the requests' stop and length rules;
- `executor`: `SimulatedExecutor`, the `Executor` that puts them together.
"""
