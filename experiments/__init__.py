"""Nanoserve's tools run by hand, each a command: `python -m experiments.<tool>`.

The commands are one table, `TOOLS`: each name and the module whose `main()` it runs. The
code of the maintainers' tools lives in the package of its job: `bench` (the engine's speed
and behaviour, the server's soak), `sim` (the simulated executor checked and scaled), `gpu`
(the analytic GPU model checked), `device` (a GPU machine), `policy` (the serving policies
studied in one process), all on `toolkit` (what they share). The tools whose code writes
shipped files or that users rely on run code under `framework/` (`framework.calibration`,
`framework.studies`). See README.md.

`python -m experiments.<tool>` finds the name in the table (a finder on `sys.meta_path`,
installed when this package is imported, as `-m` does first): the command runs the module's
`main()`, and an int it returns is the exit status. Importing `experiments.<tool>` runs
nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence

TOOLS: dict[str, str] = {
    "ab": "experiments.bench.ab",
    "analytic_profile": "framework.calibration.analytic_profile",
    "benchmark": "experiments.bench.benchmark",
    "calibrate": "framework.calibration.calibrate",
    "cluster_scale": "experiments.sim.cluster_scale",
    "cuda_check": "experiments.device.cuda_check",
    "device_kit": "experiments.device.device_kit",
    "goodput": "framework.studies.goodput",
    "goodput_study": "framework.studies.goodput_study",
    "gpu_check": "experiments.gpu.gpu_check",
    "gpu_fit": "framework.calibration.gpu_fit",
    "graph_check": "experiments.device.graph_check",
    "kernel_ab": "experiments.bench.kernel_ab",
    "op_table": "experiments.device.op_table",
    "reproduce": "framework.studies.reproductions.command",
    "same_behaviour": "experiments.bench.same_behaviour",
    "same_speed": "experiments.bench.same_speed",
    "serve_bench": "experiments.bench.serve_bench",
    "server_soak": "experiments.bench.server_soak",
    "sim_check": "experiments.sim.sim_check",
    "sim_scale": "experiments.sim.sim_scale",
    "soak": "experiments.policy.soak",
    "studies": "framework.studies.study_report",
    "window_sweep": "experiments.policy.window_sweep",
}


class _Command(importlib.abc.InspectLoader):
    """A command's module: under `-m` (as `__main__`) it runs its tool's `main()`."""

    def __init__(self, target: str) -> None:
        self.target = target

    def is_package(self, fullname: str) -> bool:
        return False

    def get_source(self, fullname: str) -> str:
        return (
            'if __name__ == "__main__":\n'
            f"    from {self.target} import main\n"
            "    status = main()\n"
            "    raise SystemExit(status if isinstance(status, int) else 0)\n"
        )


class _Commands(importlib.abc.MetaPathFinder):
    """Finds `experiments.<tool>` in `TOOLS`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, name = fullname.rpartition(".")
        if prefix != __name__ or name not in TOOLS:
            return None
        tool = importlib.util.find_spec(TOOLS[name])
        # the tool's own file as the origin: what `-m` puts in sys.argv[0] (argparse's prog)
        origin = tool.origin if tool is not None else None
        return importlib.util.spec_from_loader(fullname, _Command(TOOLS[name]), origin=origin)


if not any(isinstance(f, _Commands) for f in sys.meta_path):
    sys.meta_path.append(_Commands())
