"""Log-probabilities from a step's logits, on the device and without a wait
(`framework.engine.scores` says what they are and where they go).

They are the log-softmax of the model's logits in fp32, before temperature and top-k / top-p:
the distribution the model gives, whatever the request samples with. A request that asks
for none costs nothing here; a step where some row asks pays one log-softmax and one top-k
over its scored positions alone.
"""

from __future__ import annotations

import torch

from framework.engine.batch import Row
from framework.engine.scores import Layout, Scores
from framework.executors.sampler import to_device


def keep_scored(rows: list[Row], last: list[int]) -> tuple[list[int], list[int], list[int]]:
    """The packed positions whose logits a step keeps when some row scores prompt positions:
    each such row's first `len(prompt_targets)` queries, and every row's last query (`last`:
    each row's last packed position). Returns them, where among them each row's last query
    is (what the sampler reads), and where the scored prompt positions are, in order."""
    keep: list[int] = []
    pick: list[int] = []
    scored: list[int] = []
    for row, end in zip(rows, last, strict=True):
        m = len(row.prompt_targets) if row.prompt_targets else 0
        start = end - len(row.token_ids) + 1
        scored.extend(range(len(keep), len(keep) + m))
        keep.extend(range(start, start + m))
        if start + m - 1 != end:  # the last query is not scored as a prompt position
            keep.append(end)
        pick.append(len(keep) - 1)
    return keep, pick, scored


def score(
    rows: list[Row],
    plan: Layout,
    sampled: torch.Tensor,
    tokens: torch.Tensor,
    prompt: torch.Tensor | None,
) -> Scores:
    """The step's scores in `plan`'s order (`engine.scores.layout` of `rows`). `sampled`:
    the logits the sampler read, a row each; `tokens`: what it drew; `prompt`: the logits
    of the prompt positions scored (None: none), in the plan's order."""
    dev = sampled.device
    logits: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    if plan.prompt:
        assert prompt is not None, "a row scores prompt positions whose logits were not kept"
        ids = [t for row in rows if row.prompt_targets for t in row.prompt_targets]
        logits.append(prompt)
        targets.append(to_device(dev, ids, torch.long))
    if plan.sampled:
        at = to_device(dev, [i for i, _ in plan.sampled], torch.long)
        logits.append(sampled.index_select(0, at))
        targets.append(tokens.index_select(0, at).to(torch.long))
    both = torch.cat(logits) if len(logits) > 1 else logits[0]
    lp = torch.log_softmax(both.float(), dim=-1)
    chosen = lp.gather(1, torch.cat(targets)[:, None])[:, 0]
    top_lp, top_ids = torch.topk(lp, min(plan.top, lp.shape[-1]), dim=-1)
    return Scores(plan, chosen, top_ids, top_lp)
