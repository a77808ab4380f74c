"""Runs an engine-core generator against the simulated pipeline and a simulated client."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from ppsim.errors import PPSimError
from ppsim.metrics.records import OpRecord, RequestRecord, record_token
from ppsim.policy.actions import Await, Cpu, Emit, Idle, Launch, Poll
from ppsim.policy.pipelines import REPLICATED, build_core, pipe_options
from ppsim.policy.requests import Request
from ppsim.sim.build import Prepared
from ppsim.sim.pipeline import PipelineSim

MAX_IDLE_SPINS = 100_000  # consecutive empty micro-batches with nothing in flight = stalled


@dataclass
class SimResult:
    prepared: Prepared
    requests: list[RequestRecord]
    ops: list[OpRecord]
    num_preemptions: int
    peak_blocks_used: int
    events: int
    end_s: float
    pools: list[Any] = field(default_factory=list)  # every KV pool (one per replica), for checks


class Simulation:
    def __init__(self, prep: Prepared, env: simpy.Environment | None = None,
                 observer: Callable[[Any], None] | None = None) -> None:
        self.prep = prep
        self.env = env or simpy.Environment()
        self.ops: list[OpRecord] = []
        self.pool = prep.block_pool()
        knobs = prep.knobs()
        self.core = build_core(knobs, self.pool)
        self.scheduler = self.core.scheduler
        self.observer = observer  # sees every action the core yields (tests check invariants on it)
        tp = prep.scenario.cluster.tensor_parallel_size
        opts = pipe_options(knobs)
        self.pipe = PipelineSim(self.env, prep.topology.stages, prep.cost,
                                lambda n: prep.shape.seam_bytes(n, tp), self.ops,
                                opts.token_path, opts.broadcast_serialized, opts.overlap_sends,
                                opts.defer_outputs)
        self.pipe.track_tokens = getattr(self.scheduler.limits, "async_placeholders", False)
        self.relay_time = getattr(prep.cost, "relay_time", None)  # scheduler relay CPU, if the cost has it
        self.records = {r.req_id: RequestRecord(r.req_id, r.arrival_s, r.prompt_len, r.output_len)
                        for r in prep.requests}
        self.requests = {r.req_id: r for r in prep.requests}
        self.pending = len(prep.requests)
        self.wakeup: simpy.Event | None = None
        self.finish_events: dict[int, simpy.Event] = {}
        self.events = 0

    # --- client ---------------------------------------------------------------------------------
    def _submit(self, req: Request) -> None:
        rec = self.records[req.req_id]
        rec.sent_s = self.env.now
        if not self.scheduler.add_request(req):
            rec.status = "rejected"
            self._ended(req.req_id)
            return
        if req.abort_after_s is not None:
            self.env.timeout(req.abort_after_s).callbacks.append(lambda _e, r=req.req_id: self._abort(r))
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def _abort(self, req_id: int) -> None:
        """The client cancels: the request leaves the scheduler and its KV blocks are freed."""
        if self.scheduler.abort(req_id):
            rec = self.records[req_id]
            rec.finish_s, rec.status = self.env.now, "aborted"
            self._ended(req_id)

    def _all_done(self) -> bool:
        return self.pending == 0

    def _ended(self, req_id: int) -> None:
        self.pending -= 1
        ev = self.finish_events.pop(req_id, None)
        if ev is not None:
            ev.succeed()
        if self.pending == 0 and self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def _closed_loop_one(self, req: Request, sem: simpy.Resource) -> Generator[simpy.Event, Any, None]:
        with sem.request() as slot:
            yield slot
            done = self.env.event()
            self.finish_events[req.req_id] = done
            self._submit(req)
            if not done.triggered:
                yield done

    def _client(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        limit = self.prep.scenario.workload.max_concurrency
        sem = simpy.Resource(env, capacity=limit) if limit else None
        for req in sorted(self.prep.requests, key=lambda r: (r.arrival_s, r.req_id)):
            if req.arrival_s > env.now:
                yield env.timeout(req.arrival_s - env.now)
            if sem is None:
                self._submit(req)
            else:
                env.process(self._closed_loop_one(req, sem))

    # --- engine core ----------------------------------------------------------------------------
    def _emit(self, outputs: tuple) -> None:
        now = self.env.now
        for o in outputs:
            limit = self.requests[o.req_id].abort_after_tokens
            if record_token(self.records[o.req_id], o.index, o.finished, now, limit, self.scheduler.abort):
                self._ended(o.req_id)

    def _on_launch(self, plan: Any) -> None:
        now = self.env.now
        for it in plan.items:
            rec = self.records[it.req_id]
            if rec.scheduled_s is None:
                rec.scheduled_s = now

    def _core(self) -> Generator[simpy.Event, Any, None]:
        env, cost, pipe = self.env, self.prep.cost, self.pipe
        gen = self.core.run()
        reply = None
        spins = 0
        while True:
            act = gen.send(reply)
            reply = None
            self.events += 1
            if self.observer is not None:
                self.observer(act)
            kind = type(act)
            if kind is Cpu:
                dt = cost.cpu_time(act.kind, act.n)
                if act.relay and self.relay_time is not None:
                    dt += self.relay_time(act.relay)
                if dt > 0:
                    start = env.now
                    yield env.timeout(dt)
                    self.ops.append(OpRecord("core", act.kind, -1, start, env.now, 0, act.n))
            elif kind is Launch:
                plan = act.plan
                if plan.is_empty and pipe.in_flight == 0:
                    spins += 1
                    if spins > MAX_IDLE_SPINS:
                        raise PPSimError("scheduler stalled: requests wait but none can be scheduled "
                                         "(check max_num_batched_tokens and KV capacity)")
                else:
                    spins = 0
                    self._on_launch(plan)
                pipe.launch(plan)
            elif kind is Await:
                pipe.awaiting(act.plan.step_id)
                yield pipe.done[act.plan.step_id]
                del pipe.done[act.plan.step_id]
            elif kind is Poll:
                reply = pipe.done[act.plan.step_id].triggered
            elif kind is Emit:
                self._emit(act.outputs)
            elif kind is Idle:
                if self._all_done():
                    return
                self.wakeup = env.event()
                yield self.wakeup
                self.wakeup = None
                if self._all_done():
                    return

    def run(self) -> SimResult:
        self.env.process(self._client())
        core = self.env.process(self._core())
        self.env.run(until=core)
        for rec in self.records.values():
            if rec.status == "pending":
                rec.status = "unfinished"
        for st in self.scheduler.requests.values():
            self.records[st.req_id].preemptions = st.preemptions
        scheduled_events = next(self.env._eid)  # SimPy's event counter: events scheduled so far
        return SimResult(self.prep, [self.records[r.req_id] for r in self.prep.requests], self.ops,
                         self.scheduler.num_preemptions, self.pool.peak_used, scheduled_events, self.env.now,
                         [self.pool])


def simulate(prep: Prepared, observer: Callable[[Any], None] | None = None) -> SimResult:
    if prep.scenario.engine.policy in REPLICATED:
        from ppsim.sim.replicas import simulate_replicas

        return simulate_replicas(prep, observer)
    return Simulation(prep, observer=observer).run()
