"""ppsim: a discrete-event simulator of pipeline-parallel LLM inference serving."""

__version__ = "0.1.0"
