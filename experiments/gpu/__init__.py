"""The analytic GPU cost model checked: `gpu_check` judges the fit on any table of the
published format, read by `framework.calibration.gpu_tables`; `measured/` holds the tables
timed on a real H200 (`experiments.op_table`). The fit itself and the analytic profiles are
`framework.calibration`."""
