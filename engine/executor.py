"""The engine core: the shared driver (:mod:`ppsim.driver`) against real stage processes.

The driver runs the policy's engine-core generator, the client and the records, as in the
simulator; this backend supplies wall-clock time and the stage processes:

* ``Cpu``: nothing to wait (real CPU time passes inside the generator; it is recorded on the "core" track).
* ``Launch(plan)``: one :class:`StepMsg` per stage with the plan's items and their block tables
  (``pool.block_table``; a request cancelled since the schedule runs on the scratch block,
  :func:`block_table_for`); token ids to the first stage only. Non-blocking. Empty plans are done at once.
* ``Await(plan)``: block until the last stage's sampled tokens for ``plan`` arrive, watching for
  stage faults and for no progress within ``stage_timeout_s``.
* ``Poll(plan)``: drain arrived results without blocking; reply whether ``plan`` is back.
* ``Emit(outputs)``: keep the sampled token ids (the driver timestamps them, finishes or cancels requests).
* ``Idle``: wait for the next arrival.

The client is the simulator's (:class:`ppsim.driver.Client`): open loop at the workload's arrival
times, or a closed loop of ``max_concurrency`` outstanding requests, pumped here whenever the core
thread is free or waiting, so a request that arrives while the core blocks is seen at its next
schedule, as in the simulator. Times are seconds since the engine start (``time.perf_counter`` of this process).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from engine.launcher import StageFault, StageGroup
from engine.transport import DataPath, Flush, SampledMsg, StageTimes, StepItem, StepMsg
from ppsim.cost.ring import RingReturnCost
from ppsim.deployment import Prepared
from ppsim.driver import Client, Driver
from ppsim.metrics.ledger import Ledger
from ppsim.metrics.records import OpRecord, RequestRecord
from ppsim.metrics.series import SeriesRecorder
from ppsim.policy.actions import Cpu
from ppsim.policy.kv import BlockPool
from ppsim.policy.pipelines import build_core, pipe_options
from ppsim.policy.plan import PlanItem, StepPlan
from ppsim.policy.requests import TokenOutput


def block_table_for(pool: BlockPool, it: PlanItem, live: bool, scratch_block: int) -> tuple[int, ...]:
    """The block table the stages get for ``it``: its request's own, or, for a request cancelled
    between the plan's schedule and its launch (the driver takes the client's cancellations before
    every action, so its blocks are already freed), the scratch block for its whole context. The
    stages run its tokens anyway, as the simulator charges them and as vLLM runs a batch whose request
    was aborted after it was scheduled; their keys and values go to a block no request holds."""
    if live:
        return tuple(pool.block_table(it.req_id))
    return (scratch_block,) * pool.blocks_for(it.start + it.num_tokens)


def data_path(prep: Prepared) -> DataPath:
    """The policy's data path, as the simulator models it: its pipe options and its return cost."""
    opts = pipe_options(prep.knobs())
    return DataPath(
        opts.overlap_sends,
        opts.token_path,
        opts.broadcast_serialized,
        ring_return=isinstance(prep.cost, RingReturnCost),
        defer_outputs=opts.defer_outputs,
    )


WAIT_SLICE_S = 0.2  # longest single wait on the result queue before re-checking clients and faults
# A queue wait's timeout is rounded up to whole milliseconds (``select.poll``), which made the core add
# a request 0.65-0.98 ms after its arrival time (median, validation traces). So the core waits on the
# queue until POLL_GRAIN_S before the next arrival, then in FINE_SLEEP_S sleeps, checking the queue.
POLL_GRAIN_S = 0.0015
FINE_SLEEP_S = 0.0002


@dataclass
class EngineResult:
    requests: list[RequestRecord]
    ops: list[OpRecord]
    tokens: dict[int, list[int]]  # request id -> generated token ids
    num_preemptions: int
    peak_blocks_used: int
    blocks_used_at_end: int
    end_s: float
    fault: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    series: SeriesRecorder | None = None  # down-sampled busy/KV series and the timeline window
    actions: list = field(default_factory=list)  # (stage, plan) launched, in order (actions.csv)
    loop: list = field(default_factory=list)  # the stage loop around each compute (stage_loop.csv: LOOP_FIELDS)


