"""outputs.jsonl: one JSON line a request (or a request's sample), its prompt's and its
output's token ids and text.

A whole Mooncake trace is 12,031 requests of 12k prompt tokens each: 1 GB of text, most of
the time spent writing a run folder. Past `PARALLEL_TOKENS` token ids the lines are
formatted (and gzipped, for `outputs.jsonl.gz`) in chunks by forked workers
(`framework/run/forked.py`); each gzipped chunk is a gzip member of its own, and a file of
several members is one gzip file to every reader. The text is the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from framework.core.sequence import Sequence as Request
from framework.core.token_logprob import TokenLogprob
from framework.run.forked import chunked, encoded, in_order

PARALLEL_TOKENS = 2_000_000  # fewer: one process (a fork and its workers cost more than they save)
CHUNK_REQUESTS = 256

_seqs: Sequence[Request] = ()  # the requests being written, for the forked workers to read
_texts: dict[str, str] = {}
_gzip = False


def write_outputs(path: Path, seqs: Sequence[Request], texts: dict[str, str]) -> None:
    """One line a request, in the run's order; gzipped where `path` ends in `.gz`."""
    global _seqs, _texts, _gzip
    tokens = sum(len(s.spec.prompt_token_ids) + len(s.output_token_ids) for s in seqs)
    _seqs, _texts, _gzip = seqs, texts, path.suffix == ".gz"
    try:
        with path.open("wb") as f:
            if not seqs and _gzip:
                f.write(encoded("", True))
            ranges = chunked(len(seqs), CHUNK_REQUESTS)
            f.writelines(in_order(_format_chunk, ranges, tokens >= PARALLEL_TOKENS))
    finally:
        _seqs, _texts, _gzip = (), {}, False


def line(s: Request, text: str) -> str:
    """One request's line; one of a request's samples (`sampling.n`) also names the request
    and its index."""
    fields: dict[str, object] = {
        "id": s.id,
        "prompt_token_ids": list(s.spec.prompt_token_ids),
        "output_token_ids": s.output_token_ids,
        "text": text,
        "finish_reason": s.finish_reason or ("rejected" if s.reject_reason else None),
        "reject_reason": s.reject_reason,
    }
    if s.group is not None:
        fields["request_id"] = s.group.request.id
        fields["index"] = s.sample_index
    sp = s.sampling
    if sp.logprobs is not None:
        fields["logprobs"] = logprob_entries(s.output_token_ids, s.output_logprobs)
    if sp.prompt_logprobs is not None:  # one copy of the prompt: its first sample's
        scored = s.group.leader if s.group is not None else s
        fields["prompt_logprobs"] = logprob_entries(s.spec.prompt_token_ids, scored.prompt_logprobs)
    return json.dumps(fields) + "\n"


def logprob_entries(tokens: Sequence[int], book: Sequence[TokenLogprob | None]) -> list[object]:
    """Each token's entry, as vLLM writes them: {"token", "logprob", "top": [[id, logprob],
    ...]}, or null where it was not scored (a prompt's first token)."""
    out: list[object] = []
    for i, token in enumerate(tokens):
        e = book[i] if i < len(book) else None
        out.append(None if e is None else {"token": token, "logprob": e.logprob, "top": e.top})
    return out


def _format_chunk(bounds: tuple[int, int]) -> bytes:
    """Requests `start..end-1` as lines (gzipped where the file is)."""
    start, end = bounds
    return encoded("".join([line(s, _texts.get(s.id, "")) for s in _seqs[start:end]]), _gzip)
