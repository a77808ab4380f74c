"""Simulator vs live engine: error tables, per-request comparison, plots and combined traces."""
