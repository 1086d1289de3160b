"""nanoserve's command line: `python run.py scheduler=continuous allocator=incremental ...`.

Every option is a Hydra override; `python run.py --help` lists the groups and choices. A
user's mistake ends in one line, `error: ...`, and exit status 2; a bug keeps its traceback
and exits 1 (`framework/run/cli.py`).
"""

from __future__ import annotations

import sys

from framework.run.cli import main

if __name__ == "__main__":
    sys.exit(main())
