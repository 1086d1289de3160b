"""`python -m experiments.cluster_scale`: the Mooncake trace on 1-8 simulated replicas, wall
time and peak memory. The code: `experiments/sim/cluster_scale.py`."""

from experiments.sim.cluster_scale import main

if __name__ == "__main__":
    raise SystemExit(main())
