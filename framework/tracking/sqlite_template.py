"""A new SQLite tracking store starts as a copy of one MLflow has already built.

MLflow builds a SQLite store's schema by running each of its Alembic migrations in turn: about
3 s of CPU on the project's 2-core VMs (10-13 s under load), paid by the first run of every new
store: a sweep in a fresh folder, a test with a store of its own, a clean clone's first
`make run`. For one MLflow version the result is always the same empty schema, so the first
store built is kept as a template (under the nanoserve cache, named by MLflow's version,
built under a file lock) and each later new store begins as a copy of it. MLflow then finds
its schema current and migrates nothing. The one row that depends on where the store was made,
the `Default` experiment's artifact location (MLflow's `./mlruns` resolved in the working
folder), is written as MLflow would have written it there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from pathlib import Path

from filelock import FileLock

from framework.core.cache_dir import cache_root

PREFIX = "sqlite:///"


def store_file(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI, or None (a server, memory, another scheme)."""
    if not uri.startswith(PREFIX):
        return None
    path = uri[len(PREFIX) :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def seed(uri: str) -> bool:
    """Before MLflow first opens `uri`: where it names a SQLite file that does not exist yet,
    create it as a copy of the template. True if it did. Never replaces a file: two processes
    starting the same new store (a sweep's parallel jobs) get one copy between them, through
    an exclusive link, and the second finds the first's."""
    path = store_file(uri)
    if path is None or path.exists():
        return False
    import mlflow

    template = template_for(mlflow.__version__)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.seed")
    shutil.copyfile(template, staged)
    try:
        set_default_artifacts(staged)
        os.link(staged, path)  # fails if the store appeared meanwhile: it is kept as it is
    except FileExistsError:
        return False
    finally:
        staged.unlink(missing_ok=True)
    return True


def template_for(version: str) -> Path:
    """The migrated, empty store of this MLflow version, built once per cache."""
    template = cache_root() / f"mlflow-{version}-empty.db"
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(template.with_name(f".{template.name}.lock")):
        if not template.exists():
            staged = template.with_name(f".{template.name}.{os.getpid()}.build")
            staged.unlink(missing_ok=True)
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            store = SqlAlchemyStore(f"{PREFIX}{staged}", str(staged.parent / "mlruns"))
            with contextlib.suppress(Exception):
                store.engine.dispose()  # its connections closed before the file moves
            os.replace(staged, template)
    return template


def set_default_artifacts(path: Path) -> None:
    """The `Default` experiment (id 0) as MLflow creates it for a store opened here: its
    artifacts under `./mlruns/0` of the working folder, created now."""
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    location = append_to_uri_path(resolve_uri_if_local("./mlruns"), "0")
    now = int(time.time() * 1000)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ?, creation_time = ?,"
            " last_update_time = ? WHERE experiment_id = 0",
            (location, now, now),
        )
