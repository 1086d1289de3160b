"""Published serving results reproduced on the simulated executor, one paper's table or
figure each: `python -m experiments.reproduce NAME [--out DIR] [--quick] [--workers N]
[OVERRIDES]`, and `--list` for the names. docs/reproductions.md has the scoreboard.

Adding a reproduction takes a module here and a line in `registry.py`:

1. `registry.py`: `Entry(name, paper, figure, module)`; `--list` prints the first three, and
   the module is imported only when the reproduction runs.
2. The module defines `reproduce(ctx: Context) -> Outcome` (`reproduction.py`):
   - its config is Hydra overrides on `conf/`, a module constant (`BASE`): conf/ names no
     module of `experiments/`, and the user's OVERRIDES are added after it to every run, so
     the same question can be asked of another model, GPU or policy;
   - its runs are `ctx.run(BASE, [Job(name, overrides, measure), ...])` (`jobs.py`): every
     config is checked before any runs (a bad override is one `UserError` line, exit 2), each
     distinct model is loaded and each distinct workload built once, each job gets its own
     engine, and its numbers come back as `JobOutcome.metrics` (metrics.json's keys, plus what
     `measure(result)` reads of the engine's `RunResult`); `ctx.workers` jobs run at once in
     forked processes (`framework.run.workers`, the project's one pool);
   - a capacity search is `ctx.search(BASE, [SearchJob(...), ...])` (`search.py`): the highest
     rate at which a config meets an SLO, by `goodput_search.find_capacity`, each probe a job;
     searches of one config share their runs, a grid of rates may seed their brackets, and
     the searches run `ctx.workers` at once;
   - the engine the paper ran names its software (`executor.software`, one profile for every
     reproduction that ran that engine, never a factor per paper), and a rule the paper
     states as a formula (an SLO as a multiple of a step, a KV pool as the memory less the
     weights) is computed for the model, GPU and parallelism asked (`gpu_memory.py`);
   - `ctx.quick` asks for the small form the tests run (seconds); the full form must finish
     in minutes on a 2-core machine;
   - it returns `Outcome(cells, assumptions, setup, draw, config, sections, data)`: `Cell`s
     of the paper's table (`cells.py`: published, simulated, unit; the deviation rule is fixed
     there, points for a percentage, simulated / published - 1 otherwise, a published range
     met anywhere inside it), every `Assumption` with its source, the set-up in Markdown, a
     function drawing the paper's figure with the published points overlaid (matplotlib,
     through `framework.tracking.figures`), the composed config for MLflow, further Markdown
     sections, JSON-ready data (the figure's series), and `paper_setup` (`cells.PaperSetup`:
     the keys the paper's numbers were measured on; on any other set-up each published value
     is shown as the paper's, labelled, and is no target). Tables go through
     `framework.tracking.tables.markdown_table`.
3. `report.py` writes the rest the same way for every reproduction: `reproduction.md`,
   `reproduction.json`, `reproduction.png` into `--out` (default
   `outputs/reproductions/NAME/DATE_TIME`), and one MLflow run (`nanoserve.kind=reproduction`).

Where a published number is missed, the cell says so with its deviation and the report
explains the cause by a run; nothing is tuned to meet it.
"""
