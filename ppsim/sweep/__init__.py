"""Capacity sweeps: the highest SLO-meeting request rate for every configuration of a search space."""

from ppsim.sweep.runner import run_sweep
from ppsim.sweep.space import load_space, parse_space

__all__ = ["load_space", "parse_space", "run_sweep"]
