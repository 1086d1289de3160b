"""Token ids to text as they stream: each piece of text once it is final, and stop strings
found across token boundaries (OpenAI's `stop`)."""

from __future__ import annotations

from typing import Any


class TextStream:
    """One answer's text, token by token.

    A piece is sent once no later token can change it: not while it ends in an incomplete
    UTF-8 character (the tokenizer's U+FFFD), and not while its tail could be the start of
    a stop string. When a stop string appears, the text ends before it, and `tokens` is the
    count of tokens up to the one that completed it (what `usage` reports). As in vLLM,
    a stop string counts only once it is completed by the `min_tokens`-th token or a later
    one: one wholly in the text of the tokens before is not looked for.
    """

    def __init__(
        self,
        tokenizer: Any,
        stops: list[str],
        skip_special: bool = True,
        keep_stop: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.skip_special = skip_special  # vLLM's skip_special_tokens
        self.keep_stop = keep_stop  # vLLM's include_stop_str_in_output: the text ends after it
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters sent
        self.stopped = False
        self.tokens = 0
        self.min_tokens = min_tokens
        self.floor: int | None = None if min_tokens > 1 else 0  # the text before them: its length

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special)

    def add(self, ids: list[int]) -> str:
        """The new tokens; returns the text that is now final."""
        if self.stopped:
            return ""
        start = len(self.ids)
        self.ids.extend(ids)
        self.tokens = len(self.ids)
        text = self.decode(self.ids)
        if self.floor is None and len(self.ids) >= self.min_tokens:
            self.floor = len(self.decode(self.ids[: self.min_tokens - 1]))
        cut = self._find_stop(text) if self.floor is not None else None
        if cut is not None:
            self.stopped = True
            # The token that completed the stop string: the first prefix whose text holds it.
            for k in range(max(start + 1, self.min_tokens), len(self.ids) + 1):
                if self._find_stop(self.decode(self.ids[:k])) is not None:
                    self.tokens = k
                    break
            piece, self.sent = text[self.sent : cut], max(self.sent, cut)
            return piece
        end = len(text) - self.hold if self.stops else len(text)
        while end > self.sent and text[end - 1] == "\ufffd":
            end -= 1
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent : end], end
        return piece

    def finish(self) -> str:
        """The request ended: whatever is left (a held tail, a last incomplete character)."""
        if self.stopped:
            return ""
        text = self.decode(self.ids)
        piece, self.sent = text[self.sent :], len(text)
        return piece

    def _find_stop(self, text: str) -> int | None:
        """Where the text ends for the first stop string in it: before it, or after it
        where it is kept."""
        floor = self.floor or 0  # where a stop string may start and still count
        found = [
            (i, len(s))
            for i, s in ((text.find(s, max(0, floor - len(s) + 1)), s) for s in self.stops)
            if i >= 0
        ]
        if not found:
            return None
        at, size = min(found)
        return at + size if self.keep_stop else at
