"""The per-operator GPU cost model: each kernel family against a hand-computed case, tensor
parallelism's split, the all-reduce fit, the fitted specs against the published tables they
were fitted on (a test on data, not on this machine's seconds), and `experiments.gpu_check`
on good and malformed files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.gpu import gpu_check
from framework.calibration import gpu_fit
from framework.calibration.analytic_profile import prefill_step
from framework.calibration.gpu_tables import read_operator_table
from framework.executors.simulated.analytic import MODELS_DIR, AnalyticProfile
from framework.executors.simulated.gpu.hardware import HardwareSpec, load_hardware_spec
from framework.executors.simulated.gpu.kernels import AllReduceFit, GemmFit, StreamFit
from framework.executors.simulated.gpu.shard import Device, Shard

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "gpu"
TABLES = {
    "h100-sxm": SHARED / "h100" / "Llama-2-7b-hf.mlp.csv",
    "a100-80gb": SHARED / "a100" / "Meta-Llama-3-8B.mlp.csv",
}
COLLECTIVES = {
    "dgx": SHARED / "network" / "h100_dgx.all_reduce.csv",
    "nvlink_pair": SHARED / "network" / "h100_pairwise_nvlink.all_reduce.csv",
}
needs_tables = pytest.mark.skipif(
    not SHARED.is_dir(), reason="the published GPU tables (shared/data/gpu) are not beside the repo"
)


def test_gemm_small_is_a_weight_stream_and_large_is_tiles_in_waves() -> None:
    whole = GemmFit(
        fixed_s=5e-6,
        bandwidth=0.8,
        compute=0.5,
        k_overhead=32,
        smoothness=20,
        tile_m=64,
        wave_quantisation=1.0,
    )
    frac = GemmFit(**{**whole.to_dict(), "wave_quantisation": 0.0})
    bw, peak, sms = 2e12, 1e15, 100
    tile = 2 * 64 * 256 * (4096 + 32) / (peak * 0.5 / sms)  # one tile on one SM
    # 1 token through a 4096 x 4096 bf16 weight: 16 tiles are 0.16 of a wave, far below
    # the weight stream, which the p-norm (p = 20) all but takes alone
    weights = 2 * (4096 + 4096 * 4096 + 4096) / (bw * 0.8)
    assert 0.16 * tile < weights / 4
    assert frac.seconds(1, 4096, 4096, 2, bw, peak, sms) == pytest.approx(
        5e-6 + (weights**20 + (0.16 * tile) ** 20) ** (1 / 20)
    )
    # a partial wave priced whole: the tile's time even for one token
    assert whole.seconds(1, 4096, 4096, 2, bw, peak, sms) == pytest.approx(
        5e-6 + (weights**20 + tile**20) ** (1 / 20)
    )
    # 4096 tokens: 64 x 16 = 1024 tiles of 64 x 256 over 100 SMs: 11 whole waves, or 10.24
    big = 2 * (2 * 4096 * 4096 + 4096 * 4096) / (bw * 0.8)
    for fit, waves in ((whole, 11), (frac, 10.24)):
        assert fit.seconds(4096, 4096, 4096, 2, bw, peak, sms) == pytest.approx(
            5e-6 + (big**20 + (waves * tile) ** 20) ** (1 / 20)
        )
    assert whole.seconds(0, 4096, 4096, 2, bw, peak, sms) == 0.0


def test_stream_is_fixed_cost_plus_bytes() -> None:
    s = StreamFit(fixed_s=2e-6, bandwidth=0.25)
    assert s.seconds(1e6, 1e12) == pytest.approx(2e-6 + 1e6 / 2.5e11)
    assert s.seconds(0, 1e12) == 0.0


def test_all_reduce_is_alpha_beta_over_the_ring_and_grows_with_size() -> None:
    fit = AllReduceFit({2: 10e-6, 8: 20e-6}, {2: 100e9, 8: 200e9})
    assert fit.seconds(1e8, 2) == pytest.approx(10e-6 + 1.0 * 1e8 / 100e9)
    assert fit.seconds(1e8, 8) == pytest.approx(20e-6 + 1.75 * 1e8 / 200e9)
    assert fit.seconds(1e8, 1) == 0.0
    with pytest.raises(ValueError, match="for 2, 8 workers only"):
        fit.seconds(1e8, 4)
    spec = HardwareSpec.from_dict(load_hardware_spec("h100-sxm"))
    for link in spec.interconnects.values():
        for n in link.workers:
            sizes = [2**k for k in range(10, 31)]
            times = [link.seconds(b, n) for b in sizes]
            assert times == sorted(times) and times[0] > 0


def test_tensor_parallel_splits_weights_kv_and_adds_two_all_reduces_a_layer() -> None:
    config = json.loads((MODELS_DIR / "llama-8b" / "config.json").read_text())
    spec = load_hardware_spec("h100-sxm")
    one = AnalyticProfile.build(spec, config, "bfloat16")
    four = AnalyticProfile.build(spec, config, "bfloat16", tensor_parallel=4)
    s1, s4 = one.shard, four.shard
    assert (s4.heads_shard, s4.kv_heads_shard, s4.mlp_shard) == (8, 2, 14336 // 4)
    assert s4.qkv_out * 4 == s1.qkv_out and s4.up_out * 4 == s1.up_out
    assert s4.kv_bytes_per_token_layer(2) * 4 == s1.kv_bytes_per_token_layer(2)
    # eight KV heads on 16 GPUs would replicate; here 8 GPUs hold one each
    assert Shard(4096, 14336, 32, 8, 128, 128256, tp=8).kv_heads_shard == 1
    assert Shard(4096, 14336, 32, 4, 128, 128256, tp=8).kv_heads_shard == 1
    # the all-reduces: 2 a layer of tokens x hidden x bf16, by the fit
    m = 256
    step = prefill_step(m)  # one fresh prompt of m tokens, its first token sampled
    link = four.hardware.interconnects["dgx"]
    e = four.estimate(step)
    gather = link.seconds(1 * 128256 * 2 / 2, 4)  # the sampled row's logits
    assert e.ops["all_reduce"] == pytest.approx(32 * 2 * link.seconds(m * 4096 * 2, 4) + gather)
    assert one.estimate(step).ops["all_reduce"] == 0
    # each GPU's share of the projections is cheaper, the step not 4x cheaper
    assert e.ops["mlp_up_proj"] < one.estimate(step).ops["mlp_up_proj"]
    assert four.meta["tensor_parallel"] == 4 and four.meta["interconnect"] == "dgx"
    with pytest.raises(ValueError, match="must divide the model's 32 attention heads"):
        Shard(4096, 14336, 32, 8, 128, 128256, tp=3)


@needs_tables
@pytest.mark.parametrize("hardware", sorted(TABLES))
def test_the_fitted_specs_meet_the_targets_on_the_published_tables(hardware: str) -> None:
    """Layer MAPE <= 8% and p90 <= 15% at every TP degree, on the table each was fitted on."""
    spec = HardwareSpec.from_dict(load_hardware_spec(hardware))
    report = gpu_check.check_operators(TABLES[hardware], spec)
    assert report["layer"]["rows"] == len(read_operator_table(TABLES[hardware]).tokens)
    assert set(report["by_tp"]) == {"1", "2", "4", "8"}
    for tp, stats in report["by_tp"].items():
        assert stats["mape"] <= 0.08, (tp, stats)
        assert stats["p90"] <= 0.15, (tp, stats)


@needs_tables
@pytest.mark.parametrize("interconnect", sorted(COLLECTIVES))
def test_the_all_reduce_fit_meets_the_target_from_one_megabyte(interconnect: str) -> None:
    spec = HardwareSpec.from_dict(load_hardware_spec("h100-sxm"))
    report = gpu_check.check_collective(COLLECTIVES[interconnect], spec, interconnect)
    assert report["collective"]["mape"] <= 0.15, report["collective"]


@needs_tables
def test_a_refit_reproduces_the_shipped_gemm_fit() -> None:
    """The shipped H100 GEMM parameters are what `experiments.gpu_fit` finds in its table."""
    table = read_operator_table(TABLES["h100-sxm"])
    spec = load_hardware_spec("h100-sxm")
    fit = gpu_fit.fit_gemm(table, gpu_fit.device_of(spec))
    for key, value in fit.to_dict().items():
        assert math.isclose(value, spec["kernels"]["gemm"][key], rel_tol=0.02, abs_tol=1e-7), key


@needs_tables
def test_gpu_check_prints_json_with_fractions(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([str(TABLES["a100-80gb"]), "--hardware", "a100-80gb", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"layer", "by_tp", "by_op", "by_tokens"}
    assert 0 < out["layer"]["mape"] < 1 and "mlp_up_proj" in out["by_op"]
    assert set(out["by_tokens"]) == {"1-32", "33-512", "513-4096", "4097+"}
    args = [str(COLLECTIVES["dgx"]), "--hardware", "h100-sxm", "--interconnect", "dgx", "--json"]
    assert gpu_check.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["by_workers"]) == {"2", "4", "8"} and out["collective"]["mape"] < 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a,b\n1,2\n", "not an operator table (missing columns"),
        ("", "no rows"),
        (
            "time_stats.mlp_up_proj.median,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,"
            "use_gated_mlp,num_tokens,num_tensor_parallel_workers\nfast,32,8,4096,14336,1000,"
            "True,1,1\n",
            "column time_stats.mlp_up_proj.median is 'fast', not a number",
        ),
        (
            "time_stats.mlp_up_proj.median,n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,"
            "use_gated_mlp,num_tokens,num_tensor_parallel_workers\n0.1,32,8,4096,14336,1000,"
            "True,1,3\n",
            "must divide the model's 32 attention heads",
        ),
        (
            ",time_stats.all_reduce.median,num_workers,size,collective\n0,0.1,2,10,gather\n",
            "collective must be all_reduce",
        ),
    ],
)
def test_gpu_check_refuses_a_malformed_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    assert gpu_check.main([str(bad), "--hardware", "h100-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and len(err.splitlines()) == 1


def test_device_of_a_spec() -> None:
    spec = HardwareSpec.from_dict(load_hardware_spec("a100-80gb"))
    assert spec.device("bfloat16") == Device(2.039e12, 312e12, 108, 2)


MEASURED_H200 = Path(__file__).resolve().parents[1] / "experiments" / "gpu" / "measured" / "h200"
H200_FITTED_ON = MEASURED_H200 / "h200_Llama-2-7b-hf.mlp.csv"


@pytest.mark.parametrize(
    "name",
    [
        "Llama-2-7b-hf",
        "Meta-Llama-3-8B",
        "internlm-20b",
        "CodeLlama-34b-Instruct-hf",
        "Llama-2-70b-hf",
        "Qwen-72B",
    ],
)
def test_the_h200_spec_meets_the_targets_on_the_tables_measured_on_an_h200(name: str) -> None:
    """Fitted on the 7B table alone, judged on five shapes it never saw (7B to 72B, GQA and
    not): layer MAPE <= 8% and p90 <= 15% at every TP degree. A test on data measured once on
    a real H200 (`experiments.op_table`), not on this machine's seconds."""
    spec = HardwareSpec.from_dict(load_hardware_spec("h200"))
    report = gpu_check.check_operators(MEASURED_H200 / f"h200_{name}.mlp.csv", spec)
    assert set(report["by_tp"]) == {"1", "2", "4", "8"}
    for tp, stats in report["by_tp"].items():
        assert stats["mape"] <= 0.08, (tp, stats)
        assert stats["p90"] <= 0.15, (tp, stats)


