"""How a preemption policy answers `Preemption.mode`: a setting of its own, `recompute`,
`swap` or `cheaper`, the last decided per victim by the costs the engine predicts.

`cheaper` is the rule vLLM's paper leaves to the engine (section 4.5: which of swapping and
recomputation is faster depends on the hardware and the block size): a victim is swapped
when its KV copied out and back in is predicted to take less than prefilling its computed
tokens again, and the host tier has room for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from framework.api.policy import RECOMPUTE, SWAP

if TYPE_CHECKING:
    from framework.api.policy import EngineView
    from framework.core.sequence import Sequence

CHEAPER = "cheaper"
MODE_SETTINGS = (RECOMPUTE, SWAP, CHEAPER)


def check_mode(setting: str) -> str:
    """The setting as given, or one line naming the field and what it accepts."""
    if setting not in MODE_SETTINGS:
        raise ValueError(
            f"preemption.mode must be one of {', '.join(MODE_SETTINGS)}; got {setting!r}"
        )
    return setting


def choose_mode(setting: str, view: EngineView, victim: Sequence) -> str:
    """`recompute` or `swap` for `victim` under `setting` (`check_mode`'s)."""
    if setting != CHEAPER:
        return setting
    costs = view.preemption_costs(victim)
    if costs is None or not costs.can_swap:
        return RECOMPUTE
    return SWAP if costs.swap_s < costs.recompute_s else RECOMPUTE
