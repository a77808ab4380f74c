"""One driver of the engine-core generators, shared by the simulator and the live engine.

The driver owns what both executors do alike: the client (:class:`Client`: open-loop arrivals at
the workload's times, or a closed loop keeping ``max_concurrency`` requests outstanding, as
``vllm bench serve``'s semaphore), the record :class:`~ppsim.metrics.ledger.Ledger`, and the
dispatch of the core's actions (:mod:`ppsim.policy.actions`). An executor (:class:`Backend`)
supplies only time and the pipeline: ``launch``, ``wait``, ``poll``, ``cpu`` (sleep) and
``idle``, plus a timer for a time-based cancellation (``abort_after``). ``wait``, ``cpu`` and ``idle``
are generators: the simulator yields SimPy events from them, the engine blocks inside them and
yields nothing (the simulator's ``cpu`` returns ``()`` when it moves the clock without an event).

A request that ends (finished, cancelled, rejected) is forgotten by the scheduler once its
preemption count is recorded, so a long run holds state only for requests still in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Protocol

from ppsim.metrics.ledger import Ledger
from ppsim.policy.actions import Await, Cpu, Emit, Idle, Launch, Poll
from ppsim.policy.plan import StepPlan
from ppsim.policy.requests import Request, TokenOutput
from ppsim.workload import Workload

MAX_IDLE_SPINS = 100_000  # consecutive empty micro-batches with nothing in flight = stalled


class Client:
    """Sends a workload's requests in arrival order, building each only when it is sent."""

    def __init__(self, workload: Workload, max_concurrency: int | None) -> None:
        self._arrivals: Iterator[tuple[int, Request]] = workload.in_arrival_order()
        self.head: tuple[int, Request] | None = next(self._arrivals, None)
        self.limit = max_concurrency
        self.outstanding = 0  # sent and not ended
        self.pending = len(workload)  # not ended (sent or not)
        self.sent = 0

    def next_arrival_s(self) -> float | None:
        """When the next request is due; None if none is left or the closed loop has no free slot."""
        if self.head is None or (self.limit is not None and self.outstanding >= self.limit):
            return None
        return self.head[1].arrival_s

    def take(self) -> tuple[int, Request]:
        """The next request (row, request), now counted as outstanding."""
        head = self.head
        assert head is not None
        self.head = next(self._arrivals, None)
        self.outstanding += 1
        self.sent += 1
        return head

    def ended(self) -> None:
        self.pending -= 1
        self.outstanding -= 1

    @property
    def all_done(self) -> bool:
        return self.pending == 0


class Backend(Protocol):
    """What an executor implements for the driver (see the module docstring)."""

    in_flight: int

    def now(self) -> float: ...
    def launch(self, plan: StepPlan) -> None: ...
    def wait(self, plan: StepPlan) -> Iterable[Any]: ...
    def poll(self, plan: StepPlan) -> bool: ...
    def cpu(self, act: Cpu) -> Iterable[Any]: ...  # a generator, or () when no wait is needed
    def idle(self) -> Generator[Any, Any, None]: ...
    def abort_after(self, delay_s: float, req_id: int, sent_s: float) -> None: ...
    def stalled(self, message: str) -> None: ...  # raises


