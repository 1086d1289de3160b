"""The run's long-lived objects kept out of the cyclic garbage collector's full passes.

A run holds every request of its workload (at trace scale 19,366 prompts as token lists, the
sequences and their lists), the tokenizer and the model's modules, from its start to its end.
Each of Python's full collections walked all of them to free nothing: on the whole Azure
conversation trace under the simulated executor, two full collections inside `Engine.run`
were several percent of the replay (figures: docs/measurements/code-notes.md).
`gc.freeze()` moves what exists when the run starts (and again once its sequences are made)
into the permanent generation, so the collector walks only what the steps allocate;
`gc.unfreeze()` hands them back when the run ends.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[Callable[[], None]]:
    """Freeze the heap for the duration, unless someone already froze it (theirs to undo).
    Yields a function that freezes what was made since (a run's own long-lived objects,
    once built); a no-op where the heap was not ours to freeze."""
    if gc.get_freeze_count():
        yield lambda: None
        return
    gc.freeze()
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()
