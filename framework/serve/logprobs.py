"""Log-probabilities in OpenAI's shapes: a completion's (`tokens`, `token_logprobs`,
`top_logprobs`, `text_offset`) and a chat's (`content`, a list of token entries with their
bytes and top alternatives).

The engine gives each token's entry (`framework.engine.scores.TokenLogprob`); a token's
text here is the tokenizer's decoding of that token alone, as vLLM and OpenAI show it.
"""

from __future__ import annotations

from typing import Any

from framework.core.token_logprob import TokenLogprob


class Logprobs:
    """One choice's log-probabilities as they stream: `add` turns a run of tokens and their
    entries into the shape its endpoint sends, the text offsets counted on from the last."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.offset = 0  # characters of the choice's text before the next token

    def text(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def add(self, ids: list[int], entries: list[TokenLogprob | None]) -> dict[str, Any]:
        """The shape for `ids` (an entry each; None where a token is not scored: a prompt's
        first)."""
        return self._chat(ids, entries) if self.chat else self._completion(ids, entries)

    def _completion(self, ids: list[int], entries: list[TokenLogprob | None]) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token, e in zip(ids, entries, strict=True):
            text = self.text(token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            values.append(None if e is None else e.logprob)
            tops.append(None if e is None else {self.text(t): lp for t, lp in e.top})
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def _chat(self, ids: list[int], entries: list[TokenLogprob | None]) -> dict[str, Any]:
        content = []
        for token, e in zip(ids, entries, strict=True):
            if e is None:
                continue
            content.append(
                {
                    **self._token(token, e.logprob),
                    "top_logprobs": [self._token(t, lp) for t, lp in e.top],
                }
            )
        return {"content": content}

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def joined(parts: list[dict[str, Any]], chat: bool) -> dict[str, Any] | None:
    """A whole answer's shape from its streamed parts (None: none asked)."""
    if not parts:
        return None
    if chat:
        return {"content": [c for p in parts for c in p["content"]]}
    return {key: [v for p in parts for v in p[key]] for key in parts[0]}
