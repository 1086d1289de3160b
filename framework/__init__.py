"""nanoserve's framework, one sub-package per job (dependencies point down this list):

- `api`: the plugin contract; `from framework.api import ...` is all a plugin imports;
- `workloads`: the requests a run serves, from configs, files and traces;
- `engine`: the loop and its state (requests, sequences, blocks, KV cache, batch, counters,
  invariants, readback) and the `Executor` seam; it never imports an executor;
- `executors`: what runs the model (the Hugging Face runner, paged attention, packed
  Linear layers, C++ kernels, the sampler, the model loader);
- `run`: from a config to a finished run (config schemas and checks, preflight, app,
  observers, summary, report);
- `tracking`: MLflow (store, run tags, sweep parent runs), sweep progress, plots.
"""
