"""`python -m experiments.cluster_scale`: a trace on 1-8 simulated replicas."""

from experiments.sim.cluster_scale import main

if __name__ == "__main__":
    raise SystemExit(main())
