"""Kernels chosen by measurement on the machine at hand (framework/executors/kernel_choice.py):
the setting's values, the decision rule on given timings, the model left as chosen, and the
choice reported in metrics.json. No measured time is asserted: which side wins is the
machine's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from framework.executors import kernel_choice as kc
from framework.executors import linear_choice as lc
from framework.executors.model_loader import TinySpec, load_model
from framework.executors.packed_linear import PACKED
from framework.run.observers import run_with_observers
from tests.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def packed(model: torch.nn.Module) -> bool:
    return any(hasattr(m, PACKED) for m in model.modules())


@pytest.fixture
def fresh() -> torch.nn.Module:
    """A tiny model of its own: the choices are kept per model object."""
    model, _ = load_model("tiny", None, None, torch.float32, CPU, TinySpec())
    return model


def test_setting_values() -> None:
    assert kc.setting("auto", "x") is None and kc.setting("AUTO", "x") is None
    assert kc.setting(True, "x") is True and kc.setting("false", "x") is False
    with pytest.raises(ValueError, match=r"^engine.paged_kernel must be auto .* got 'yes'"):
        kc.setting("yes", "paged_kernel")


@pytest.mark.parametrize(
    ("times", "use"),
    [
        ({"packed": 1.0, "stock": 2.0}, True),
        ({"packed": 0.99, "stock": 1.0}, False),  # within the margin: not worth the memory
        ({"packed": 2.0, "stock": 1.0}, False),
    ],
)
def test_linears_follow_the_measurement(
    fresh: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, times: dict[str, float], use: bool
) -> None:
    monkeypatch.setattr(lc, "_linear_times", lambda model: times)
    monkeypatch.setattr(lc, "_LINEARS", {})
    choice = lc.choose_linears(fresh, "auto")
    assert (choice.use, choice.how) == (use, "measured")
    assert packed(fresh) is use  # the model is left as chosen
    assert choice.why.startswith(f"packed {1e3 * times['packed']:.3g} ms, stock ")


def test_linears_set_and_kept_per_shape(
    fresh: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lc, "_LINEARS", {})
    auto = lc.choose_linears(fresh, "auto")
    assert auto.how == "measured" and "stock" in auto.why and packed(fresh) is auto.use
    assert lc.choose_linears(fresh, False) == kc.Choice(False, "set", "") and not packed(fresh)
    assert lc.choose_linears(fresh, "true").use and packed(fresh)
    lc.choose_linears(fresh, False)
    again = lc.choose_linears(fresh, "auto")  # the kept measurement, applied to the model again
    assert again == auto and packed(fresh) is auto.use
    # Another model object of the same shape gets the same answer without a new measurement.
    monkeypatch.setattr(lc, "_linear_times", lambda model: pytest.fail("measured again"))
    other, _ = load_model("tiny", None, None, torch.float32, CPU, TinySpec())
    assert lc.choose_linears(other, "auto") == auto and packed(other) is auto.use


def test_linears_unavailable_off_cpu_dtypes() -> None:
    model, _ = load_model("tiny", None, None, torch.float16, CPU, TinySpec())
    choice = lc.choose_linears(model, "auto")
    assert (choice.use, choice.how) == (False, "unavailable") and "float16" in choice.why


def test_bf16_linears_stay_stock_where_onednn_has_no_bf16_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an AVX2-only CPU oneDNN refuses to pack a bf16 weight: even when packing is asked
    for, the layers stay stock, the choice says why, and the model still runs."""
    import framework.executors.packed_linear as pl

    monkeypatch.setattr(pl, "bf16_packable", lambda: False)
    model, _ = load_model("tiny", None, None, torch.bfloat16, CPU, TinySpec())
    for value in ("auto", True):
        choice = lc.choose_linears(model, value)
        assert (choice.use, choice.how) == (False, "unavailable") and "AVX512-BW" in choice.why
        assert not packed(model)
    ids = torch.tensor([[1, 2, 3]])
    assert model(input_ids=ids).logits.dtype == torch.bfloat16


def test_decode_kernel_choice() -> None:
    off = kc.choose_decode_kernel(False, CPU, torch.float32, 4, 2, 16, 16)
    assert off == kc.Choice(False, "set", "")
    fp16 = kc.choose_decode_kernel("auto", CPU, torch.float16, 4, 2, 16, 16)
    assert fp16.how == "unavailable" and "float32 or bfloat16" in fp16.why
    if kc.why_not(CPU, torch.float32, 16) is not None:
        pytest.skip("the kernel does not build here")
    for dtype in (torch.float32, torch.bfloat16):
        auto = kc.choose_decode_kernel("auto", CPU, dtype, 4, 2, 16, 16)
        assert auto.how == "measured" and "gather + SDPA" in auto.why
        assert kc.choose_decode_kernel(True, CPU, dtype, 4, 2, 16, 16).use


def test_choices_are_in_metrics_and_mlflow(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = make_cfg(
        "model=tiny", "workload=straggler", "engine.paged_kernel=false",
        "engine.argmax_kernel=false", f"mlflow.tracking_uri={uri}", "observers=[console,mlflow]",
    )  # fmt: skip
    run_with_observers(cfg, tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["decode_attention"] == "gather_sdpa (set)"
    assert metrics["argmax"] == "torch (set)"
    assert metrics["linears"].startswith(("packed (measured: ", "stock (measured: "))
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.tags["nanoserve.decode_attention"] == "gather_sdpa (set)"
    assert run.data.tags["nanoserve.argmax"] == "torch (set)"
    assert run.data.tags["nanoserve.linears"] == metrics["linears"]
    assert run.data.tags["machine.isa"]  # which flags this CPU has
