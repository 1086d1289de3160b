"""Loading a profile file into the cost model its `kind` names. Apart from `cost` (the
protocol every kind implements), so that no kind's module imports the module that imports it."""

from __future__ import annotations

from pathlib import Path

from framework.executors.simulated.analytic import AnalyticProfile
from framework.executors.simulated.cost import CostModel, read_profile
from framework.executors.simulated.profile import MeasuredProfile


def load_cost_model(path: str | Path) -> CostModel:
    """The cost model a profile file describes."""
    data = read_profile(path)
    if data["kind"] == "measured":
        return MeasuredProfile.from_dict(data, source=str(path))
    return AnalyticProfile.from_dict(data, source=str(path))
