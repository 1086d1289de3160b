"""User errors against bugs: the first gets one line and exit status 2, the second keeps its
traceback and exits 1.

Everything a run does before its first step reads only what the user gave it: the config,
the files it names, the model folder, the device, each plugin's options (a policy checks
its ranges in `__init__` and raises `ValueError` naming `group.field`, as the plugin guide
says). A `ValueError` or `OSError` raised there is the user's to fix, so `user_input()`
turns it into a `UserError` carrying the message. Once the engine has started, any
exception is a bug (or Ctrl-C) and keeps its traceback: the results so far are written first.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class UserError(ValueError):
    """A mistake in the user's input, with a message that names the field and what it
    accepts. The command line prints `error: <message>` and exits 2; nothing was started."""


class RunStopped(RuntimeError):
    """A run its environment stopped, not a bug and not the user's input (every replica of
    a Ray cluster lost): the run wrote what finished, marked incomplete; the command line
    prints `error: <message>` and exits 1, with no traceback."""


def one_line(message: str) -> str:
    """Lines joined into one, so that the terminal shows a single `error:` line."""
    parts = [line.strip() for line in message.splitlines()]
    return "; ".join(p for p in parts if p)


@contextmanager
def user_input() -> Iterator[None]:
    """Turn the `ValueError` / `OSError` of a step that only reads user input into a
    `UserError` (the original stays chained as its cause, for `HYDRA_FULL_ERROR=1`)."""
    try:
        yield
    except UserError:
        raise
    except (ValueError, OSError) as exc:
        text = str(exc) if not isinstance(exc, OSError) or exc.filename is None else _os(exc)
        raise UserError(one_line(text) or type(exc).__name__) from exc


def _os(exc: OSError) -> str:
    """`[Errno 2] No such file or directory: 'x'` reads better as `x: no such file ...`."""
    reason = (exc.strerror or str(exc)).lower()
    return f"{exc.filename}: {reason}"


class Refused(BaseException):
    """A `UserError` on its way out of a Hydra job. Hydra's job runner catches `Exception`
    and reports it with a traceback; this passes through it to the command line, which
    prints the message as one line and exits 2."""
