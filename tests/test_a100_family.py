"""The A100 family in the analytic simulator: the 40GB SXM4 and 80GB PCIe specs carry the
80GB SXM4's fitted kernels; each spec names its default interconnect; an A100 prices tensor
parallelism over NVLink 3 (a DGX) or an NVLink bridge (PCIe pairs), set against Vidur's A100
all-reduce tables; and the OPT-13B and Mistral-7B shapes (OPT's layer, Mistral's sliding
window) price and run end to end. No GPU: the tables are published measurements."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.gpu import gpu_check
from framework.calibration import gpu_fit
from framework.calibration.gpu_tables import read_collective_table, read_operator_table
from framework.engine.kv_cache import bytes_per_block
from framework.executors.simulated.analytic import MODELS_DIR, AnalyticProfile
from framework.executors.simulated.cost import ProfileError
from framework.executors.simulated.features import StepFeatures, band_pairs
from framework.executors.simulated.gpu.hardware import (
    HARDWARE_DIR,
    HardwareSpec,
    load_hardware_spec,
)
from framework.executors.simulated.gpu.model_shape import ModelShape
from framework.executors.simulated.links import shipped_links
from framework.run.app import model_dims
from tests.helpers import assert_refused, cli

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "experiments" / "gpu" / "published"
A100_DGX = PUBLISHED / "a100_dgx.all_reduce.csv"
A100_PAIRS = PUBLISHED / "a100_pairwise_nvlink.all_reduce.csv"
SHARED = ROOT.parent / "shared" / "data" / "gpu"
A100_TABLE = SHARED / "a100" / "Meta-Llama-3-8B.mlp.csv"
OPT_13B = MODELS_DIR / "opt-13b"
MISTRAL_7B = MODELS_DIR / "mistral-7b"
LLAMA_8B = MODELS_DIR / "llama-8b"


def config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def spec(name: str) -> HardwareSpec:
    return HardwareSpec.from_dict(load_hardware_spec(name))


def decode(rows: int, ctx: int) -> StepFeatures:
    """`rows` greedy rows decoding one token each over `ctx` tokens of context."""
    return StepFeatures(rows, rows, rows, 0, 0, 0, rows, rows * ctx, 0, ctx)


def prefill(tokens: int, attn: int | None = None) -> StepFeatures:
    """One fresh prompt of `tokens` tokens (`attn`: its queries x context, as features say)."""
    square = tokens * tokens if attn is None else attn
    return StepFeatures(1, tokens, tokens, 1, tokens, square, 0, 0, 0)


# ---- the GPUs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bandwidth", "capacity", "default"),
    [
        ("a100-40gb", 1.555e12, 40e9, "dgx"),
        ("a100-80gb", 2.039e12, 80e9, "dgx"),
        ("a100-80gb-pcie", 1.935e12, 80e9, "nvlink_pair"),
    ],
)
def test_the_a100_specs_are_their_datasheets_with_one_fitted_kernel_block(
    name: str, bandwidth: float, capacity: float, default: str
) -> None:
    """Each part's own memory, the same GA100 peaks and SMs, and the 80GB SXM4's fitted
    kernels (the same SM and tensor cores), said in its assumptions."""
    s, sxm = spec(name), spec("a100-80gb")
    assert (s.memory_bandwidth, s.memory_capacity, s.sms) == (bandwidth, capacity, 108)
    assert s.peak_flops == {
        "float32": 19.5e12,
        "tfloat32": 156e12,
        "bfloat16": 312e12,
        "float16": 312e12,
    }
    assert s.kernels == sxm.kernels and s.attention == sxm.attention
    assert s.kernels.fitted_on.endswith("(NVIDIA A100 80GB SXM4)")
    assert s.default_interconnect == default
    if name != "a100-80gb":
        assert any("carried over" in a for a in s.assumptions)
    assert any("datasheet" in src for src in s.sources)


def test_every_shipped_spec_names_a_default_interconnect_it_has() -> None:
    for path in sorted(HARDWARE_DIR.glob("*.yaml")):
        s = spec(path.stem)
        assert s.default_interconnect in s.interconnects, path.stem
        for name, source in s.links.items():
            assert source.link in shipped_links() and name in s.interconnects


def test_a_refit_of_the_a100_table_writes_the_kernels_and_keeps_a_carried_interconnect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`experiments.gpu_fit --write` on a spec whose interconnect is carried (the PCIe card):
    the fitted block below the marker is the shipped one, and the `links:` above it still
    prices the bridged pair."""
    if not A100_TABLE.is_file():
        pytest.skip("the published GPU tables (shared/data/gpu) are not beside the repo")
    sxm, copy = tmp_path / "a100-80gb.yaml", tmp_path / "a100-80gb-pcie.yaml"
    for path in (sxm, copy):
        shutil.copy(HARDWARE_DIR / path.name, path)
    args = [str(A100_TABLE), "--hardware", str(sxm), "--also", str(copy), "--write"]
    assert gpu_fit.main(args) == 0
    assert capsys.readouterr().out.count("wrote the fit") == 2
    refit = HardwareSpec.from_dict(load_hardware_spec(copy))
    shipped = spec("a100-80gb-pcie")
    assert refit.interconnects == shipped.interconnects
    for key, value in refit.kernels.gemm.to_dict().items():
        assert value == pytest.approx(shipped.kernels.gemm.to_dict()[key], rel=0.02), key
    table = read_operator_table(A100_TABLE)
    assert gpu_check.check_operators(A100_TABLE, refit)["layer"]["rows"] == len(table.tokens)


