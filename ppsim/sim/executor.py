"""The simulator's executor: SimPy time and simulated pipelines behind the shared driver.

:mod:`ppsim.driver` runs the engine core, the client and the ledger; this module supplies what is
simulated: the clock (SimPy), each pipeline (the closed-form :mod:`ppsim.sim.fast`, or the
per-event :mod:`ppsim.sim.pipeline` as reference) and the engine core's CPU time from the cost
model. ``no-pp`` runs one driver per data-parallel replica on one clock, behind a router
(:mod:`ppsim.sim.replicas`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import simpy

from ppsim.deployment import Prepared
from ppsim.driver import Client, Driver
from ppsim.errors import PPSimError
from ppsim.metrics.ledger import Ledger
from ppsim.metrics.oplog import OpLog
from ppsim.metrics.records import RequestRecord
from ppsim.metrics.series import SeriesRecorder
from ppsim.policy.actions import Cpu
from ppsim.policy.pipelines import REPLICATED, build_core, pipe_options
from ppsim.policy.plan import StepPlan
from ppsim.sim.fast import EmptyDone, FastPipeline, needs_reference
from ppsim.sim.pipeline import PipelineSim
from ppsim.sim.progress import RunProgress


@dataclass
class SimResult:
    prepared: Prepared
    ledger: Ledger
    ops: OpLog
    num_preemptions: int
    peak_blocks_used: int
    events: int
    end_s: float
    pools: list[Any] = field(default_factory=list)  # every KV pool (one per replica), for checks
    series: SeriesRecorder | None = None  # down-sampled busy/KV series and the timeline window
    actions: list[tuple[int, StepPlan]] | None = None  # (stage, plan) launched, in order (keep_ops)
    _records: list[RequestRecord] | None = field(default=None, repr=False)

    @property
    def requests(self) -> list[RequestRecord]:
        """One record per request, in the workload's order (needs ``keep_tokens``)."""
        if self._records is None:
            self._records = self.ledger.records()
        return self._records


