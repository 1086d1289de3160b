"""The command line: `python run.py [-m] OVERRIDES...`, with exit statuses users can rely on.

- 0: the run (or every job of a sweep) finished.
- 2: a user error, printed as one line, `error: <message>`, on stderr, with no traceback:
  a bad value, an unknown key, policy or choice, a missing or malformed file, a model folder
  that is not a causal LM, a pool or budget too small, a device that is not there, a
  plugin's own option check. In a sweep the line names the job and its overrides; the jobs
  that finished before it keep their results. Nothing of the refused run was written.
- 1: a bug (any other exception, `PolicyError`, `InvariantError`), with its traceback, after
  the run wrote its partial results; or a run its environment stopped (`RunStopped`: every
  replica of a Ray cluster lost), as one line, after the same.

`HYDRA_FULL_ERROR=1` shows the whole traceback of a user error too, for debugging.

Hydra normally prints a job's exception itself and exits 1. Here Hydra is asked to let
exceptions through (its `HYDRA_FULL_ERROR` switch, for the call only), so that they are
sorted at this one place; a user error inside a job travels out of Hydra's job runner as
`Refused`, which that runner does not catch, so no "Error executing job" report precedes it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from framework.plugin_host.registry import registry
from framework.run.errors import Refused, RunStopped, UserError, one_line
from framework.run.help import print_help, wants_help
from framework.run.preflight import check_command_line
from framework.tracking.sweep_exit import finish_early

CONF = Path(__file__).resolve().parents[2] / "conf"
FULL_ERROR = "HYDRA_FULL_ERROR"


def main(argv: Sequence[str] | None = None, job: Callable[..., Any] | None = None) -> int:
    """Run the command line `argv` (default: `sys.argv[1:]`) and return the exit status.
    `job` runs the composed config (default: a batch run, `framework.run.app.run_batch`;
    `serve.py` passes the HTTP server's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    reg = registry()
    for error in reg.load_errors:
        print(error, file=sys.stderr)
    if wants_help(args):
        print_help(reg)
        return 0
    debugging = bool(os.environ.get(FULL_ERROR))
    try:
        run_command(args, job)
    except (UserError, Refused) as error:
        if debugging:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RunStopped as error:
        if debugging:
            raise
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return 1
    except Exception as error:
        message = hydra_user_error(error)
        if message is None or debugging:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


def run_command(args: list[str], job: Callable[..., Any] | None = None) -> None:
    """The command line `args` checked and run through Hydra, raising whatever stops it: a
    user's mistake (`UserError`, `Refused` from inside a job, or an error of Hydra's that
    `hydra_user_error` reads as one) or a bug. `main` sorts them into exit statuses; a
    caller in Python (`framework.studies.notebook`) gets them as exceptions."""
    check_flags(args)
    check_command_line(args, registry())
    try:
        run_hydra(args, job)
    finally:  # a sweep that stopped early: its table and parent run, before the error
        finish_early()


def check_flags(args: list[str]) -> None:
    """Hydra's own flags, read by Hydra's parser; what it cannot read is one line, not a
    usage screen (`python run.py model=tiny -m ...`: a flag after an override)."""
    from hydra._internal.utils import get_args_parser  # Hydra's CLI parser; no public one

    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        hint = " (flags such as -m go before the overrides)" * message.startswith("unrecognized")
        raise UserError(f"{message}{hint}; python run.py --help lists what is accepted")

    parser.error = refuse  # type: ignore[method-assign]
    parser.parse_args(args)


def run_hydra(args: list[str], runner: Callable[..., Any] | None = None) -> None:
    """Compose the config from `conf/` and `args` and run the job (or sweep) through Hydra."""
    # Imported only now: these pull in torch and transformers (seconds).
    import hydra
    from omegaconf import DictConfig

    from framework.run.config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
    def job(cfg: DictConfig) -> None:
        run_job(cfg, runner)

    with hydra_lets_exceptions_through(), command_line(args):
        job()


def run_job(cfg: Any, runner: Callable[..., Any] | None = None) -> None:
    """One job: its observers attached, served into Hydra's output folder."""
    from hydra.core.hydra_config import HydraConfig

    from framework.run.observers import run_with_observers

    hc = HydraConfig.get()
    try:
        run_with_observers(cfg, hc.runtime.output_dir, runner=runner)
    except UserError as error:
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            raise Refused(f"job {hc.job.num} ({' '.join(hc.overrides.task)}): {error}") from error
        raise Refused(str(error)) from error
    except Exception as error:
        # Raised by the job's own code: a bug, whatever its type (an OmegaConf error here is
        # a key the code got wrong, not one the user typed).
        error.nanoserve_in_job = True  # type: ignore[attr-defined]
        raise


@contextmanager
def hydra_lets_exceptions_through() -> Any:
    before = os.environ.get(FULL_ERROR)
    os.environ[FULL_ERROR] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FULL_ERROR, None)
        else:
            os.environ[FULL_ERROR] = before


@contextmanager
def command_line(args: list[str]) -> Any:
    """`hydra.main` reads `sys.argv`; a caller passing `argv` (a test) gets the same."""
    before = sys.argv
    sys.argv = [before[0] if before else "run.py", *args]
    try:
        yield
    finally:
        sys.argv = before


def hydra_user_error(error: BaseException) -> str | None:
    """One line for what Hydra or OmegaConf refused while composing the config, else None.

    These are the user's: an unknown choice (`model=foo`), an unknown key without `+`
    (`engine.foo=1`), a value of the wrong type (`engine.block_size=abc`), an override that
    does not parse. Hydra failing to instantiate its own callbacks is not: that is a bug.
    """
    from hydra.errors import (
        CompactHydraException,
        InstantiationException,
        MissingConfigException,
    )
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(error, InstantiationException) or getattr(error, "nanoserve_in_job", False):
        return None
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and error.options:
        group, _, name = error.missing_cfg_file.rpartition("/")
        choices = [o for o in error.options if not o.endswith("_schema")]
        return f"{group}={name}: no such choice; {group} accepts {', '.join(choices)}"
    cause = error.__cause__ if isinstance(error.__cause__, OmegaConfBaseException) else None
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and getattr(
        cause, "full_key", None
    ):
        return unknown_key(cause)
    if isinstance(error, CompactHydraException | OmegaConfBaseException):
        text = "\n".join(str(e) for e in (error, cause) if e is not None)
        kept = [
            line
            for line in text.splitlines()
            if not line.strip().startswith(("full_key:", "reference_type=", "object_type="))
        ]
        message = one_line("\n".join(kept))
        merging = "Error merging override "
        if message.startswith(merging):  # `engine.block_size=abc: Value 'abc' of type ...`
            message = message[len(merging) :].replace("; ", ": ", 1)
        return message
    return None


def unknown_key(cause: Any) -> str:
    """`engine.foo=1`: name the key and list the settings that do exist there."""
    key = str(cause.full_key)
    parent = key.rpartition(".")[0]
    where = f"the {parent} group" if parent else "the top level"
    schema = getattr(cause, "object_type", None)
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        names = ", ".join(f.name for f in dataclasses.fields(schema))
        return f"{key} is not a setting of {where}; its settings are: {names}"
    return f"{key} is not a setting of {where}"