# ---- the interconnects ---------------------------------------------------------------------


def test_the_a100_dgx_is_fitted_on_its_own_rows_and_the_pcie_pair_carries_the_h100_form() -> None:
    """The DGX A100 (80GB and 40GB: the same NVLink 3 and NVSwitch) is priced by its own
    table's fit; the PCIe pair, which has no table to fit, at the H100 NVL pairs' share of the
    same bridge (300 GB/s each way), with the H100's latency."""
    links = shipped_links()
    assert links["nvlink3"].bandwidth == 300e9 and links["nvlink"].bandwidth == 450e9
    assert links["nvlink_bridge"].bandwidth == 300e9
    h100, sxm, pcie = spec("h100-sxm"), spec("a100-80gb"), spec("a100-80gb-pcie")
    fitted = gpu_fit.fit_all_reduce(read_collective_table(A100_DGX))
    for hw in (sxm, spec("a100-40gb")):
        dgx = hw.interconnects["dgx"]
        for n in (2, 4, 8):
            assert dgx.latency_s[n] == pytest.approx(fitted.latency_s[n], rel=1e-4)
            assert dgx.bus_bandwidth[n] == pytest.approx(fitted.bus_bandwidth[n], rel=1e-4)
            # about half of NVLink 3's bandwidth, where the H100 DGX reaches 0.72-0.80 of NVLink 4
            assert 0.5 < dgx.bus_bandwidth[n] / 300e9 < 0.6
    pair = pcie.interconnects["nvlink_pair"]
    assert pair.workers == (2,)
    assert pair.bus_bandwidth[2] == h100.interconnects["nvlink_pair"].bus_bandwidth[2]


def test_tensor_parallel_2_on_an_a100_prices_two_all_reduces_a_layer() -> None:
    """`executor.tensor_parallel=2` on the A100 80GB SXM4: a 512-token prefill's all-reduces
    are two a layer of tokens x hidden in bf16 over NVLink 3, plus the logits' gather."""
    p = AnalyticProfile.build(load_hardware_spec("a100-80gb"), config(LLAMA_8B), "bfloat16")
    two = AnalyticProfile.build(
        load_hardware_spec("a100-80gb"), config(LLAMA_8B), "bfloat16", tensor_parallel=2
    )
    assert two.interconnect == "dgx" and two.meta["interconnect"] == "dgx"
    link = two.hardware.interconnects["dgx"]
    e = two.estimate(prefill(512))
    gather = link.seconds(128256 * 2 / 2, 2)
    assert e.ops["all_reduce"] == pytest.approx(32 * 2 * link.seconds(512 * 4096 * 2, 2) + gather)
    # 4 MB a message: about 25 us at the A100 DGX's fitted 170 GB/s, plus 44 us
    assert 60e-6 < link.seconds(512 * 4096 * 2, 2) < 75e-6
    assert two.estimate(prefill(512)).forward_s < p.estimate(prefill(512)).forward_s