class SimBackend:
    """One simulated pipeline and the engine core's CPU, on a shared SimPy clock."""

    def __init__(self, env: simpy.Environment, prep: Prepared, ops: OpLog, reference: bool, async_tokens: bool) -> None:
        self.env, self.ops, self.cost = env, ops, prep.cost
        self.every_event = reference  # the reference takes every wait as a SimPy event
        opts = pipe_options(prep.knobs())
        tp = prep.scenario.cluster.tensor_parallel_size
        # the per-event reference pipeline on request, or where the closed form does not hold
        pipeline = PipelineSim if reference or needs_reference(opts.broadcast_serialized) else FastPipeline
        self.pipe = pipeline(
            env,
            prep.topology.stages,
            prep.cost,
            lambda n: prep.shape.seam_bytes(n, tp),
            ops,
            opts.token_path,
            opts.broadcast_serialized,
            opts.overlap_sends,
            opts.defer_outputs,
        )
        self.pipe.track_tokens = async_tokens
        self.launch = self.pipe.launch  # type: ignore[method-assign]  # the pipeline's own, without a hop
        self.defer = opts.defer_outputs > 0
        self.fast_pipe = pipeline is FastPipeline and not self.defer
        self.relay_time = getattr(prep.cost, "relay_time", None)  # scheduler relay CPU, if the cost has it
        self._cpu_dt: dict[Cpu, float] = {}  # (kind, n, relay) -> CPU seconds
        self.wakeup: simpy.Event | None = None
        self.series: SeriesRecorder | None = None  # set with the pool by the simulation
        self.pool: Any = None
        self.abort: Callable[[int, float], None] = lambda _r, _t: None  # set to the driver's

    @property
    def in_flight(self) -> int:
        return self.pipe.in_flight

    def now(self) -> float:
        return self.env._now  # env.now, without its property

    def launch(self, plan: StepPlan) -> None:
        self.pipe.launch(plan)

    def wait(self, plan: StepPlan) -> Iterable[simpy.Event]:
        """The micro-batch's completion event, to yield; its entry goes once it is awaited (no one
        polls a plan then; the fast pipeline's completion holds the event itself, unless outputs are
        deferred)."""
        if self.fast_pipe:
            done = self.pipe.done.pop(plan.step_id)
            return done.wait(self.env) if type(done) is EmptyDone else (done,)
        return self._wait(plan)

    def _wait(self, plan: StepPlan) -> Generator[simpy.Event, Any, None]:
        if self.defer:  # SGLang's deferred output send leaves once the core waits for it
            self.pipe.awaiting(plan.step_id)
        done = self.pipe.done
        yield done[plan.step_id]
        del done[plan.step_id]

    def poll(self, plan: StepPlan) -> bool:
        return self.pipe.done[plan.step_id].triggered

    def cpu(self, act: Cpu) -> Iterable[simpy.Event]:
        """The CPU stretch: nothing to wait for (``()``) when nothing else is due before it ends, as
        then nothing can change meanwhile and the clock moves as the timeout would (to now + dt);
        else a generator that waits for its timeout."""
        dt = self._cpu_dt.get(act)
        if dt is None:  # a pure function of the action (a named tuple, its own key): memoised
            dt = self.cost.cpu_time(act.kind, act.n)
            if act.relay and self.relay_time is not None:
                dt += self.relay_time(act.relay)
            self._cpu_dt[act] = dt
        if dt > 0:
            env = self.env
            start = env._now
            end = start + dt
            q = env._queue  # env.peek(), inlined
            if self.every_event or (q and q[0][0] <= end):
                return self._cpu_wait(act, dt)
            env._now = end
            self.ops.add_other("core", act.kind, -1, start, end, 0, act.n)
        return ()

    def _cpu_wait(self, act: Cpu, dt: float) -> Generator[simpy.Event, Any, None]:
        env = self.env
        start = env.now
        yield env.timeout(dt)
        self.ops.add("core", act.kind, -1, start, env.now, 0, act.n)

    def idle(self) -> Generator[simpy.Event, Any, None]:
        self.wakeup = self.env.event()
        yield self.wakeup
        self.wakeup = None

    def wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def abort_after(self, delay_s: float, req_id: int, sent_s: float) -> None:
        env = self.env
        env.timeout(delay_s).callbacks.append(lambda _e: self.abort(req_id, env.now))

    def stalled(self, message: str) -> None:
        raise PPSimError(message)


