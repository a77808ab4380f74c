"""``no-pp``: the pipeline's GPUs run as ``pp`` data-parallel replicas sharing one clock.

Each replica is a one-stage pipeline over the whole model (rejected with a clear error if the
model does not fit on one GPU group, :func:`ppsim.deployment.replica_prepared`) with its own engine
core; the client is shared, and a router sends each arriving request to a replica
(:func:`ppsim.policy.nopp.route`). Records are merged; replica r's stage is reported as track
``stage{r}``, so the summary's busy fractions are per GPU group and its "bubble" is their idle time.
"""

from __future__ import annotations

from collections.abc import Callable

from ppsim.deployment import Prepared, replica_prepared
from ppsim.policy.nopp import route


def replica_setup(prep: Prepared) -> tuple[list[Prepared], Callable[[int, list[int]], int]]:
    """The replicas' preparations and the router: (index of the arriving request, each replica's
    routed and unfinished requests) -> replica."""
    rp = replica_prepared(prep)
    mode = prep.scenario.engine.policy.dp_routing
    return [rp] * len(prep.topology.stages), lambda i, loads: route(mode, i, loads)