def test_the_a100_dgx_table_mixes_rows_across_nodes_with_rows_within_one() -> None:
    """Vidur's A100 DGX all-reduce table, its `size` in bytes: the rows across two nodes (one
    GPU a node) reach about 6 GB/s of bus bandwidth, those within one node 130-175 GB/s at 32 MB
    and up. The reader keeps the rows within one node."""
    with A100_DGX.open(newline="") as f:
        rows = list(csv.DictReader(f))
    busbw: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        n, per_node, size = int(r["num_workers"]), int(r["devices_per_node"]), int(r["size"])
        if size >= 32e6:
            seconds = float(r["time_stats.all_reduce.median"]) * 1e-3
            busbw.setdefault((per_node, n), []).append(2 * (n - 1) / n * size / seconds / 1e9)
    assert set(busbw) == {(1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16)}
    assert max(busbw[(1, 2)]) < 7
    for n in (2, 4, 8):
        assert min(busbw[(n, n)]) > 125 and max(busbw[(n, n)]) < 180, n
    table = read_collective_table(A100_DGX)
    assert sorted(set(table.workers.tolist())) == [2, 4, 8] and len(table.workers) == 3 * 994


def test_nvlink_pricing_against_the_a100_tables() -> None:
    """Both A100 tables within the all-reduce target (MAPE <= 15% from 1 MB): the PCIe pairs
    (Azure NC96ads_A100_v4) priced in the H100 NVL pairs' form, which was not fitted on them;
    the DGX on its own fit. Held apart: fitted on every other message size, the DGX form
    reads the sizes it did not see within the target too."""
    pairs = gpu_check.check_collective(A100_PAIRS, spec("a100-80gb-pcie"), "nvlink_pair")
    assert pairs["collective"]["mape"] <= 0.15, pairs["collective"]
    assert pairs["unfitted_workers"] == [4]  # two pairs across PCIe: not a bridged pair
    dgx = gpu_check.check_collective(A100_DGX, spec("a100-80gb"), "dgx")
    assert dgx["collective"]["mape"] <= 0.15, dgx["collective"]
    for n, stats in dgx["by_workers"].items():
        assert stats["mape"] <= 0.15, (n, stats)
    table = read_collective_table(A100_DGX)
    sizes = np.unique(table.nbytes[table.nbytes >= gpu_fit.MIN_COLLECTIVE_BYTES])
    seen = np.isin(table.nbytes, sizes[::2])
    half = replace(table, **{k: getattr(table, k)[seen] for k in ("workers", "nbytes", "seconds")})
    form = gpu_fit.fit_all_reduce(half)
    unseen = ~seen & (table.nbytes >= gpu_fit.MIN_COLLECTIVE_BYTES)
    predicted = np.array(
        [
            form.latency_s[int(n)] + 2 * (n - 1) / n * b / form.bus_bandwidth[int(n)]
            for b, n in zip(table.nbytes[unseen], table.workers[unseen], strict=True)
        ]
    )
    assert unseen.sum() > 1000
    assert np.mean(np.abs(predicted / table.seconds[unseen] - 1)) <= 0.15


def test_a_bridged_pair_refuses_tensor_parallel_4_in_one_line() -> None:
    hw = load_hardware_spec("a100-80gb-pcie")
    assert AnalyticProfile.build(hw, config(LLAMA_8B), "bfloat16", tensor_parallel=2).link
    with pytest.raises(ProfileError) as err:
        AnalyticProfile.build(hw, config(LLAMA_8B), "bfloat16", tensor_parallel=4)
    assert (
        str(err.value) == "executor.tensor_parallel=4: a100-80gb-pcie over nvlink_pair accepts 1, 2"
    )


def test_a_spec_cannot_both_fit_and_carry_one_interconnect(tmp_path: Path) -> None:
    text = (HARDWARE_DIR / "a100-80gb-pcie.yaml").read_text()  # its nvlink_pair is carried
    bad = tmp_path / "both.yaml"
    bad.write_text(
        text
        + "interconnects:\n  nvlink_pair:\n    2: {latency_s: 1.0e-5, bus_bandwidth: 1.0e+11}\n"
    )
    with pytest.raises(ProfileError, match="nvlink_pair is fitted below the marker as well"):
        load_hardware_spec(bad)


# ---- the model shapes ----------------------------------------------------------------------


