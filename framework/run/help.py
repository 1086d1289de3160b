"""`python run.py --help`: what nanoserve is, the commands people run most, and every choice a
user can pick, each with one line on what it does.

Hydra's own help lists config-store entries too (`model_schema`, `chat_schema`), which are
not choices. Here the policy groups come from the plugin registry (third-party plugins
included, each named with its distribution), their line from the policy class's docstring
(else its module's); the YAML groups come from `conf/`, their line from the file's opening
comment. Nothing here imports torch or a model: help is instant.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from framework.api.groups import GROUPS
from framework.plugin_host.registry import Registry

CONF = Path(__file__).resolve().parents[2] / "conf"
WIDTH = 100

HEADER = """\
nanoserve: an LLM inference engine for studying serving policies. Scheduling, KV allocation,
preemption and output processing are plugins; an experiment is a config; every run is an
MLflow run. Counts (token slots, waste, preemptions) hold on any machine, times only on this.

Most used:
  python run.py                                      the default job: chat prompts on SmolLM2
  python run.py scheduler=static model=tiny          one run with other choices (see below)
  python run.py -m scheduler=static,continuous       a sweep: a table at the end, one MLflow
                                                     parent run with a child per job
  python run.py +experiment=batching                 a study: a named sweep and its table
  mlflow ui --backend-store-uri sqlite:///mlflow.db  compare the runs in a browser
  python run.py --cfg job                            print the composed config, run nothing
"""

FOOTER = """\
Settings (KEY=VALUE): seed, device=auto|cpu|cuda|cuda:N, dtype=float32|bfloat16|float16,
  threads, window (output=deferred), observers=[...], engine.max_num_seqs,
  engine.max_num_batched_tokens, engine.block_size, engine.num_blocks, engine.kv_memory_mb,
  model.path, model.max_model_len, workload.<field> (each workload's fields: its YAML in conf/).
Simulated (executor=simulated): executor.profile, executor.hardware=h100-sxm|h200|a100-80gb|
  a100-40gb|a100-80gb-pcie (the GPU priced when no profile of this CPU fits),
  executor.tensor_parallel=1|2|4|8, executor.interconnect=dgx|nvlink_pair (unset: the GPU's
  own), executor.host_time, executor.overlap.
A policy's options are set as GROUP.OPTION=VALUE (scheduler.key=prompt_len); `-m` sweeps any
of them (a,b,c). Hydra's own flags: --hydra-help. More: README.md and docs/.
"""


def first_line(text: str | None) -> str:
    """The first sentence of a docstring or comment block, on one line."""
    flat = " ".join((text or "").split())
    for end in (". ", ".\n"):
        if end in flat + "\n":
            flat = (flat + "\n").split(end)[0].strip() + "."
            break
    return flat.rstrip() if flat.endswith(".") else flat


def policy_line(cls: type) -> str:
    """The policy class's own docstring, else its module's (a base class's does not count)."""
    own = cls.__dict__.get("__doc__")
    return first_line(own or inspect.getdoc(sys.modules.get(cls.__module__)))


def options(config_cls: type) -> str:
    """`key=max_tokens aging_s=inf`: a policy's options with their defaults."""
    fields = [f for f in dataclasses.fields(config_cls) if f.name != "name"]
    shown = []
    for f in fields:
        default = getattr(f.default, "value", f.default)  # an Enum shows its value
        if default is dataclasses.MISSING:
            shown.append(f"{f.name}=?")
        elif isinstance(default, str) and default.startswith("${"):
            shown.append(f"{f.name} (follows {default[2:-1]})")  # `window: ${window}`
        else:
            shown.append(f"{f.name}={default}")
    return " ".join(shown)


def yaml_line(path: Path) -> str:
    """The opening sentence of a config file's comment (after `# @package`); a line that
    ends in `:` introduces an example, so the sentence ends there."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if line.startswith("# @package") or not text:
            continue
        if text.endswith(":"):
            lines.append(text[:-1] + ".")
            break
        lines.append(text)
        if text.endswith(".") or ". " in text:
            break
    return first_line(" ".join(lines))


def defaults() -> dict[str, str]:
    """The default choice of each group, from `conf/config.yaml`'s defaults list."""
    chosen: dict[str, str] = {}
    conf = OmegaConf.load(CONF / "config.yaml")
    assert isinstance(conf, DictConfig)  # the primary config is a mapping, as Hydra requires
    for item in conf.get("defaults", []):
        if isinstance(item, dict) or OmegaConf.is_dict(item):
            chosen.update({str(k): str(v) for k, v in dict(item).items()})
    return chosen


def rows_text(rows: list[tuple[str, str]]) -> list[str]:
    """`name  description`, the description wrapped under itself."""
    width = max((len(n) for n, _ in rows), default=0)
    indent = " " * (width + 6)
    out = []
    for name, desc in rows:
        out += textwrap.wrap(
            desc, WIDTH, initial_indent=f"    {name:<{width}}  ", subsequent_indent=indent
        ) or [f"    {name}"]
    return out


def choice_rows(reg: Registry, group: str) -> list[tuple[str, str]]:
    if group in GROUPS:
        rows = []
        for name, entry in sorted(reg.policies[group].items()):
            line = policy_line(entry.cls)
            opts = options(entry.config_cls)
            if entry.provider.distribution not in (None, "nanoserve"):
                line = f"{line} [{entry.provider.label}]"
            rows.append((name, f"{line} Options: {opts}." if opts else line))
        return rows
    folder = CONF / group
    rows = [(p.stem, yaml_line(p)) for p in sorted(folder.glob("*.yaml"))]
    if group == "hydra/launcher":
        rows.insert(0, ("basic", "Hydra's default: the jobs of a sweep one after another."))
    return rows


def group_block(reg: Registry, group: str, default: str | None, note: str = "") -> list[str]:
    head = f"  {group}" + (f" (default {default})" if default else "") + note
    return [head, *rows_text(choice_rows(reg, group))]


def observer_block(reg: Registry) -> list[str]:
    rows = []
    for name, (factory, provider) in sorted(reg.observers.items()):
        line = policy_line(factory) if isinstance(factory, type) else first_line(factory.__doc__)
        if provider.distribution not in (None, "nanoserve"):
            line = f"{line} [{provider.label}]"
        rows.append((name, line))
    head = "  observers=[...] (default [console, progress, plots, mlflow])"
    return [head, *rows_text(rows)]


def help_text(reg: Registry) -> str:
    chosen = defaults()
    lines = [HEADER, "Choices (GROUP=CHOICE):"]
    for group in (*GROUPS, "model", "workload", "executor"):
        lines += group_block(reg, group, chosen.get(group))
    lines += group_block(reg, "experiment", None, ", added as +experiment=NAME")
    lines += group_block(reg, "hydra/launcher", "basic", ", where a -m sweep's jobs run")
    lines += observer_block(reg)
    if reg.load_errors:
        lines.append("Plugins that failed to load (their choices are missing above):")
        lines += [f"  {e.plugin} ({e.distribution}): {e.error}" for e in reg.load_errors]
    return "\n".join([*lines, "", FOOTER])


def wants_help(argv: list[str]) -> bool:
    """`--help` / `-h` anywhere on the line (Hydra's `--hydra-help` is left to Hydra)."""
    return any(a in ("--help", "-h") for a in argv)


def print_help(reg: Registry, out: Any = None) -> None:
    print(help_text(reg), file=out or sys.stdout)
