"""A request body turned into the engine's `RequestSpec`: the prompt's token ids (a chat's
through the tokenizer's chat template) and the sampling parameters, or a 400 naming what
cannot be served."""

from __future__ import annotations

import random
import uuid
from typing import Any

from framework.core.request import RequestSpec, SamplingParams
from framework.serve.engine_facts import EngineFacts
from framework.serve.errors import ApiError
from framework.serve.protocol import ChatRequest, CompletionRequest, SamplingFields

# OpenAI's default for /v1/completions; a chat's default is all the room the prompt leaves.
COMPLETION_MAX_TOKENS = 16


class Prompts:
    def __init__(self, tokenizer: Any, facts: EngineFacts, seed: int) -> None:
        self.tokenizer = tokenizer
        self.facts = facts
        self.vocab = len(tokenizer)
        # A request without `seed` samples with one drawn here: a server run is reproducible
        # from its own seed, and a request that gives one is reproducible on its own.
        self.rng = random.Random(seed)

    @property
    def room(self) -> int:
        """The longest prompt + output the engine could ever serve."""
        return self.facts.room

    def completion(self, body: CompletionRequest) -> list[int]:
        p = body.prompt
        if isinstance(p, list) and p and not isinstance(p[0], int):
            if len(p) != 1:
                raise ApiError(400, "one prompt per request is served", "prompt")
            p = p[0]
        if isinstance(p, str):
            ids = self.tokenizer.encode(p, add_special_tokens=body.add_special_tokens) if p else []
        else:
            ids = list(p)  # type: ignore[arg-type]
            bad = [t for t in ids if not 0 <= t < self.vocab]
            if bad:
                raise ApiError(
                    400,
                    f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})",
                    "prompt",
                )
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        return ids

    def chat(self, body: ChatRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(
                400,
                "this model's tokenizer has no chat template: use /v1/completions",
                "messages",
            )
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        extra = body.chat_template_kwargs or {}
        try:
            if body.add_special_tokens:  # the rendered template, then the tokenizer's own
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False, **extra
                )
                return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=True)]
            out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **extra)
        except (TypeError, ValueError) as error:  # a kwarg the template or tokenizer refuses
            raise ApiError(400, f"chat_template_kwargs: {error}", "chat_template_kwargs") from None
        ids = out["input_ids"] if hasattr(out, "keys") else out
        return [int(t) for t in ids]

    def beam_width(self, body: SamplingFields, samples: int) -> int:
        """The beams of a request that asks for vLLM's beam search: `best_of` (else `n`) of
        them; 1 for any other request."""
        if not body.use_beam_search:
            return 1
        why = None
        if body.stream:
            why = "beam search is not streamed (its beams change until the end)"
        elif body.temperature != 0:
            why = "beam search is greedy: set temperature=0"
        elif body.shaping():
            why = f"beam search ranks the model's own log-probabilities: no {body.shaping()}"
        elif samples < 2:
            why = "beam search needs best_of (or n) >= 2 beams"
        elif not self.facts.forks:
            why = "beams share blocks, which this server's extents cannot (engine.kv_layout)"
        if why is not None:
            raise ApiError(400, f"use_beam_search: {why}", "use_beam_search")
        return samples

    def spec(self, body: SamplingFields, ids: list[int], kind: str) -> RequestSpec:
        refused = body.unsupported()
        if refused is not None:
            raise ApiError(400, f"{refused[0]}: {refused[1]}", refused[0])
        max_tokens = body.max_tokens
        if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
            max_tokens = body.max_completion_tokens
        if max_tokens is None:
            if kind == "chat":
                max_tokens = self.room - len(ids)
                if max_tokens < 1:
                    raise ApiError(
                        400,
                        f"the prompt's {len(ids)} tokens leave no room for an answer "
                        f"(this server serves {self.room} tokens a request)",
                        "messages",
                    )
            else:
                max_tokens = COMPLETION_MAX_TOKENS
        if body.min_tokens > max_tokens:
            raise ApiError(
                400, f"min_tokens={body.min_tokens} is above the answer's {max_tokens} tokens",
                "min_tokens",
            )  # fmt: skip
        rows = self.facts.max_num_seqs
        samples = body.samples
        if samples > rows:
            field = "n" if samples == body.n else "best_of"
            raise ApiError(
                400,
                f"{field}={samples} samples cannot run side by side in this server's {rows} "
                "rows (engine.max_num_seqs)",
                field,
            )
        stop_ids = tuple(body.stop_token_ids or ())
        bad = [t for t in stop_ids if not 0 <= t < self.vocab]
        if bad:
            raise ApiError(
                400, f"stop token id {bad[0]} is outside the vocabulary", "stop_token_ids"
            )
        logprobs, prompt_logprobs = body.scoring()
        beams = self.beam_width(body, samples)
        if samples > body.n and logprobs is None and beams == 1:  # best_of: ranked by them
            logprobs = 0
        scored = logprobs is not None or prompt_logprobs is not None or beams > 1
        if scored and not self.facts.scores:
            field = "use_beam_search" if beams > 1 else "best_of" if samples > body.n else ""
            field = field or "logprobs"
            raise ApiError(
                400,
                f"{field}: this server's executor computes no log-probabilities (a simulator "
                "has no logits)",
                field,
            )
        shaping = body.shaping()
        if shaping and not self.facts.scores:
            raise ApiError(
                400, f"{shaping}: this server's executor has no logits to change (a simulator)",
                shaping,
            )  # fmt: skip
        sampling = SamplingParams(
            temperature=body.temperature,
            top_k=max(0, body.top_k),
            top_p=body.top_p,
            seed=body.seed if body.seed is not None else self.rng.randrange(2**31),
            max_tokens=max_tokens,
            min_p=body.min_p,
            stop_token_ids=stop_ids,
            ignore_eos=body.ignore_eos,
            n=body.n if beams > 1 else samples,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            beam_width=beams,
            length_penalty=body.length_penalty,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            min_tokens=body.min_tokens,
        )
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return RequestSpec(f"{prefix}-{uuid.uuid4().hex}", ids, sampling)