def test_opt_13b_is_its_published_size_and_keeps_800_kib_of_kv_a_token() -> None:
    """OPT's fields: ffn_dim, no KV heads (MHA), biases, LayerNorms with a bias, a learned
    position table, a tied head, a plain MLP of two matrices."""
    s = ModelShape.from_config(config(OPT_13B))
    assert (s.hidden_size, s.intermediate_size, s.num_hidden_layers) == (5120, 20480, 40)
    assert s.num_key_value_heads == s.num_attention_heads == 40
    assert not s.gated_mlp and s.attention_bias and s.mlp_bias and s.norm_bias
    assert s.tie_word_embeddings and s.learned_positions == 2050 and s.sliding_window is None
    assert s.mlp_params == 2 * 5120 * 20480 + 20480 + 5120
    assert s.total_params == 12_853_473_280
    assert abs(s.total_params / 12.9e9 - 1) < 0.01
    assert 2 * s.kv_elements_per_token == 2 * 5120 * 40 * 2 == 819_200  # fp16 bytes
    # the engine's pool: the same bytes a token
    from transformers import AutoConfig

    layers, kv_heads, head_dim = model_dims(
        type("M", (), {"config": AutoConfig.from_pretrained(OPT_13B)})
    )
    assert bytes_per_block(layers, kv_heads, head_dim, 16, torch.float16) == 16 * 819_200
    assert ModelShape.from_config(s.to_dict()) == s


def test_mistral_7b_is_its_published_size_with_a_4096_token_window() -> None:
    s = ModelShape.from_config(config(MISTRAL_7B))
    assert s.total_params == 7_241_732_096 and abs(s.total_params / 7.24e9 - 1) < 0.001
    assert s.sliding_window == 4096 and s.gated_mlp and s.num_key_value_heads == 8
    assert 2 * s.kv_elements_per_token == 131_072  # bf16 bytes: every token is kept
    assert ModelShape.from_config(s.to_dict()) == s


def test_an_opt_layer_prices_its_own_operators() -> None:
    """Against the Llama layer of the same sizes: no rotary, an up projection of i columns
    (not 2i) read with its bias, an activation over i, and a position lookup and add."""
    hw = load_hardware_spec("a100-80gb")
    opt_cfg = config(OPT_13B)
    llama_like = {
        **opt_cfg,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "intermediate_size": 20480,
    }
    opt = AnalyticProfile.build(hw, opt_cfg, "float16")
    llama = AnalyticProfile.build(hw, llama_like, "float16")
    m = 256
    a, b = opt.estimate(prefill(m)).ops, llama.estimate(prefill(m)).ops
    assert a["attn_rope"] == 0 and b["attn_rope"] > 0
    k = opt.hardware.kernels
    dev = opt.device
    up = k.gemm.seconds(m, 20480, 5120, 2, dev.bandwidth, dev.peak, dev.sms, bias=True)
    assert a["mlp_up_proj"] == pytest.approx(40 * up)
    assert up > k.gemm.seconds(m, 20480, 5120, 2, dev.bandwidth, dev.peak, dev.sms)
    assert a["mlp_act"] == pytest.approx(
        40 * k.stream["activation"].seconds(2 * m * 20480 * 2, dev.bandwidth)
    )
    pos = k.stream["embedding"].seconds(2 * m * 5120 * 2, dev.bandwidth)
    assert a["pos_emb"] == pytest.approx(
        pos + k.stream["add"].seconds(3 * m * 5120 * 2, dev.bandwidth)
    )
    assert "pos_emb" not in b


@pytest.mark.parametrize(
    ("q", "ctx", "window"), [(1, 9, 4), (5, 9, 4), (9, 9, 4), (3, 4, 8), (7, 20, 6)]
)
def test_a_band_keeps_min_of_position_and_window_keys_a_query(
    q: int, ctx: int, window: int
) -> None:
    brute = sum(min(p + 1, window) for p in range(ctx - q, ctx))
    assert band_pairs(q, ctx, window) == brute


