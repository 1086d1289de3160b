"""Where things are, for code that runs configs from Python rather than through `run.py`: the
repository, its Hydra configs, the default output folder, and the Azure traces kept beside
the repository (`../shared`), so every tool finds them alike."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
OUTPUTS = ROOT / "outputs"
TRACES = {
    "conv": ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv",
    "code": ROOT.parent / "shared" / "data" / "traces" / "azure_llm_2023_code.csv",
}
DEFAULT_TRACE = TRACES["conv"]
