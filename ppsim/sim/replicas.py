"""``no-pp``: the pipeline's GPUs run as ``pp`` data-parallel replicas sharing one clock.

Each replica is a one-stage :class:`Simulation` over the whole model (rejected with a clear error if
the model does not fit on one GPU group); a router process sends each arriving request to a replica
(:func:`ppsim.policy.nopp.route`). Records are merged; replica r's stage is reported as track
``stage{r}``, so the summary's busy fractions are per GPU group and its "bubble" is their idle time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

import simpy

from ppsim.errors import PPSimError
from ppsim.metrics.records import OpRecord
from ppsim.metrics.series import SeriesRecorder
from ppsim.policy.nopp import route
from ppsim.sim.build import Prepared, prepare
from ppsim.sim.executor import SimResult, Simulation


class _Replica(Simulation):
    """One replica: ends only when the router has no request left anywhere."""

    def __init__(self, prep: Prepared, env: simpy.Environment, router: _Router,
                 observer: Callable[[Any], None] | None) -> None:
        super().__init__(prep, env, observer)
        self.router = router
        self.pending = 0  # requests routed here and not yet ended

    def _ended(self, req_id: int) -> None:
        super()._ended(req_id)
        self.router.ended()

    def _all_done(self) -> bool:
        return self.router.remaining == 0


class _Router:
    def __init__(self, num_requests: int) -> None:
        self.remaining = num_requests
        self.replicas: list[_Replica] = []

    def ended(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            for r in self.replicas:
                if r.wakeup is not None and not r.wakeup.triggered:
                    r.wakeup.succeed()


def replica_prepared(prep: Prepared) -> Prepared:
    """The one-stage preparation of a replica: whole model on one TP group, same requests."""
    s = prep.scenario
    one = s.model_copy(update={"cluster": s.cluster.model_copy(update={"pipeline_parallel_size": 1,
                                                                          "layer_partition": "vllm"})})
    try:
        rp = prepare(one, prep.requests)
    except PPSimError as err:
        why = str(err).split("; raise")[0]  # the stage-level advice (more stages) does not apply here
        raise PPSimError(f"engine.policy: no-pp puts the whole model on each group of "
                         f"{s.cluster.tensor_parallel_size} GPU(s) and it does not fit ({why}); "
                         "raise --tensor-parallel-size or pick a pipeline policy") from None
    return replace(rp, scenario=one)


def simulate_replicas(prep: Prepared, observer: Callable[[Any], None] | None = None) -> SimResult:
    n_rep = len(prep.topology.stages)
    rp = replica_prepared(prep)
    env = simpy.Environment()
    router = _Router(len(prep.requests))
    router.replicas = [_Replica(rp, env, router, observer) for _ in range(n_rep)]
    mode = prep.scenario.engine.dp_routing
    owner: dict[int, int] = {}

    def submit(i: int, req: Any) -> simpy.Event:
        k = route(mode, i, [r.pending for r in router.replicas])
        owner[req.req_id] = k
        rep = router.replicas[k]
        rep.pending += 1
        done = rep.finish_events[req.req_id] = env.event()
        rep._submit(req)
        return done

    def closed_loop_one(i: int, req: Any, sem: simpy.Resource) -> Generator[simpy.Event, Any, None]:
        with sem.request() as slot:  # the client's semaphore spans all replicas, as vllm bench serve's
            yield slot
            done = submit(i, req)
            if not done.triggered:
                yield done

    def client() -> Generator[simpy.Event, Any, None]:
        limit = prep.scenario.workload.max_concurrency
        sem = simpy.Resource(env, capacity=limit) if limit else None
        for i, req in enumerate(sorted(prep.requests, key=lambda r: (r.arrival_s, r.req_id))):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            if sem is None:
                submit(i, req)
            else:
                env.process(closed_loop_one(i, req, sem))

    env.process(client())
    cores = [env.process(r._core()) for r in router.replicas]
    env.run(until=simpy.AllOf(env, cores))
    return _merge(prep, router.replicas, owner, env.now)


def _merge(prep: Prepared, reps: list[_Replica], owner: dict[int, int], end_s: float) -> SimResult:
    records = []
    for req in prep.requests:
        rep = reps[owner[req.req_id]] if req.req_id in owner else reps[0]
        rec = rep.records[req.req_id]
        if rec.status == "pending":
            rec.status = "unfinished"
        st = rep.scheduler.requests.get(req.req_id)
        if st is not None:
            rec.preemptions = st.preemptions
        records.append(rec)
    ops: list[OpRecord] = []
    for k, rep in enumerate(reps):
        for o in rep.ops:
            ops.append(replace(o, track=f"stage{k}") if o.track == "stage0" else
                       replace(o, track=f"r{k}.{o.track}"))
    ops.sort(key=lambda o: (o.start_s, o.track))
    for rep in reps:
        rep.series.close(end_s)
    return SimResult(prep, records, ops, sum(r.scheduler.num_preemptions for r in reps),
                     max(r.pool.peak_used for r in reps), sum(r.events for r in reps), end_s,
                     [r.pool for r in reps], SeriesRecorder.combine([r.series for r in reps]))