def test_the_sliding_window_bounds_what_attention_reads() -> None:
    """Mistral's 4,096-token window: a decode row reads at most the window's KV, a prompt past
    it is priced over a banded causal mask, one inside it as before; without the window the
    same steps cost more."""
    hw = load_hardware_spec("a100-80gb-pcie")
    windowed = AnalyticProfile.build(hw, config(MISTRAL_7B), "bfloat16")
    full = AnalyticProfile.build(hw, {**config(MISTRAL_7B), "sliding_window": None}, "bfloat16")
    assert windowed.attention_window == 4096 and full.attention_window is None

    class Row:  # what StepFeatures.of reads of a batch row
        def __init__(self, q: int, ctx: int) -> None:
            self.token_ids, self.ctx_len, self.start_pos = [0] * q, ctx, ctx - q
            self.samples, self.padding = True, False
            self.sampling = type("S", (), {"greedy": True})()

    batch = type("B", (), {"rows": [Row(1, 10_000), Row(1, 100)]})()
    f = StepFeatures.of(batch, windowed.attention_window)
    assert (f.decode_ctx, f.decode_max_ctx) == (4096 + 100, 4096)
    assert StepFeatures.of(batch).decode_ctx == 10_100
    att, dev = windowed.hardware.attention, windowed.device
    kv_token = 2 * 8 * 128 * 2  # a layer's K and V of one token, bf16

    def decode_s(tokens: int) -> float:
        return 32 * (att.fixed_s + tokens * kv_token / (dev.bandwidth * att.decode))

    assert windowed.attention_s(f)[1] == pytest.approx(decode_s(4096 + 100))
    assert full.attention_s(StepFeatures.of(batch))[1] == pytest.approx(decode_s(10_100))

    prompt = type("B", (), {"rows": [Row(8192, 8192)]})()
    p = StepFeatures.of(prompt, 4096)
    band = 4096 * 4097 // 2 + (8192 - 4096) * 4096  # pairs the band keeps
    assert p.prefill_attn == 8192 * 8192 * band // (8192 * 8193 // 2)
    short = type("B", (), {"rows": [Row(2048, 2048)]})()
    assert StepFeatures.of(short, 4096) == StepFeatures.of(short)  # inside the window: as before
    pre_w, _ = windowed.attention_s(p)
    pre_full, _ = full.attention_s(StepFeatures.of(prompt))
    assert pre_w / pre_full == pytest.approx(0.75, abs=0.01)


def test_a_config_that_mixes_windowed_and_full_layers_is_refused_in_one_line() -> None:
    mixed = {**config(MISTRAL_7B), "layer_types": ["sliding_attention", "full_attention"] * 16}
    with pytest.raises(ProfileError, match=r"model_config\.layer_types: some layers attend"):
        ModelShape.from_config(mixed)
    off = {**config(MISTRAL_7B), "use_sliding_window": False}  # Qwen2 writes it and turns it off
    assert ModelShape.from_config(off).sliding_window is None
    with pytest.raises(ProfileError, match="word_embed_proj_dim: 512 is not the hidden size"):
        ModelShape.from_config({**config(OPT_13B), "word_embed_proj_dim": 512})


# ---- end to end ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "dtype", "extra", "hardware", "tp", "interconnect"),
    [
        (OPT_13B, "float16", (), "a100-80gb", "1", None),
        (OPT_13B, "float16", ("executor.tensor_parallel=2",), "a100-40gb", "2", "dgx"),
        (
            MISTRAL_7B,
            "bfloat16",
            ("executor.tensor_parallel=2",),
            "a100-80gb-pcie",
            "2",
            "nvlink_pair",
        ),
    ],
)
def test_a_simulated_run_of_the_shapes_on_the_a100s(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: Path,
    dtype: str,
    extra: tuple[str, ...],
    hardware: str,
    tp: str,
    interconnect: str | None,
) -> None:
    """Eight requests through the engine, priced by the analytic profile of the shape on the
    GPU (its own interconnect unless named), said in metrics.json."""
    status, _, err = cli(
        capsys, "executor=simulated", "model=hf", f"model.path={model}", f"dtype={dtype}",
        f"executor.hardware={hardware}", *extra, "workload=straggler", "observers=[console]",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert status == 0, err[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["cost_model"], m["hardware"], m["tensor_parallel"]) == ("analytic", hardware, tp)
    assert m.get("interconnect") == interconnect
    assert m["requests_finished"] == 8 and m["makespan_s"] > 0


def test_tensor_parallel_4_on_a_pcie_a100_is_refused_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = cli(
        capsys, "executor=simulated", "model=hf", f"model.path={MISTRAL_7B}", "dtype=bfloat16",
        "executor.hardware=a100-80gb-pcie", "executor.tensor_parallel=4", "workload=straggler",
        "observers=[console]", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert_refused(
        status, err, "executor.tensor_parallel=4: a100-80gb-pcie over nvlink_pair accepts 1, 2"
    )
