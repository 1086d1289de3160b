"""The papers' latency metrics in metrics.json and requests.csv: time between tokens
(Sarathi-Serve's TBT), normalized latency (vLLM's), scheduling delay (Sarathi-Serve's), on
hand-built requests whose answers are known, and on a simulated run with a preemption, where
each summary agrees with the per-request columns it comes from."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from framework.core.request import RequestSpec, SamplingParams
from framework.core.sequence import ABORTED, Sequence, Status
from framework.engine.counters import Counters
from framework.engine.loop import RunResult
from framework.run.summary import request_row, summarize
from tests.helpers import cli


def served(
    rid: str, arrival: float, admitted: float | None, tokens: list[float], status: Status
) -> Sequence:
    """A request as a run leaves it: arrival, first admission, each token's time."""
    spec = RequestSpec(rid, [1, 2, 3], SamplingParams(max_tokens=max(len(tokens), 1)), arrival)
    s = Sequence(spec, eos_token_id=None, status=status)
    s.admitted_at = admitted
    s.output_token_ids = list(range(len(tokens)))
    s.token_times = list(tokens)
    s.first_token_at = tokens[0] if tokens else None
    s.finished_at = tokens[-1] if tokens and status is Status.RELEASED else None
    return s


def test_the_latency_metrics_of_known_requests() -> None:
    a = served("a", 0.0, 0.5, [1.0, 1.5, 2.5], Status.RELEASED)
    # Preempted after its first admission at 1.25, admitted again later: its scheduling
    # delay is to the first admission (the engine keeps `admitted_at` through a preemption).
    b = served("b", 1.0, 1.25, [3.0, 3.25], Status.RELEASED)
    b.preemptions = 1
    rejected = served("c", 2.0, None, [], Status.REJECTED)  # never admitted: no delay
    gone = served("d", 0.0, 4.0, [5.0], Status.RELEASED)  # its client went away
    gone.finish_reason = ABORTED
    m = summarize(RunResult([a, b, rejected, gone], [], Counters(), 4, 0, 0))
    gaps = [0.5, 1.0, 0.25]  # every gap between a finished request's tokens, pooled
    assert m["tbt_p50_s"] == pytest.approx(float(np.percentile(gaps, 50)))
    assert m["tbt_p99_s"] == pytest.approx(float(np.percentile(gaps, 99)))
    assert m["normalized_latency_s"] == pytest.approx((2.5 / 3 + 2.25 / 2) / 2)
    assert m["scheduling_delay_mean_s"] == pytest.approx(0.375)
    assert m["scheduling_delay_p50_s"] == pytest.approx(0.375)
    assert m["scheduling_delay_p99_s"] == pytest.approx(float(np.percentile([0.5, 0.25], 99)))
    assert "itl_p50_s" not in m and "itl_p99_s" not in m  # one idea, one name: TBT
    rows = {s.id: request_row(s) for s in (a, b, rejected)}
    assert rows["a"]["scheduling_delay_s"] == 0.5 and rows["b"]["scheduling_delay_s"] == 0.25
    assert rows["a"]["normalized_latency_s"] == pytest.approx(2.5 / 3)
    assert rows["c"]["scheduling_delay_s"] is None and rows["c"]["normalized_latency_s"] is None
    nobody = summarize(RunResult([rejected], [], Counters(), 4, 0, 0))
    assert nobody["tbt_p99_s"] is None and nobody["normalized_latency_s"] is None
    assert nobody["scheduling_delay_p50_s"] is None and nobody["scheduling_delay_mean_s"] is None


def test_a_runs_summary_agrees_with_its_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool too small for every request at once: preemptions; each metric recomputed
    from requests.csv, and admission before the first token for every request."""
    status, _, err = cli(
        capsys, "executor=simulated", "model=tiny", "workload=synthetic",
        "workload.num_requests=12", "workload.prompt_len_max=64", "workload.output_len_max=48",
        "engine.num_blocks=12", "engine.max_num_seqs=6", "allocator=incremental",
        "observers=[]", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert m["preemptions"] > 0 and any(int(r["preemptions"]) for r in rows)
    delay = [float(r["scheduling_delay_s"]) for r in rows]
    for r, d in zip(rows, delay, strict=True):
        assert d == pytest.approx(float(r["admitted_s"]) - float(r["arrival_s"]))
        assert 0 <= d <= float(r["ttft_s"])
        tokens = int(r["output_tokens"])
        assert float(r["normalized_latency_s"]) == pytest.approx(float(r["e2e_s"]) / tokens)
    assert m["scheduling_delay_p50_s"] == pytest.approx(float(np.percentile(delay, 50)))
    assert m["scheduling_delay_p99_s"] == pytest.approx(float(np.percentile(delay, 99)))
    assert m["scheduling_delay_mean_s"] == pytest.approx(float(np.mean(delay)))
    normalized = [float(r["normalized_latency_s"]) for r in rows]
    assert m["normalized_latency_s"] == pytest.approx(float(np.mean(normalized)))
    # requests.csv keeps each token's time to the microsecond: the gaps agree to that.
    gaps = np.concatenate([np.diff([float(t) for t in r["token_times_s"].split()]) for r in rows])
    assert m["tbt_p50_s"] == pytest.approx(float(np.percentile(gaps, 50)), abs=2e-6)
    assert m["tbt_p99_s"] == pytest.approx(float(np.percentile(gaps, 99)), abs=2e-6)
    assert m["mean_rows"] > 1  # requests batched together, vLLM's Fig. 13 measure
