"""Where results go beyond the run folder: MLflow (the store, run tags and names, one parent
run per sweep), the sweep's progress bar, and the plots."""
