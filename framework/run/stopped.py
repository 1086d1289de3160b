"""A run stopped by an error: its partial results written and its observers told, without
ever masking the error."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol

from framework.engine.loop import RunResult
from framework.run.report import decode_outputs, mark_incomplete, write_marker, write_results
from framework.run.run_info import RunInfo
from framework.run.summary import summarize

log = logging.getLogger(__name__)


class HasPartialResult(Protocol):
    """What a stopped run's partial results come from: an engine, a cluster, or an engine
    in a process of its own (the server's)."""

    def partial_result(self) -> RunResult: ...


def abort(
    info: RunInfo,
    engine: HasPartialResult,
    tokenizer: Any,
    hooks: Any,
    error: BaseException,
) -> None:
    """Write the partial results and tell the observers; never mask `error`.

    Anything that fails in here (the books of a half-finished step may not add up) is
    logged and noted on `error`, which the caller re-raises.
    """
    summary = mark_incomplete(dict(info.startup), error)
    try:
        result = engine.partial_result()
        summary = mark_incomplete(summarize(result) | info.startup, error)
        info.result, info.summary = result, summary
        info.texts = decode_outputs(tokenizer, result)
        write_results(info.output_dir, info.config, result, summary, info.texts)
    except Exception as exc:
        log.exception("could not write the partial results of the stopped run")
        error.add_note(f"(the partial results could not be written: {exc!r})")
        with contextlib.suppress(Exception):  # at least say that the run is incomplete
            write_marker(info.output_dir, summary)
    try:
        hooks.on_run_abort(run=info, error=error, summary=summary)
    except Exception as exc:
        log.exception("an observer failed in on_run_abort")
        error.add_note(f"(and on_run_abort failed: {exc})")
