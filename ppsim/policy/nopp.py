"""The DeepInfer-style baseline: no pipeline, the same GPUs as data-parallel replicas.

DeepInfer (``deepinfer/model_executor/parallel_utils/parallel_state.py``) has no pp process group:
every rank holds the whole layer stack and requests are sharded across data-parallel replicas.
With ``pp`` groups of ``tp`` GPUs, ``no-pp`` runs ``pp`` replicas of ``tp`` GPUs each, every one a
synchronous vLLM engine core (no pipeline, so no bubble and no token relay), and a router in front
that sends each request to one replica when it arrives.

Routing is a pure function of the replicas' state at arrival: ``round-robin`` (the i-th request
to replica i mod R) or ``least-loaded`` (the replica with the fewest unfinished requests; ties
to the lowest index), as ``vllm``'s DP load balancer does with its waiting/running counts.
"""

from __future__ import annotations

from collections.abc import Sequence

ROUTING_MODES = ("round-robin", "least-loaded")


def route(mode: str, index: int, loads: Sequence[int]) -> int:
    """The replica for the ``index``-th arriving request, given each replica's unfinished count."""
    if not loads:
        raise ValueError("no replicas")
    if mode == "round-robin":
        return index % len(loads)
    if mode == "least-loaded":
        return min(range(len(loads)), key=lambda r: (loads[r], r))
    raise ValueError(f"unknown routing {mode!r}; use one of {', '.join(ROUTING_MODES)}")
