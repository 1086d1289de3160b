"""The types the policy contract names: a request (`request`), a sequence and its status
(`sequence`), one step's numbers (`step_stats`) and a cached block (`cached_block`). Both the
contract (`framework.api`, which re-exports them for plugins) and the engine import them from
here; this package imports neither.
"""
