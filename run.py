"""nanoserve's command line: `python run.py scheduler=continuous allocator=incremental ...`.

Every option is a Hydra override; `python run.py --help` lists the groups and choices.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from framework.config import register_configs
from framework.observers import run_with_observers

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_with_observers(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
