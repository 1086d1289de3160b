"""Prompts of an exact token count, cut from real English prose.

Trace replay and length sweeps need prompts of exactly N tokens. Random token ids would do for
the count, but then the outputs are gibberish to read and anything content-dependent
(speculative decoding, stop strings, prefix caching) behaves unlike real traffic. So prompts are
windows of a tokenized corpus (`data/corpus.txt`: original plain prose plus the Gettysburg
Address, ~30 KB), starting at a seeded offset per request and wrapping around when N exceeds
the corpus. The ids are the prompt; the text (the corpus span behind them) is only for
reports, since re-encoding it need not give N tokens back.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np
from transformers import PreTrainedTokenizerBase

_CORPUS_FILE = "corpus.txt"


@dataclass(frozen=True)
class TokenizedCorpus:
    """The corpus under one tokenizer: ids, and each token's character span when known.

    Spans let a window's text be sliced from the corpus instead of decoded: decoding is the
    bulk of the cost when a whole trace (tens of millions of tokens) is replayed.
    """

    ids: np.ndarray
    starts: np.ndarray | None  # None: the tokenizer cannot report offsets (slow tokenizers)
    ends: np.ndarray | None


# Tokenizing the corpus takes tens of milliseconds; do it once per tokenizer object, and let
# the entry go when the tokenizer does.
_cache: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, TokenizedCorpus] = (
    weakref.WeakKeyDictionary()
)


@functools.cache
def corpus_text() -> str:
    """The shipped prose, read from the package so it works from an installed wheel too."""
    return (resources.files(__package__) / "data" / _CORPUS_FILE).read_text(encoding="utf-8")


def tokenized_corpus(tokenizer: PreTrainedTokenizerBase) -> TokenizedCorpus:
    """The corpus under `tokenizer`, cached."""
    corpus = _cache.get(tokenizer)
    if corpus is None:
        text = corpus_text()
        if tokenizer.is_fast:
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            spans = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
            ids = np.asarray(enc["input_ids"], dtype=np.int64)
            corpus = TokenizedCorpus(ids, spans[:, 0], spans[:, 1])
        else:
            ids = np.asarray(tokenizer.encode(text, add_special_tokens=False), dtype=np.int64)
            corpus = TokenizedCorpus(ids, None, None)
        if corpus.ids.size == 0:
            raise ValueError("the tokenizer turned the prompt corpus into zero tokens")
        _cache[tokenizer] = corpus
    return corpus


def corpus_token_ids(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    """The corpus as token ids under `tokenizer`."""
    return tokenized_corpus(tokenizer).ids


def _window_text(corpus: TokenizedCorpus, offset: int, length: int) -> str:
    """The corpus text behind tokens [offset, offset + length), wrapping like the ids do."""
    assert corpus.starts is not None and corpus.ends is not None
    text, size = corpus_text(), corpus.ids.size
    pieces: list[str] = []
    while length > 0:
        take = min(length, size - offset)
        pieces.append(text[corpus.starts[offset] : corpus.ends[offset + take - 1]])
        length -= take
        offset = 0
    return "".join(pieces)


def exact_length_prompts(
    tokenizer: PreTrainedTokenizerBase, lengths: Sequence[int], rng: np.random.Generator
) -> list[tuple[list[int], str]]:
    """One (token ids, text) per length, each exactly that many ids long.

    Offsets are drawn from `rng`, so the same seed gives the same prompts and different
    requests (almost surely) start at different places, which keeps prefix caches honest.
    """
    corpus = tokenized_corpus(tokenizer)
    offsets = rng.integers(0, corpus.ids.size, size=len(lengths))
    prompts: list[tuple[list[int], str]] = []
    for length, offset in zip(lengths, offsets, strict=True):
        window = np.take(corpus.ids, np.arange(offset, offset + length), mode="wrap").tolist()
        if corpus.starts is None:
            text = tokenizer.decode(window)
            assert isinstance(text, str)  # one sequence's ids: one text (a batch's: a list)
        else:
            text = _window_text(corpus, int(offset), int(length))
        prompts.append((window, text))
    return prompts
