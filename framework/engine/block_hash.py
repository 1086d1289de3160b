"""The chained hash of a full block of tokens, which names its whole prefix: a prefix cache
publishes a written block under it, and a request's blocks are hashed the same way, once each,
to find the cached ones (`framework.engine.prefix_cache`)."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence


def block_hash(parent: bytes, tokens: Sequence[int], salt: bytes) -> bytes:
    """One full block's hash: its parent's hash, its token ids and the salt (the model and
    dtype), through BLAKE2b-128."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(salt)
    h.update(array("q", tokens).tobytes())
    return h.digest()
