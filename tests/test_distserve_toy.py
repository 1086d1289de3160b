"""The DistServe toy reproduction, quick form (`python -m experiments.reproduce distserve_toy
--quick`): its cells, and the relations that hold at any scale: the 2P1D goodput computed
from its two rates is min(2p, d) / 3 exactly, the ratio is the two searched goodputs', a rate
meeting both targets meets each (so it lies below the rate that missed either), a
prefill-only GPU serves one-token requests, each decode-only run has the prefill GPUs its
rule gives, a 1P1D hand-off leaves TTFT as the prefill-only GPU has it. DistServe's fitted
step costs, written as nanoserve profiles, price a step as its fits do."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from framework.executors.simulated.features import StepFeatures
from framework.executors.simulated.load import load_cost_model
from framework.studies.reproductions import command
from framework.studies.reproductions.distserve_cells import PUBLISHED
from framework.studies.reproductions.distserve_costs import (
    decode_ms,
    prefill_ms,
    write_profiles,
)
from framework.studies.reproductions.distserve_toy import diagnosis_profiles, prefills_for
from framework.studies.reproductions.reproduction import Context
from tests.helpers import assert_refused


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("distserve")
    store = f"sqlite:///{out / 'mlflow.db'}"
    argv = ["distserve_toy", "--quick", "--workers", "1", "--out", str(out)]
    assert command.reproduce([*argv, f"mlflow.tracking_uri={store}"]) == out
    assert (out / "reproduction.png").stat().st_size > 0
    return json.loads((out / "reproduction.json").read_text())


def test_quick_cells_have_the_blogs_numbers(quick: dict[str, Any]) -> None:
    cells = quick["cells"]
    assert len(cells) == 8
    published = [c["published"] for c in cells]
    assert published == [
        PUBLISHED[k]
        for k in (
            "colocated_ttft",
            "colocated_tpot",
            "colocated_goodput",
            "prefill_only",
            "decode_only",
            "p2d1_per_gpu",
            "p2d1_per_gpu",
            "ratio",
        )
    ]
    assert published == [3.0, 1.6, 1.6, 5.6, 10.0, 3.3, 3.3, 2.1]
    assert [c["unit"] for c in cells] == ["req/s"] * 7 + ["x"]
    for c in cells:
        assert c["simulated"] is not None and c["simulated"] > 0, c["name"]
        assert c["deviation"] == pytest.approx(c["simulated"] / c["published"] - 1)
    assert quick["data"]["diagnosis_skipped"] == "not run (quick form)"


def test_quick_relations_that_hold_at_any_scale(quick: dict[str, Any]) -> None:
    a = quick["data"]["analytic"]
    r, s = a["rates"], a["searches"]
    # The blog's arithmetic, exactly, on the two searched rates.
    assert r["p2d1_computed"] == min(2 * r["prefill_only"], r["decode_only"]) / 3
    assert r["p2d1_per_gpu"] == s["p2d1"]["rate"] / 3
    assert r["ratio"] == r["p2d1_per_gpu"] / r["colocated_goodput"]
    # A rate that met both targets lies below any rate probed that missed one of them.
    both = s["colocated_goodput"]["rate"]
    for single in ("colocated_ttft", "colocated_tpot"):
        assert s[single]["high"] is None or both < s[single]["high"], single
    assert both <= max(s["colocated_ttft"]["rate"], s["colocated_tpot"]["rate"])
    # Every colocated run serves every request; a prefill-only GPU never decodes.
    requests = {p["requests_finished"] for p in a["curves"]["colocated"]}
    assert requests == {40}
    for p in a["curves"]["prefill_only"]:
        assert p["tpot_p90_s"] is None and p["decode_step_s"] is None
        assert p["prefill_step_s"] > 0
    # The hand-off to a decode GPU changes no request's first token.
    check = a["check_1p1d"]
    assert check["rate"] == r["prefill_only"]
    assert check["ttft_p90_s"] == check["prefill_only_ttft_p90_s"]


def test_each_decode_only_run_has_the_prefill_gpus_of_its_rule(quick: dict[str, Any]) -> None:
    prefill = quick["data"]["analytic"]["rates"]["prefill_only"]
    runs = [j for j in quick["jobs"] if j["name"].startswith("decode-only")]
    assert len(runs) >= 4
    for job in runs:
        rate = float(re.search(r"workload\.rate=(\S+)", " ".join(job["overrides"])).group(1))
        (roles,) = [o for o in job["overrides"] if o.startswith("cluster.roles=")]
        assert roles.count("prefill") == prefills_for(rate, prefill)
        assert roles.endswith(",decode]") and roles.count("decode") == 1
        assert "cluster.link=nvlink3" in job["overrides"]


def test_distserve_fits_as_profiles_price_a_step_as_the_fits_do(tmp_path: Path) -> None:
    paths = write_profiles(tmp_path)
    for engine, path in paths.items():
        cost = load_cost_model(path)
        prefill = StepFeatures(
            rows=1,
            num_tokens=512,
            linear_tokens=512,
            prefill_rows=1,
            prefill_tokens=512,
            prefill_attn=512 * 512,
            decode_rows=0,
            decode_ctx=0,
            random_rows=0,
        )
        step = cost.predict(prefill)
        assert step.forward_s + step.sample_s == pytest.approx(prefill_ms(engine, 512) / 1e3)
        decode = StepFeatures(
            rows=24,
            num_tokens=24,
            linear_tokens=24,
            prefill_rows=0,
            prefill_tokens=0,
            prefill_attn=0,
            decode_rows=24,
            decode_ctx=24 * 544,
            random_rows=0,
        )
        step = cost.predict(decode)
        assert step.forward_s + step.sample_s == pytest.approx(decode_ms(engine, 24, 544) / 1e3)
    # vLLM's steps, as DistServe fitted them, are the slower.
    assert prefill_ms("vllm", 512) > prefill_ms("distserve", 512)


def test_the_diagnosis_stays_on_the_fits_own_model_and_gpu(tmp_path: Path) -> None:
    ctx = Context("distserve_toy", True, ["executor.hardware=h100-sxm"], tmp_path)
    paths, why = diagnosis_profiles(ctx)
    assert paths is None and "executor.hardware=h100-sxm" in why
    paths, why = diagnosis_profiles(Context("distserve_toy", True, [], tmp_path))
    assert paths is not None and why == ""
    assert sorted(paths) == ["distserve", "vllm"] and all(p.is_file() for p in paths.values())


def test_a_bad_override_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    status = command.main(["distserve_toy", "--quick", "cluster.link=warp"])
    assert_refused(status, capsys.readouterr().err, "warp")
