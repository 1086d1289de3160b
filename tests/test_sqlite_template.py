"""A new SQLite tracking store begins as a copy of a migrated one
(`framework/tracking/sqlite_template.py`): MLflow opens it without building its tables, it
holds runs as any store does, its `Default` experiment points where MLflow would point it, and
no existing store is ever replaced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow.store.db.utils
import pytest
from mlflow import MlflowClient

from framework.tracking.sqlite_template import seed, store_file
from framework.tracking.store import TrackingStore


def test_a_seeded_store_opens_without_migrations_and_holds_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(f"sqlite:///{tmp_path / 'warm.db'}")  # the template exists from here on
    monkeypatch.chdir(tmp_path)

    def built(_engine: object) -> None:
        raise AssertionError("MLflow built the tables of a seeded store")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", built)
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    assert seed(uri)
    client = MlflowClient(tracking_uri=uri)
    default = client.get_experiment("0")
    assert default.name == "Default"
    assert Path(default.artifact_location) == tmp_path / "mlruns" / "0"
    run = client.create_run(client.create_experiment("x")).info.run_id
    client.log_metric(run, "tokens", 3.0)
    assert client.get_run(run).data.metrics == {"tokens": 3.0}
    assert not seed(uri)  # there now: left as it is
    assert client.get_run(run).data.metrics == {"tokens": 3.0}


def test_an_existing_file_and_other_uris_are_left_alone(tmp_path: Path) -> None:
    kept = tmp_path / "kept.db"
    kept.write_bytes(b"not yours")
    assert not seed(f"sqlite:///{kept}")
    assert kept.read_bytes() == b"not yours"
    for uri in ("sqlite:///:memory:", "http://127.0.0.1:5000", "file:///tmp/mlruns"):
        assert store_file(uri) is None and not seed(uri)
    assert store_file("sqlite:///runs/m.db?timeout=5") == Path("runs/m.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.db"]  # nothing staged left


def test_a_cache_that_cannot_be_written_leaves_the_store_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("NANOSERVE_CACHE", str(blocked / "cache"))  # under a file: no folder
    uri = f"sqlite:///{tmp_path / 'own.db'}"
    store = TrackingStore(SimpleNamespace(tracking_uri=uri, experiment="e", fatal=True))
    assert store.experiment_id() and store.broken is None
    assert (tmp_path / "own.db").exists() and not (blocked / "cache").exists()
