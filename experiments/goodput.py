"""`python -m experiments.goodput`: the highest request rate at which a share of requests
meets a TTFT and a TPOT target, by bisection over simulated runs. The code:
`experiments/sim/goodput.py`."""

from experiments.sim.goodput import main

if __name__ == "__main__":
    raise SystemExit(main())
