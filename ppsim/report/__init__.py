"""Pictures of runs: the per-run dashboard and the comparison of runs."""
