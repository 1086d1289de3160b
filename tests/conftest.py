from __future__ import annotations

import os
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hydra.core.config_store import ConfigStore
from hypothesis import HealthCheck, settings

import framework.plugin_host.registry
from framework.api import ClusterView, RequestSpec, Router, RouterConfig, hookimpl
from framework.executors.model_loader import TinySpec, load_model
from framework.plugin_host.registry import Registry
from tests.helpers import Shared

# Property tests (tests/test_properties.py). `default`: few examples, derandomized (the same
# examples on every machine, so CI is reproducible) and no example database. `long`: for soak
# runs, many fresh random examples each time: `pytest --hypothesis-profile=long`. Each example
# runs the model, so no per-example deadline.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile("default")  # `--hypothesis-profile=NAME` loads another one after this


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs `-n auto`), the cores are shared out between the
    workers: each worker's torch, and the runs its tests start in subprocesses, get their
    share of threads. Spinning thread pools that each think they own every core collapse when
    they meet."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ["OMP_NUM_THREADS"] = str(share)


@pytest.fixture(scope="session")
def tiny() -> tuple[Any, Any]:
    """(model, tokenizer): a random 2-layer Llama with SmolLM2's tokenizer."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    return load_model("tiny", None, None, torch.float32, torch.device("cpu"), TinySpec())


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """For a module of tiny-model runs (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    its matrices are too small to split, so one thread is as fast, and it avoids the collapse
    of spinning thread pools when other jobs share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def glue_built() -> None:
    """nanoserve's C++ glue operators are built here, or the module is skipped where no C++
    compiler is (the engine then keeps the eager modules); a failed build with one fails."""
    import shutil

    from framework.executors.kernels import glue

    reason = glue.why_not(torch.device("cpu"), torch.float32)
    if reason is not None and shutil.which("c++") is None:
        pytest.skip(f"no C++ compiler here: {reason}")
    assert reason is None, reason


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    return load_model("smollm2", None, None, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Shared:
    """Results made once for all the session's xdist workers (`tests.helpers.Shared`)."""
    if worker_id == "master":
        return Shared(None)
    root = tmp_path_factory.getbasetemp().parent / "shared"  # the workers' common folder
    root.mkdir(exist_ok=True)
    return Shared(root)


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Runs of the suite, CLI subprocesses included, log to a temporary MLflow store."""
    mp = pytest.MonkeyPatch()
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    yield
    mp.undo()


# A third party's routers, as if installed (the cluster's and disaggregation's tests).
class AlwaysLast(Router):
    def route(self, view: ClusterView, request: RequestSpec) -> int:
        return len(view) - 1


class OffTheEnd(Router):
    def route(self, view: ClusterView, request: RequestSpec) -> int:
        return len(view)


@pytest.fixture
def router_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process registry plus a third party's routers, as if installed."""
    reg = Registry.from_entry_points()
    module = types.ModuleType("routers_ext")

    def register_routers(register: Any) -> None:
        register("always_last", AlwaysLast, RouterConfig)
        register("off_the_end", OffTheEnd, RouterConfig)

    module.register_routers = hookimpl(register_routers)  # type: ignore[attr-defined]
    reg.add_plugin(module, "routers_ext", "nanoserve-routers-ext")
    reg.store_configs(ConfigStore.instance())
    monkeypatch.setattr(framework.plugin_host.registry, "_REGISTRY", reg)
    yield
