"""A per-operator GPU cost model: each kernel of a step priced from its own bytes and FLOPs,
with efficiencies fitted to published per-operator GPU timings (docs/simulator-analytic.md).

- `kernels`: the kernel families (GEMM, streaming elementwise, attention, all-reduce), each a
  small physical formula with a handful of fitted parameters;
- `shard`: one GPU's share of a dense decoder under Megatron tensor parallelism, and the
  operators of one layer at a step's shape.
"""