class EngineExecutor:
    """The live engine's backend for :class:`ppsim.driver.Driver`: real stage processes, wall-clock time."""

    def __init__(
        self,
        prep: Prepared,
        group: StageGroup,
        prompts: dict[int, list[int]],
        stage_timeout_s: float,
        clock_offsets: list[float],
        path: DataPath | None = None,
    ) -> None:
        self.prep, self.group, self.prompts = prep, group, prompts
        self.stage_timeout_s = stage_timeout_s
        self.offsets = clock_offsets  # add to a stage's perf_counter reading to get this process's
        self.num_stages = len(prep.topology.stages)
        self.pool = prep.block_pool()
        self.scratch_block = prep.num_blocks  # the stages' caches hold one block beyond the pool's (stage_configs)
        core = build_core(prep.knobs(), self.pool)
        self.scheduler = core.scheduler
        self.ledger = Ledger(prep.requests, keep_tokens=True)
        self.client = Client(prep.requests, prep.scenario.workload.max_concurrency)
        self.driver = Driver(core, self.ledger, self.client, self)
        self.driver.on_output = self._on_output
        self.driver.before_action = self._before_action
        self.driver.launched = []  # actions.csv: the plans launched, to diff against the simulator's
        self.t_action = 0.0  # when the core last started to run (a Cpu action's start)
        self.tokens: dict[int, list[int]] = {r: [] for r in prep.requests.req_id.tolist()}
        self.launched: dict[int, StepPlan] = {}
        self.done: dict[int, dict[int, int]] = {}
        self.ready_tokens: dict[int, int] = {}
        self.in_flight = 0
        self.last_progress = 0.0
        self.stage_times: list[list[StageTimes]] = [[] for _ in range(self.num_stages)]
        self.core_ops: list[OpRecord] = []
        self.aborts: list[tuple[float, int]] = []  # heap of (abort time, request id) of sent requests
        # async scheduling: (request, epoch, position) -> step that samples the token at that position
        self.path = path if path is not None else data_path(prep)  # what the stages were started with
        self.async_tokens = bool(getattr(self.scheduler.limits, "async_placeholders", False))
        # the core forwards sampled tokens to the first stage only on vLLM V1's path (MRV2 broadcasts them)
        self.forward_sampled = self.async_tokens and self.path.token_path == "core"
        self.returned_by: dict[int, int] = {}  # rank -> micro-batches whose tokens it handed to the core
        self.stage_stats: dict[str, int] = {}  # counters the stages report (the ring's deferred outputs)
        self.num_forwarded = 0  # sampled-token messages the core forwarded to the first stage
        self.flushed: set[int] = set()  # deferred ring return: steps the last stage was told the core waits for
        self.sampled_by: dict[tuple[int, int, int], int] = {}
        self.num_holes = 0  # input tokens the first stage filled from forwarded samples
        last = (float(prep.requests.arrival_s.max()),) if len(prep.requests) else ()
        self.series = SeriesRecorder.for_run(self.num_stages, last)
        self.driver.after_action = lambda: self.series.sample_kv(self.now(), self.pool.num_used)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    # --- client ----------------------------------------------------------------------------------
    def _pump_client(self) -> None:
        now = self.now()
        client = self.client
        while (t := client.next_arrival_s()) is not None and t <= now:
            row, req = client.take()
            self.driver.submit(row, req, now)
        while self.aborts and self.aborts[0][0] <= now:
            self.driver.abort(heapq.heappop(self.aborts)[1], now)

    def _before_action(self) -> None:
        self._pump_client()
        self.t_action = self.now()

    def abort_after(self, delay_s: float, req_id: int, sent_s: float) -> None:
        heapq.heappush(self.aborts, (sent_s + delay_s, req_id))

    def _next_due_s(self) -> float | None:
        nxt = self.client.next_arrival_s()
        due = [nxt] if nxt is not None else []
        if self.aborts:
            due.append(self.aborts[0][0])
        return min(due) if due else None

    # --- results from the stages ----------------------------------------------------------------
    def on_message(self, msg: tuple) -> None:
        if msg[0] == "tokens":
            _, step_id, req_ids, toks, rank = msg
            self.done[step_id] = dict(zip(req_ids, toks, strict=True))
            self.returned_by[rank] = self.returned_by.get(rank, 0) + 1
            if self.forward_sampled and req_ids:
                self.group.send(0, SampledMsg(step_id, tuple(zip(req_ids, toks, strict=True))))
                self.num_forwarded += 1
            self.in_flight -= 1
            self.last_progress = self.now()
        elif msg[0] == "stats":  # a stage's data-path counters, at the end
            self.stage_stats.update(msg[2])
        elif msg[0] == "ops":
            self.stage_times[msg[1]].extend(msg[2])

    def _pump(self, timeout_s: float) -> None:
        """Handle result messages for up to ``timeout_s`` (0: only those already here)."""
        msg = self.group.get(timeout_s)
        while msg is not None:
            self.on_message(msg)
            msg = self.group.get(0)
        self._pump_client()
        if self.in_flight and self.now() - self.last_progress > self.stage_timeout_s:
            raise StageFault(f"no micro-batch came back for {self.stage_timeout_s:.3g} s: a stage stalled")

    def _wait_slice(self) -> float:
        """How long the next queue wait may block: until shortly before the next arrival or abort; within
        ``POLL_GRAIN_S`` of it, sleep ``FINE_SLEEP_S`` here and return 0 (a non-blocking check)."""
        due = self._next_due_s()
        if due is None:
            return WAIT_SLICE_S
        left = due - self.now()
        if left > POLL_GRAIN_S:
            return min(WAIT_SLICE_S, left - POLL_GRAIN_S)
        if left > 0:
            time.sleep(min(left, FINE_SLEEP_S))
        return 0.0

    # --- the driver's backend --------------------------------------------------------------------
    def wait(self, plan: StepPlan) -> Generator[None, None, None]:
        if self.path.defer_outputs and self.num_stages > 1 and plan.step_id not in self.done:
            if plan.step_id not in self.flushed:  # SGLang: the core waits for it, so the last rank sends it
                self.flushed.add(plan.step_id)
                self.group.send(self.num_stages - 1, Flush(plan.step_id))
        while plan.step_id not in self.done:
            self._pump(self._wait_slice())
        self.flushed.discard(plan.step_id)
        self.ready_tokens.update(self.done.pop(plan.step_id))
        yield from ()

    def poll(self, plan: StepPlan) -> bool:
        self._pump(0)
        return plan.step_id in self.done

    def cpu(self, act: Cpu) -> Generator[None, None, None]:
        """Real CPU time passed inside the core's generator: record it on the "core" track."""
        self.core_ops.append(OpRecord("core", act.kind, -1, self.t_action, self.now(), 0, act.n))
        yield from ()

    def idle(self) -> Generator[None, None, None]:
        """Wait for the next arrival."""
        while self.client.pending and not self.scheduler.has_requests():
            if self._next_due_s() is None and not self.in_flight:
                raise StageFault("client stalled: requests remain but none can be sent")
            self._pump(self._wait_slice())
        yield from ()

    def stalled(self, message: str) -> None:
        raise StageFault(message.split(" (")[0])

    def launch(self, plan: StepPlan) -> None:
        if plan.is_empty:
            self.done[plan.step_id] = {}
            return
        now = self.now()
        items, ids, holes = [], [], []
        live, pool, scratch = self.driver.live, self.pool, self.scratch_block
        for it in plan.items:
            table = block_table_for(pool, it, it.req_id in live, scratch)
            items.append(StepItem(it.req_id, it.start, it.num_tokens, it.samples, table))
            seq = self.prompts[it.req_id] + self.tokens[it.req_id]
            for pos in range(it.start, it.start + it.num_tokens):
                if pos >= len(seq):  # async scheduling: sampled by an earlier step, maybe still in flight
                    holes.append((len(ids), self.sampled_by.pop((it.req_id, it.epoch, pos)), it.req_id))
                ids.append(seq[pos] if pos < len(seq) else -1)
            if it.samples and self.async_tokens:
                self.sampled_by[(it.req_id, it.epoch, it.start + it.num_tokens)] = plan.step_id
        items_t = tuple(items)
        self.num_holes += len(holes)
        self.group.send(0, StepMsg(plan.step_id, items_t, tuple(ids), tuple(holes)))
        for r in range(1, self.num_stages):
            self.group.send(r, StepMsg(plan.step_id, items_t))
        self.launched[plan.step_id] = plan
        if not self.in_flight:
            self.last_progress = now
        self.in_flight += 1

    def _on_output(self, o: TokenOutput) -> None:
        """A sampled token reached the core: keep its id (the driver then timestamps it)."""
        req_id, index, _finished = o
        self.tokens[req_id].append(self.ready_tokens.pop(req_id))
        if self.async_tokens:  # known now: later launches read it from self.tokens
            st = self.scheduler.requests.get(req_id)
            if st is not None:
                n_in = st.req.prompt_len
                self.sampled_by.pop((req_id, st.epoch, n_in + index - 1), None)

    def run(self) -> None:
        """Drive the core until every request has ended (raises StageFault on a fault)."""
        self.t0 = time.perf_counter()
        for _ in self.driver.run():
            raise RuntimeError("the engine's backend never yields")

    # --- records ---------------------------------------------------------------------------------
    def _stage_ops(self) -> list[OpRecord]:
        ops: list[OpRecord] = []
        seam = self.prep.shape.seam_bytes
        recv_at: list[dict[int, float]] = [{t.step_id: t.recv_done_s for t in ts} for ts in self.stage_times]
        for rank, ts in enumerate(self.stage_times):
            rel = self.offsets[rank] - self.t0
            for t in ts:
                p = self.launched.get(t.step_id)
                if p is None:
                    continue
                ops.append(
                    OpRecord(
                        f"stage{rank}",
                        "compute",
                        p.step_id,
                        t.start_s + rel,
                        t.end_s + rel,
                        p.num_tokens,
                        p.num_reqs,
                        p.num_prefill_tokens,
                        p.num_decode_tokens,
                    )
                )
                got = recv_at[rank + 1].get(t.step_id, -1.0) if rank + 1 < self.num_stages else -1.0
                if t.send_start_s >= 0 and got >= 0:
                    end = got + self.offsets[rank + 1] - self.t0
                    ops.append(
                        OpRecord(
                            f"link{rank}->{rank + 1}",
                            "send",
                            p.step_id,
                            t.send_start_s + rel,
                            end,
                            p.num_tokens,
                            p.num_reqs,
                            nbytes=seam(p.num_tokens),
                        )
                    )
        ops.sort(key=lambda o: (o.start_s, o.track))
        return ops

    def _stage_loop(self) -> list[tuple]:
        """``LOOP_FIELDS`` rows: every stage compute of a launched step with the loop's readings around it,
        its clock readings made engine-relative as the stage ops' are."""
        rows = []
        for rank, ts in enumerate(self.stage_times):
            rel = self.offsets[rank] - self.t0

            def at(x: float, rel: float = rel) -> float:
                return x + rel if x >= 0 else -1.0

            for t in ts:
                p = self.launched.get(t.step_id)
                if p is None:
                    continue
                times = (at(t.ready_s), at(t.recv_done_s), at(t.start_s), at(t.end_s))
                loop = (t.ctrl_s, t.out_s, t.out_cpu_s, t.out_switched, t.cpu_s, t.preempted)
                rows.append((rank, t.step_id, p.num_tokens, p.num_reqs, *times, *loop))
        rows.sort(key=lambda r: (r[6], r[0]))
        return rows

    def result(self, fault: str | None = None) -> EngineResult:
        self.driver.finish()
        self.ledger.close()
        ops = self._stage_ops() + self.core_ops
        self.series.add_ops(sorted(ops, key=lambda o: o.start_s))  # stage times arrive only as messages
        ends = [o.end_s for o in ops] + [f for f in self.ledger.finish if f == f]
        self.series.close(max(ends, default=0.0))
        return EngineResult(
            self.ledger.records(),
            ops,
            self.tokens,
            self.scheduler.num_preemptions,
            self.pool.peak_used,
            self.pool.num_used,
            self.now(),
            fault,
            {
                "async_filled_tokens": self.num_holes,
                "num_steps_launched": len(self.launched),
                "data_path": dataclasses.asdict(self.path),
                "outputs_returned_by_rank": self.returned_by,
                "sampled_forwarded_by_core": self.num_forwarded,
                **self.stage_stats,
            },
            self.series,
            self.driver.launched or [],
            self._stage_loop(),
        )
