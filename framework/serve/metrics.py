"""`GET /metrics` in the Prometheus text format, one `CollectorRegistry` per server.

Names follow vLLM's where the quantity is the same, with the `nanoserve:` prefix instead of
`vllm:` (dashboards carry over by that one substitution; docs/server.md has the table).
Gauges and counters are the engine's own books, as the engine's loop took them after its last
turn (`EngineLoop.snapshot`: all of one moment, never half a step); the latency histograms
are filled as requests finish, on the engine's clock (a simulation's virtual seconds).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from framework.core.sequence import ABORTED, Sequence
from framework.serve.engine_handle import EngineHandle

P = "nanoserve:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets for the same histograms
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class EngineCollector(Collector):
    """The engine's state and counters at the moment of the scrape."""

    def __init__(self, loop: EngineHandle, model_name: str, info: dict[str, str]) -> None:
        self.loop = loop
        self.model_name = model_name
        self.info = info

    def collect(self) -> Iterator[Any]:
        st = self.loop.snapshot()  # one moment: the state the loop took after its last turn
        labels = ["model_name"]
        name = [self.model_name]

        def gauge(metric: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(P + metric, doc, labels=labels)
            g.add_metric(name, value)
            return g

        def counter(metric: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(P + metric, doc, labels=labels)
            m.add_metric(name, value)
            return m

        yield gauge("num_requests_running", "Requests in the running batch.", st.running)
        yield gauge("num_requests_waiting", "Requests waiting to be admitted.", self.loop.waiting())
        usage = st.blocks_used / st.blocks_total if st.blocks_total else 0.0
        yield gauge("kv_cache_usage_perc", "KV-cache blocks in use, as a fraction (0..1).", usage)
        yield gauge("kv_cache_blocks_used", "KV-cache blocks in use.", st.blocks_used)
        yield gauge("kv_cache_blocks_total", "KV-cache blocks in the pool.", st.blocks_total)
        yield counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            st.prefix_query_tokens,
        )
        yield counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.", st.prefix_hit_tokens
        )
        queries = st.prefix_query_tokens
        rate = st.prefix_hit_tokens / queries if queries else 0.0
        yield gauge("prefix_cache_hit_rate", "Prefix-cache hits / queries so far.", rate)
        yield counter("num_preemptions", "Requests preempted.", st.preemptions)
        yield counter("prompt_tokens", "Prefill tokens computed.", st.prefill_tokens)
        yield counter("generation_tokens", "Output tokens delivered.", st.tokens_kept)
        yield counter(
            "request_accepted", "Requests taken into the engine (not refused).", st.accepted
        )
        yield counter(
            "request_aborted",
            "Requests aborted: their client went away, or the stop's drain ran out.",
            st.aborted,
        )
        yield counter(
            "overshoot_tokens", "Tokens sampled past a stop (deferred output).", st.overshoot_tokens
        )
        yield counter("engine_steps", "Engine steps run.", st.steps)
        info = InfoMetricFamily(P + "server", "What serves: executor, cost model, profile.")
        info.add_metric([], self.info)
        yield info


class ServerMetrics:
    """The registry and the histograms that requests fill as they finish."""

    def __init__(self, loop: EngineHandle, model_name: str, info: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(loop, model_name, info))
        labels = ["model_name"]
        self.model_name = model_name
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Time to first token (arrival to first token).",
            labels,
            registry=self.registry,
            buckets=TTFT_BUCKETS,
        )
        self.tpot = Histogram(
            P + "time_per_output_token_seconds",
            "Seconds between consecutive output tokens.",
            labels,
            registry=self.registry,
            buckets=TPOT_BUCKETS,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds",
            "Arrival to the request's last token.",
            labels,
            registry=self.registry,
            buckets=E2E_BUCKETS,
        )
        self.success = Counter(
            P + "request_success",
            "Requests finished, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.refused = Counter(
            P + "request_refused",
            "Requests refused at admission, by HTTP status (429: the queue bound, 503: stopping).",
            ["model_name", "status"],
            registry=self.registry,
        )

    def refuse(self, status: int) -> None:
        """A request refused at admission (from the HTTP thread): with `request_accepted`,
        every request that reached the engine's door is counted once, either way."""
        self.refused.labels(self.model_name, str(status)).inc()

    def finished(self, seq: Sequence) -> None:
        """A request finished (from the engine thread): its latencies, unless aborted. A
        request of several samples (`n`) finishes with its last sample: counted once, its
        first token the first of any sample, its end the last one's, and every sample's
        gaps between tokens."""
        members = seq.group.members if seq.group is not None else [seq]
        if any(s.finish_reason is None for s in members) or seq.finish_reason == ABORTED:
            return
        if seq is not max(members, key=lambda s: (s.finished_at or 0.0, s.sample_index)):
            return  # samples that finish together are announced together: counted by one
        m = self.model_name
        reason = "stop" if seq.finish_reason == "stop_string" else seq.finish_reason
        self.success.labels(m, reason).inc()
        firsts = [s.first_token_at for s in members if s.first_token_at is not None]
        if firsts:
            self.ttft.labels(m).observe(min(firsts) - seq.arrival)
        tpot = self.tpot.labels(m)
        for s in members:
            for a, b in itertools.pairwise(s.token_times):
                tpot.observe(b - a)
        ends = [s.finished_at for s in members if s.finished_at is not None]
        if ends:
            self.e2e.labels(m).observe(max(ends) - seq.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)
