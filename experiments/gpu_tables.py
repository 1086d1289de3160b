"""The import path of the published GPU tables' reader, for code that names it here. The code:
`experiments/gpu/tables.py`."""

from experiments.gpu.tables import read_operator_table

__all__ = ["read_operator_table"]
