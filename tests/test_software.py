"""Engine software profiles (`executor.software`): each shipped one loads with a source for
every number; the overlap modes move the virtual clock as documented, checked by hand on a
two-step trace; the software's seconds are a phase of their own in steps.csv; a profile
changes times, never counts; a bad name or field is one line and exit 2."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.software import (
    SOFTWARE_DIR,
    SoftwareClock,
    SoftwareError,
    SoftwareProfile,
    shipped_software,
)
from tests.helpers import assert_refused, cli

SHIPPED = [name for name in shipped_software() if name != "ideal"]
REQUIRED = {"vllm-0.1", "vllm-0.5", "vllm-0.6", "sglang-0.4", "distserve", "sarathi-serve",
            "nanoserve"}  # fmt: skip


def n(value: float) -> dict[str, Any]:
    return {"value": value, "source": "hand-made for the test"}


def profile_dict(overlap: str = "none", launches: str = "eager", **extra: Any) -> dict[str, Any]:
    """A profile with round numbers (seconds in units of 1 ms) to compute cases by hand."""
    data: dict[str, Any] = {
        "format": "nanoserve-software/1",
        "name": "test",
        "engine": "Test",
        "version": "1",
        "host": {
            "per_step_s": n(1e-3),
            "per_row_s": n(1e-3),
            "per_token_s": n(0.0),
            "per_waiting_s": n(1e-3),
        },
        "output": {"per_step_s": n(0.0), "per_row_s": n(2e-3)},
        "launches": {
            "mode": launches,
            "kernels_per_layer": n(10),
            "kernels_per_step": n(0),
            "per_kernel_s": n(1e-4),
            "replay_s": n(1e-3),
            "graph_max_batch": n(8),
        },
        "overlap": {"mode": overlap, "steps": n(2)},
        "server": {"per_request_s": n(5e-3), "per_token_s": n(1e-3), "in_engine_process": True},
    }
    data.update(extra)
    return data


def feats(rows: int, prefill_rows: int = 0, tokens: int | None = None) -> StepFeatures:
    tokens = rows if tokens is None else tokens
    return StepFeatures(
        rows=rows, num_tokens=tokens, linear_tokens=tokens, prefill_rows=prefill_rows,
        prefill_tokens=tokens - (rows - prefill_rows), prefill_attn=0,
        decode_rows=rows - prefill_rows, decode_ctx=0, random_rows=0,
    )  # fmt: skip


def clock(data: dict[str, Any], layers: int = 2, api_server: bool = False) -> SoftwareClock:
    return SoftwareClock(SoftwareProfile.from_dict(data, where="test"), layers, api_server)


# The two-step trace: a prefill of 2 rows (one request waiting), then a decode of 2 rows.
# host = 1 + 1 x rows + 1 x waiting ms; launch (eager) = 10 x 2 layers x 0.1 = 2 ms;
# output = 2 ms a row; the device takes 3 ms, then 5 ms.
PREFILL, DECODE = feats(2, prefill_rows=2, tokens=40), feats(2)
TRACE = ((PREFILL, 3e-3, 1), (DECODE, 5e-3, 0))


def exposed(c: SoftwareClock) -> list[float]:
    return [round(c.step(f, d, w, 0).exposed_s * 1e3, 9) for f, d, w in TRACE]


def test_overlap_modes_by_hand() -> None:
    # none: host + output + max(0, launch - device): (4 + 4 + 0), (3 + 4 + 0)
    assert exposed(clock(profile_dict("none"))) == [8.0, 7.0]
    # async output: host + max(0, launch + previous output - device): 4 + 0, 3 + max(0, 2+4-5)
    assert exposed(clock(profile_dict("async_output"))) == [4.0, 4.0]
    # overlap scheduler: max(0, host + launch + output - device): 4+2+4-3, 3+2+4-5
    assert exposed(clock(profile_dict("overlap_scheduler"))) == [7.0, 4.0]


def test_launch_bound_and_graphs_by_hand() -> None:
    # 10 layers of eager launches (10 ms) over a 3 ms device step: 7 ms of it shows.
    c = clock(profile_dict("none"), layers=10)
    assert round(c.step(DECODE, 3e-3, 0, 0).exposed_s * 1e3, 9) == 3 + 4 + 7
    # Graphs: a decode step within the captured batch is one 1 ms replay (hidden); a prefill
    # step, or a decode wider than the largest graph, launches eagerly.
    g = clock(profile_dict("none", launches="graphs"), layers=10)
    assert round(g.step(DECODE, 3e-3, 0, 0).launch_s * 1e3, 9) == 1.0
    assert round(g.step(PREFILL, 3e-3, 0, 0).launch_s * 1e3, 9) == 10.0
    assert round(g.step(feats(9), 3e-3, 0, 0).launch_s * 1e3, 9) == 10.0


def test_multi_step_schedules_once_every_k_decode_steps() -> None:
    c = clock(profile_dict("multi_step"))  # k = 2
    hosts = [c.step(f, 5e-3, 0, 0).host_s * 1e3 for f in (PREFILL, DECODE, DECODE, DECODE)]
    assert [round(h, 9) for h in hosts] == [3.0, 3.0, 0.0, 3.0]


def test_api_server_in_the_engine_process() -> None:
    data = profile_dict("overlap_scheduler")
    on = clock(data, api_server=True).step(PREFILL, 3e-3, 1, 2)
    off = clock(data).step(PREFILL, 3e-3, 1, 2)
    # 2 new requests x 5 ms + 2 tokens x 1 ms, never hidden by the overlap
    assert round((on.exposed_s - off.exposed_s) * 1e3, 9) == 12.0
    data["server"]["in_engine_process"] = False  # its own process: off the engine's clock
    assert clock(data, api_server=True).step(PREFILL, 3e-3, 1, 2).exposed_s == off.exposed_s


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_profile_loads_with_its_sources(name: str) -> None:
    profile = SoftwareProfile.load(name)
    assert profile.name == name and profile.sources
    raw = yaml.safe_load((SOFTWARE_DIR / f"{name}.yaml").read_text())

    def numbers(node: Any) -> list[dict[str, Any]]:
        if isinstance(node, dict):
            here = [node] if "value" in node else []
            return here + [x for v in node.values() for x in numbers(v)]
        return [x for v in node for x in numbers(v)] if isinstance(node, list) else []

    found = numbers(raw)
    assert found
    for item in found:
        assert isinstance(item.get("source"), str) and len(item["source"]) > 10, item


def test_the_engines_the_papers_ran_are_shipped() -> None:
    assert set(SHIPPED) >= REQUIRED


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["host"]["per_row_s"].pop("source"), "host.per_row_s.source"),
        (lambda d: d["launches"].update(mode="lazy"), "launches.mode must be one of"),
        (lambda d: d["output"].update(per_row_s=3), "output.per_row_s must be {value"),
        (lambda d: d["host"]["per_step_s"].update(value=-1), "host.per_step_s.value"),
    ],
)
def test_a_bad_field_is_named(edit: Any, says: str) -> None:
    data = copy.deepcopy(profile_dict())
    edit(data)
    with pytest.raises(SoftwareError, match=says.replace("{", r"\{").replace(".", r"\.")):
        SoftwareProfile.from_dict(data, where="test")


def test_a_profile_on_a_base_restates_only_what_differs(tmp_path: Path) -> None:
    """`base:` keeps every other number and its source; a restated number brings its own."""
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(profile_dict()))
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({
        "format": "nanoserve-software/1", "base": str(base), "name": "child",
        "overlap": {"mode": "multi_step", "steps": n(10)},
        "host": {"per_row_s": {"value": 5e-3, "source": "restated for the test"}},
    }))  # fmt: skip
    p = SoftwareProfile.load(str(child))
    assert (p.name, p.engine, p.overlap, p.multi_step) == ("child", "Test", "multi_step", 10)
    assert p.host.per_row.value == 5e-3 and p.host.per_row.source == "restated for the test"
    assert p.host.per_step == SoftwareProfile.load(str(base)).host.per_step
    shipped = SoftwareProfile.load("vllm-0.6-multistep")
    assert shipped.host == SoftwareProfile.load("vllm-0.6").host and shipped.multi_step == 10


def test_a_profile_that_is_its_own_base_is_named(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(yaml.safe_dump({"format": "nanoserve-software/1", "base": str(path)}))
    with pytest.raises(SoftwareError, match="base must name another profile"):
        SoftwareProfile.load(str(path))


def run(capsys: Any, tmp: Path, *overrides: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    status, _, err = cli(
        capsys, "model=tiny", "executor=simulated", "executor.hardware=a100-40gb",
        "executor.host_time=model", "workload=straggler", "observers=[console]",
        f"hydra.run.dir={tmp}", *overrides,
    )  # fmt: skip
    assert status == 0, err[-2000:]
    metrics = json.loads((tmp / "metrics.json").read_text())
    with (tmp / "steps.csv").open() as f:
        return metrics, list(csv.DictReader(f))


def test_a_profile_is_a_phase_of_its_own_and_changes_times_not_counts(
    capsys: Any, tmp_path: Path
) -> None:
    ideal, ideal_steps = run(capsys, tmp_path / "ideal")
    eager, steps = run(capsys, tmp_path / "eager", "executor.software=vllm-0.1")
    assert all(float(s["software_s"]) == 0 for s in ideal_steps)
    assert all(float(s["software_s"]) > 0 for s in steps)
    assert eager["software"] == "vllm-0.1" and "software" not in ideal
    for key in ("steps", "token_slots", "tokens_kept", "preemptions", "requests_finished"):
        assert eager[key] == ideal[key], key
    assert eager["makespan_s"] > ideal["makespan_s"]
    # The clock moved by the software, then the device: each step's time is the last's plus
    # its host timeline, the device's seconds beside it waited for at the drain (`wait`).
    step = steps[1]
    gap = float(step["time"]) - float(steps[0]["time"])
    parts = sum(float(step[f"{p}_s"]) for p in ("software", "host", "readback", "wait"))
    assert float(step["wait_s"]) == pytest.approx(
        float(step["forward_s"]) + float(step["sample_s"]), rel=1e-6
    )
    assert gap == pytest.approx(parts, abs=2e-6)  # steps.csv's times are to the microsecond


def test_a_bad_name_is_one_line(capsys: Any, tmp_path: Path) -> None:
    status, _, err = cli(
        capsys, "model=tiny", "executor=simulated", "executor.software=vllm-9",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert_refused(status, err, "executor.software=vllm-9: not a shipped engine profile")


def test_a_bad_file_is_one_line(capsys: Any, tmp_path: Path) -> None:
    bad = profile_dict()
    del bad["host"]["per_token_s"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    status, _, err = cli(
        capsys, "model=tiny", "executor=simulated", f"executor.software={path}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert_refused(status, err, "host.per_token_s must be {value")


def test_the_real_executor_refuses_it(capsys: Any, tmp_path: Path) -> None:
    status, _, err = cli(
        capsys, "model=tiny", "executor.software=vllm-0.1", f"hydra.run.dir={tmp_path}"
    )
    assert_refused(status, err, "executor.software and executor.api_server apply to")


def test_the_engine_check_runs(tmp_path: Path) -> None:
    from experiments.sim import engine_check

    engine_check.main(["--quick", "--out", str(tmp_path)])
    found = json.loads((tmp_path / "engine_check.json").read_text())
    assert len(found) == 1 and all(c["ratio"] > 0 and c["published"] > 0 for c in found)
    for case in found:  # every side ran the profile it names, all its requests served
        assert all(side["requests_per_s"] > 0 for side in case["sides"].values())
    assert "simulated, analytic" in (tmp_path / "engine_check.md").read_text()