def test_the_h200_spec_on_phi2_misses_the_mape_target_at_tp8_only() -> None:
    """The one measured shape outside the targets: Phi-2 (2.7B, no gated MLP) at TP 8, whose
    GEMMs are the smallest measured (MAPE 8.4% there, p90 within 15%). Pinned so that a
    change that moves it is seen."""
    spec = HardwareSpec.from_dict(load_hardware_spec("h200"))
    report = gpu_check.check_operators(MEASURED_H200 / "h200_phi-2.mlp.csv", spec)
    for tp, stats in report["by_tp"].items():
        assert stats["p90"] <= 0.15, (tp, stats)
        assert stats["mape"] <= (0.09 if tp == "8" else 0.08), (tp, stats)
    assert report["by_tp"]["8"]["mape"] > 0.08


def test_a_refit_reproduces_the_shipped_h200_fit() -> None:
    """The H200's GEMM and its norm, add and embedding fits are what `experiments.gpu_fit`
    finds in the measured table; rotary and activation, which that table lacks, are kept."""
    table = read_operator_table(H200_FITTED_ON)
    spec = load_hardware_spec("h200")
    dev = gpu_fit.device_of(spec)
    for key, value in gpu_fit.fit_gemm(table, dev).to_dict().items():
        assert math.isclose(value, spec["kernels"]["gemm"][key], rel_tol=0.02, abs_tol=1e-7), key
    stream = gpu_fit.fit_stream(table, dev)
    assert sorted(stream) == ["add", "embedding", "norm"]
    merged, kept = gpu_fit.merged_stream(stream, spec, H200_FITTED_ON)
    assert kept == ["rotary", "activation"]
    assert merged["rotary"] == spec["kernels"]["stream"]["rotary"]
    for family, fit in stream.items():
        for key, value in fit.to_dict().items():
            shipped = spec["kernels"]["stream"][family][key]
            assert math.isclose(value, shipped, rel_tol=0.02, abs_tol=1e-8), (family, key)
    with pytest.raises(gpu_fit.TableError, match="no operator for the rotary, activation"):
        gpu_fit.merged_stream(stream, {"kernels": {}}, H200_FITTED_ON)


def test_op_table_writes_a_table_gpu_check_reads(tmp_path: Path) -> None:
    """`experiments.op_table` on the CPU (its dry run): the published format, one row per token
    count and TP degree, read back by the check with the shape it was measured at."""
    from experiments.device import op_table

    args = ["--out", str(tmp_path), "--device", "cpu", "--quick", "--models", "phi-2"]
    assert op_table.main([*args, "--replays", "1", "--dtype", "float32"]) == 0
    table = read_operator_table(tmp_path / "cpu_phi-2.mlp.csv")
    assert sorted(set(table.tokens.tolist())) == list(op_table.QUICK_TOKENS)
    assert set(table.tp.tolist()) == {1, 2}
    assert table.operators == op_table.OPS
    assert table.shard(0).hidden == 2560 and not table.shard(0).gated
    spec = HardwareSpec.from_dict(load_hardware_spec("h200"))
    assert gpu_check.check_operators(tmp_path / "cpu_phi-2.mlp.csv", spec)["layer"]["rows"] == 8
    attention = (tmp_path / "cpu_attention.csv").read_text().splitlines()
    assert attention[0].startswith("kind,batch,q_tokens,context") and len(attention) == 5
