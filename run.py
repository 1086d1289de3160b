"""nanoserve's command line: `python run.py scheduler=continuous allocator=incremental ...`.

Every option is a Hydra override; `python run.py --help` lists the groups and choices.
Plugins load first: one that fails to import is reported on stderr (the others still work),
and an unknown policy name fails at once, listing what each installed package provides,
before the model code is even imported.
"""

from __future__ import annotations

import sys

from framework.api.registry import registry
from framework.run.preflight import check_command_line


def cli() -> None:
    reg = registry()
    for error in reg.load_errors:
        print(error, file=sys.stderr)
    check_command_line(sys.argv[1:], reg)

    # Imported only now: these pull in torch and transformers (seconds).
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig

    from framework.run.config import register_configs
    from framework.run.observers import run_with_observers

    register_configs()

    @hydra.main(version_base="1.3", config_path="conf", config_name="config")
    def main(cfg: DictConfig) -> None:
        run_with_observers(cfg, HydraConfig.get().runtime.output_dir)

    main()


if __name__ == "__main__":
    cli()
