"""The analytic GPU cost model's tools: fit a GPU's kernels to published tables (`gpu_fit`),
judge the fit on any table of that format (`gpu_check`), both reading the tables through
`tables`; and write an analytic profile for a model on a GPU spec (`analytic_profile`)."""
