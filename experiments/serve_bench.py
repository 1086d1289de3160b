"""`python -m experiments.serve_bench`: a real load generator (guidellm) against `serve.py`,
its client-side TTFT and ITL beside the server's own for the same requests. The code:
`experiments/bench/serve_bench.py`."""

from experiments.bench.serve_bench import main

if __name__ == "__main__":
    main()
