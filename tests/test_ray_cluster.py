"""A sweep on a real Ray cluster: a local head node on 127.0.0.1 (2 CPUs), a two-job sweep
through `hydra/launcher=ray_cluster` against it, both jobs finished and nested under one
MLflow parent run (docs/scale-out.md says what this does and does not prove).

Needs the `ray` extra (`pip install -e '.[ray]'`, which `make test` installs); skipped
without it. The cluster is started in its own process group and that group is killed at the
end, so no `ray stop` (which would stop every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("hydra_plugins.hydra_ray_launcher")

from mlflow import MlflowClient

from framework.run.in_process import threads_kept
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120
SWEEP_TIMEOUT_S = 420
# Set by the suite (conftest) or a sweep: kept from the cluster's processes, so a job sees
# the store only if the launcher config's runtime_env passes it on.
NOT_INHERITED = ("MLFLOW_TRACKING_URI", "NANOSERVE_MLFLOW_PARENT", "RAY_ADDRESS")
# Ray turns 127.0.0.1 into the node's first non-loopback address, for other nodes to reach;
# this test only ever talks to loopback, so Ray is told to stay there (its switch for a
# single-machine "cluster": every address it picks is then 127.0.0.1).
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def free_ports(n: int) -> list[int]:
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def stop_group(pgid: int) -> None:
    """SIGTERM to every process of the cluster, SIGKILL to those left after 1 s: Ray's GCS
    server, raylet and autoscaler monitor outlive a SIGTERM by more than 10 s on a 2-core
    VM, so a longer wait only idles, and nothing of this throwaway cluster needs saving."""
    for sig, wait_s in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A Ray head node on 127.0.0.1 with 2 CPUs; yields its address (`127.0.0.1:PORT`)."""
    # A short folder: Ray's unix sockets live in it (at most 107 characters a path).
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    gcs, client, dashboard, agent = free_ports(4)
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(LOOPBACK_ONLY)
    cmd = [
        str(Path(sys.executable).with_name("ray")), "start", "--head",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2", "--num-gpus=0",
        "--include-dashboard=false", f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client}",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    log = Path(temp_dir) / "start.log"
    with log.open("w") as out:
        # A session of its own: the head's daemons stay in this process group after
        # `ray start` returns, and the teardown kills that group.
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        try:
            rc = proc.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ray start took over {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
        assert rc == 0, f"ray start failed ({rc}):\n{log.read_text()[-3000:]}"
        yield f"127.0.0.1:{gcs}"
    finally:
        stop_group(proc.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_sweep_on_a_ray_cluster_is_one_parent_with_a_child_per_job(
    ray_cluster: str, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = tmp_path / "multirun"
    before = set(os.listdir(ROOT))
    # The store reaches the jobs only through the config's runtime_env (see NOT_INHERITED).
    env = {**os.environ, **LOOPBACK_ONLY, "RAY_ADDRESS": ray_cluster, "MLFLOW_TRACKING_URI": uri}
    env.pop("NANOSERVE_MLFLOW_PARENT", None)
    proc = subprocess.run(
        [sys.executable, "run.py", "-m", "hydra/launcher=ray_cluster",
         "hydra.launcher.ray.remote.num_cpus=1", "model=tiny", "workload=straggler",
         "scheduler=static,continuous", "observers=[console,mlflow]", "mlflow.experiment=ray",
         f"hydra.sweep.dir={sweep}", "threads=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Connected to Ray cluster" in proc.stderr  # ray.init() joined it, started none
    assert f"Connecting to existing Ray cluster at address: {ray_cluster}" in proc.stderr

    # Both jobs ran to the end, each as a task of the Ray launcher (its job ids).
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    for job in jobs:
        summary = (job / "metrics.json").read_text()
        assert '"incomplete": false' in summary, summary[:500]
        hydra_yaml = (job / ".hydra" / "hydra.yaml").read_text()
        assert f"id: job_id_for_{job.name}" in hydra_yaml

    # One parent run, its two children FINISHED and named after what they varied.
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ray")
    assert exp is not None, f"no experiment 'ray' in {uri}"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    (parent,) = parents
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["nanoserve.sweep_dir"] == str(sweep.resolve())
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1 == 2
    assert sorted(c.info.run_name for c in children) == ["scheduler=continuous", "scheduler=static"]
    assert all(c.info.status == "FINISHED" for c in children)
    assert all(c.data.tags["nanoserve.kind"] == "job" for c in children)
    assert set(os.listdir(ROOT)) - before == set()  # no mlflow.db or mlruns/ in the repo


def run_py(args: list[str], env: dict[str, str]) -> None:
    """`python run.py ARGS` in a process of its own, as a user runs it; it must finish."""
    proc = subprocess.run(
        [sys.executable, "run.py", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def run_alone(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    """The one-engine reference run, `run.py ARGS` in this process (`cli`): the same code a
    subprocess would run, without a second Python importing torch; this process's thread
    count given back after (`threads=1` sets it)."""
    with threads_kept():
        status, out, err = cli(capsys, *args)
    assert status == 0, out[-3000:] + err[-3000:]


def outputs(folder: Path) -> dict[str, list[int]]:
    """A run folder's output tokens, by request id."""
    lines = (folder / "outputs.jsonl").read_text().splitlines()
    return {d["id"]: d["output_token_ids"] for d in map(json.loads, lines)}


def test_real_replicas_on_ray_serve_what_one_engine_serves(
    ray_cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cluster.backend=ray`: two tiny-model replicas as Ray actors on the local cluster, the
    router in the driver. The same greedy tokens as one engine, every request served once,
    the replicas' counts adding up, and the run folder and MLflow run shaped as a simulated
    cluster's (docs/cluster.md)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, **LOOPBACK_ONLY, "MLFLOW_TRACKING_URI": uri}
    for key in ("NANOSERVE_MLFLOW_PARENT", "RAY_ADDRESS"):
        env.pop(key, None)
    common = ["model=tiny", "workload=straggler", "threads=1", "print_outputs=false"]
    cluster, alone = tmp_path / "cluster", tmp_path / "alone"
    run_py(
        [*common, "cluster.replicas=2", "cluster.backend=ray", f"cluster.ray_address={ray_cluster}",
         "router=least_tokens", "observers=[console,mlflow]", "mlflow.experiment=ray_replicas",
         "mlflow.background=false", f"hydra.run.dir={cluster}"],
        env,
    )  # fmt: skip
    run_alone(capsys, [*common, "observers=[]", f"hydra.run.dir={alone}"])

    assert outputs(cluster) == outputs(alone) and len(outputs(alone)) == 8
    metrics = json.loads((cluster / "metrics.json").read_text())
    assert metrics["cluster_replicas"] == 2 and metrics["incomplete"] is False
    for key in ("requests", "requests_finished", "steps", "tokens_kept", "prefill_tokens"):
        assert sum(r[key] for r in metrics["replicas"]) == metrics[key], key
    assert all(r["requests"] > 0 for r in metrics["replicas"])  # least_tokens spreads them
    requests = (cluster / "requests.csv").read_text().splitlines()
    assert requests[0].endswith(",replica,replicas")
    assert {r.split(",")[-2] for r in requests[1:]} == {"0", "1"}
    assert (cluster / "steps.csv").read_text().splitlines()[0].endswith(",replica")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ray_replicas")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["replica.0.requests"] + run.data.metrics["replica.1.requests"] == 8


def test_killing_one_of_two_ray_replicas_mid_run_loses_no_request(
    ray_cluster: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replica 1's actor is killed half a second into the replay (`cluster.faults`: a real
    `ray.kill`, found by the driver as any death is): every request is served once, with
    one engine's greedy tokens, and the run folder says what was lost and re-routed."""
    env = {**os.environ, **LOOPBACK_ONLY}
    for key in ("NANOSERVE_MLFLOW_PARENT", "RAY_ADDRESS"):
        env.pop(key, None)
    common = [
        "model=tiny", "workload=synthetic", "workload.num_requests=40", "workload.rate=40",
        "workload.prompt_len_max=64", "workload.output_len_max=32", "threads=1",
        "print_outputs=false", "observers=[]",
    ]  # fmt: skip
    cluster, alone = tmp_path / "cluster", tmp_path / "alone"
    run_py(
        [*common, "cluster.replicas=2", "cluster.backend=ray", f"cluster.ray_address={ray_cluster}",
         "router=round_robin", "cluster.faults=[{replica: 1, down_at_s: 0.5}]",
         f"hydra.run.dir={cluster}"],
        env,
    )  # fmt: skip
    run_alone(capsys, [*common, f"hydra.run.dir={alone}"])

    assert outputs(cluster) == outputs(alone) and len(outputs(alone)) == 40
    metrics = json.loads((cluster / "metrics.json").read_text())
    assert metrics["incomplete"] is False and metrics["requests_finished"] == 40
    assert metrics["replica_failures"] == 1
    (outage,) = metrics["replica_outages"]
    assert outage["replica"] == 1 and outage["down_s"] >= 0.5
    assert metrics["requests_rerouted"] == outage["requests_lost"]
    ids = [line.split(",")[0] for line in (cluster / "requests.csv").read_text().splitlines()[1:]]
    assert sorted(ids) == sorted(outputs(alone))  # each once