class Simulation:
    """One run: a client, a ledger and one driver per pipeline (several for ``no-pp`` replicas)."""

    def __init__(
        self,
        prep: Prepared,
        env: simpy.Environment | None = None,
        observer: Callable[[Any], None] | None = None,
        reference: bool = False,
        keep_ops: bool = True,
        keep_tokens: bool = True,
        progress: RunProgress | None = None,
        replicas: list[Prepared] | None = None,
    ) -> None:
        self.prep = prep
        self.env = env or simpy.Environment()
        self.ledger = Ledger(prep.requests, keep_tokens)
        self.client = Client(prep.requests, prep.scenario.workload.max_concurrency)
        self.progress = progress
        self.slot: simpy.Event | None = None  # the closed-loop client waits on it for a free slot
        self.drivers: list[Driver] = []
        self.launched: list[tuple[int, StepPlan]] | None = [] if keep_ops else None  # actions.csv
        self.backends: list[SimBackend] = []
        self.pools: list[Any] = []
        self.route: Callable[[int, list[int]], int] = lambda _i, _loads: 0
        arrivals = (float(prep.requests.arrival_s.max()),) if len(prep.requests) else ()  # the last one
        for rp in replicas or [prep]:
            series = SeriesRecorder.for_run(len(rp.topology.stages), arrivals)
            ops = OpLog(keep_ops, series)
            pool = rp.block_pool()
            core = build_core(rp.knobs(), pool)
            be = SimBackend(
                self.env, rp, ops, reference, bool(getattr(core.scheduler.limits, "async_placeholders", False))
            )
            drv = Driver(core, self.ledger, self.client, be, observer)
            drv.stage = len(self.drivers)  # replica k's GPU group is reported as stage k
            drv.launched = self.launched  # one list for every replica: launch order on the shared clock
            be.abort = drv.abort
            drv.on_ended.append(self._ended)
            drv.kv_watch = (pool, series)  # be.sample_kv, inlined in the driver's loop
            be.series, be.pool = series, pool
            self.drivers.append(drv)
            self.backends.append(be)
            self.pools.append(pool)

    # convenience views of the first (for pipelines, only) replica
    @property
    def pipe(self) -> Any:
        return self.backends[0].pipe

    @property
    def scheduler(self) -> Any:
        return self.drivers[0].scheduler

    @property
    def core(self) -> Any:
        return self.drivers[0].core

    @property
    def pool(self) -> Any:
        return self.pools[0]

    @property
    def ops(self) -> OpLog:
        return self.backends[0].ops

    def _ended(self, _req_id: int) -> None:
        if self.progress is not None:
            self.progress.ended(self.env.now)
        if self.slot is not None and not self.slot.triggered:
            self.slot.succeed()
        if self.client.all_done:
            for be in self.backends:
                be.wake()

    def _client(self) -> Generator[simpy.Event, Any, None]:
        env, client = self.env, self.client
        while client.head is not None:
            t = client.next_arrival_s()
            if t is None:  # closed loop, every slot taken: wait for a request to end
                self.slot = env.event()
                yield self.slot
                self.slot = None
                continue
            if t > env.now:
                yield env.timeout(t - env.now)
            index = client.sent
            row, req = client.take()
            k = self.route(index, [d.routed for d in self.drivers])
            if self.drivers[k].submit(row, req, env.now):
                self.backends[k].wake()

    def run(self) -> SimResult:
        env = self.env
        env.process(self._client())
        cores = [env.process(d.run()) for d in self.drivers]
        env.run(until=cores[0] if len(cores) == 1 else simpy.AllOf(env, cores))
        for d in self.drivers:
            d.finish()
        self.ledger.close()
        single = len(self.drivers) == 1
        events = next(env._eid) if single else sum(d.actions for d in self.drivers)  # SimPy's event counter
        parts = [be.ops.series for be in self.backends]
        for part in parts:
            part.close(env.now)
        series = parts[0] if single else SeriesRecorder.combine(parts)
        return SimResult(
            self.prep,
            self.ledger,
            self._ops(),
            sum(d.scheduler.num_preemptions for d in self.drivers),
            max(p.peak_used for p in self.pools),
            events,
            env.now,
            self.pools,
            series,
            self.launched,
        )

    def _ops(self) -> OpLog:
        if len(self.backends) == 1:
            return self.backends[0].ops
        ops = OpLog(self.backends[0].ops.keep)  # the combined series is built from the replicas' own
        for k, be in enumerate(self.backends):  # replica k's GPU group is reported as stage k
            ops.merge(be.ops, {"stage0": f"stage{k}"}, f"r{k}.")
        ops.records.sort(key=lambda o: (o.start_s, o.track))
        return ops


def simulate(
    prep: Prepared,
    observer: Callable[[Any], None] | None = None,
    reference: bool = False,
    keep_ops: bool = True,
    keep_tokens: bool = True,
    progress: RunProgress | None = None,
) -> SimResult:
    """Run ``prep``. ``reference``: the per-event pipeline (:mod:`ppsim.sim.pipeline`) instead of the
    closed-form one (:mod:`ppsim.sim.fast`), and every engine-core CPU stretch as a SimPy timeout
    (the fast path moves the clock without an event when nothing else is due). ``keep_ops`` /
    ``keep_tokens``: keep every operation record / every token time (the summary needs neither);
    ``progress``: told of every request that ends."""
    replicas = None
    if prep.scenario.engine.policy in REPLICATED:
        from ppsim.sim.replicas import replica_setup

        replicas, route = replica_setup(prep)
    sim = Simulation(
        prep,
        observer=observer,
        reference=reference,
        keep_ops=keep_ops,
        keep_tokens=keep_tokens,
        progress=progress,
        replicas=replicas,
    )
    if replicas is not None:
        sim.route = route
    return sim.run()