class Driver:
    """Runs one engine core (``core.run()``) against ``backend``; ``client`` and ``ledger`` may be
    shared by several drivers (``no-pp`` replicas)."""

    def __init__(
        self, core: Any, ledger: Ledger, client: Client, backend: Backend, observer: Callable[[Any], None] | None = None
    ) -> None:
        self.core, self.scheduler = core, core.scheduler
        self.ledger, self.client, self.backend = ledger, client, backend
        self.observer = observer  # sees every action the core yields (tests check invariants on it)
        # req_id -> (ledger row, request, its token-time buffer in the ledger), until it ends
        self.live: dict[int, tuple[int, Request, list[float]]] = {}
        self.routed = 0  # requests sent to this driver and not ended (the no-pp router reads it)
        self.actions = 0
        self.on_ended: list[Callable[[int], None]] = []  # executor hooks: a request ended
        self.on_output: Callable[[TokenOutput], None] | None = None  # executor hook, before the record
        self.before_action: Callable[[], None] | None = None  # executor hook, before the core runs (the engine
        # pumps its client and notes the time: real CPU time passes inside the core's generator)
        self.after_action: Callable[[], None] | None = None  # executor hook
        # (pool, series): after every action, a change of the KV blocks in use is sampled into the
        # series at the current time (the simulator's KV series; inlined, as it runs after every action)
        self.kv_watch: tuple[Any, Any] | None = None
        self.stage = 0  # the stage its plans enter (a no-pp replica's GPU group is reported as stage k)
        self.launched: list[tuple[int, StepPlan]] | None = None  # a list: keep every non-empty plan
        # launched, as (stage, plan), for actions.csv (the decision stream both executors can diff)

    # --- client side -----------------------------------------------------------------------------
    def submit(self, row: int, req: Request, now: float) -> bool:
        """Send ``req`` to the engine core; False if it was rejected (it can never fit)."""
        self.live[req.req_id] = (row, req, self.ledger.on_sent(row, now))
        self.routed += 1
        if not self.scheduler.add_request(req):
            self.ledger.on_rejected(row)
            self._ended(req.req_id)
            return False
        if req.abort_after_s is not None:
            self.backend.abort_after(req.abort_after_s, req.req_id, now)
        return True

    def abort(self, req_id: int, now: float) -> None:
        """The client cancels (``Request.abort_after_s``): the scheduler drops it and frees its blocks."""
        if self.scheduler.abort(req_id):
            self.ledger.on_aborted(self.live[req_id][0], now)
            self._ended(req_id)

    def _ended(self, req_id: int) -> None:
        row = self.live.pop(req_id)[0]
        st = self.scheduler.requests.pop(req_id, None)
        if st is not None:
            self.ledger.preemptions[row] = st.preemptions
        self.routed -= 1
        self.client.ended()
        for hook in self.on_ended:
            hook(req_id)

    def finish(self) -> None:
        """After the run: requests still in the engine keep their preemption counts."""
        for req_id, st in self.scheduler.requests.items():
            entry = self.live.get(req_id)
            if entry is not None:
                self.ledger.preemptions[entry[0]] = st.preemptions

    # --- engine core -----------------------------------------------------------------------------
    def _emit(self, outputs: tuple[TokenOutput, ...]) -> None:
        now = self.backend.now()
        live, ledger, abort, hook = self.live, self.ledger, self.scheduler.abort, self.on_output
        if hook is None:  # the same rule in the ledger's one loop
            ledger.on_tokens(outputs, now, live, abort, self._ended)
            return
        for o in outputs:
            if hook is not None:
                hook(o)
            req_id, index, finished = o
            entry = live.get(req_id)
            if entry is None:  # cancelled while this output was on its way (during the update's CPU time):
                # the client still receives it; the request stays cancelled
                ledger.on_token(ledger.wl.row_of(req_id), req_id, index, finished, now, None, abort)
                continue
            row, req, _buf = entry
            if ledger.on_token(row, req_id, index, finished, now, req.abort_after_tokens, abort):
                self._ended(req_id)

    def _launched(self, plan: StepPlan) -> None:
        """Requests in their first micro-batch are scheduled now (one cancelled after the schedule,
        before the launch, still counts: it was in the launched micro-batch)."""
        if not plan.num_prefill_tokens:  # a first micro-batch holds a prefill
            return
        now = self.backend.now()
        row_of, on_launch = self.ledger.wl.row_of, self.ledger.on_launch
        for it in plan.items:
            if it.start == 0:  # a request's first micro-batch starts at position 0
                on_launch(row_of(it.req_id), now)

    def run(self) -> Generator[Any, Any, None]:
        """Drive the core until every request of the client has ended."""
        be, client, observer = self.backend, self.client, self.observer
        before, after = self.before_action, self.after_action
        pool, series = self.kv_watch or (None, None)
        num_blocks, last_free = (pool.num_blocks, -1) if pool is not None else (0, -1)
        gen = self.core.run()
        reply: Any = None
        spins = 0
        while True:
            if before is not None:
                before()
            act = gen.send(reply)
            reply = None
            self.actions += 1
            if after is not None:
                after()
            if pool is not None and pool.num_free != last_free:  # the blocks in use changed since the last look
                last_free = pool.num_free
                used = num_blocks - last_free  # pool.num_used
                if used != series.kv_used:
                    series.sample_kv(be.now(), used)
            if observer is not None:
                observer(act)
            kind = type(act)
            if kind is Cpu:
                yield from be.cpu(act)
            elif kind is Launch:
                plan = act.plan
                if not plan.items and be.in_flight == 0:
                    spins += 1
                    if spins > MAX_IDLE_SPINS:
                        be.stalled(
                            "scheduler stalled: requests wait but none can be scheduled "
                            "(check max_num_batched_tokens and KV capacity)"
                        )
                else:
                    spins = 0
                    if plan.num_prefill_tokens:  # a first micro-batch holds a prefill
                        self._launched(plan)
                    if self.launched is not None and plan.items:
                        self.launched.append((self.stage, plan))
                be.launch(plan)
            elif kind is Await:
                yield from be.wait(act.plan)
            elif kind is Poll:
                reply = be.poll(act.plan)
            elif kind is Emit:
                self._emit(act.outputs)
            elif kind is Idle:
                if client.all_done:
                    return
                yield from be.idle()
                if client.all_done:
                    return
