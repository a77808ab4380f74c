"""The per-event reference pipeline: a micro-batch flows stage 0 -> ... -> last, then back to the core.

One SimPy process per stage, one event per compute, send and message. The simulator runs the
closed form of the same model (:mod:`ppsim.sim.fast`); this one is its reference (the equivalence
tests, ``simulate(..., reference=True)``), the pipeline of the bubble check, and the one a
serialized broadcast runs on.


A stage takes micro-batches in order. With vLLM's worker it waits for its previous send to finish
before computing the next one (``_pp_send_work`` is waited at the start of ``execute_model``), so a
send overlaps only the time until the next micro-batch arrives; with ``overlap_sends`` (SGLang,
TensorRT-LLM: they wait on the previous send only before the next send) the send overlaps the next
compute. A link carries one send at a time, each taking ``cost.link_time(seam bytes)``. Where the cost
model has a ``spread`` (a profile's ``stage_spread`` at PP > 1), each compute is ``stage_time`` times
``spread(stage, step id, gap)``: the live engine's step-to-step variation, drawn by the step alone (from a table
chosen by the gap since the stage's previous compute, as the idle charge reads it). A stage
past the first starts a compute no sooner than the cost model's ``turnaround_s`` (plus ``turnaround_per_req_s``
per request of the plan) after its previous one
ended (the live engine's stage loop between two computes, where the input was already there). Where
it has a ``corun_factor`` (a profile's ``stage_corun``, PP > 1), every compute of a micro-batch that
starts on the first stage while an earlier one has not finished its last stage times it: stages
computing at once on one host's cores slow each other. The last
stage samples and returns the tokens to the engine core after ``cost.return_time``.

A plan with ``deps`` (async scheduling) starts on the first stage only once the sampled tokens of
those steps are there: via the engine core (``token_path="core"``: when the core has them, plus
one ``return_time`` message back) or via the last stage's broadcast (``"broadcast"``, MRV2
``PPHandler``: one ``link_time`` after the last stage finishes). A serialized broadcast also holds
every stage's send channel for its duration, so the next compute on each stage waits for it.

``defer_outputs = d > 0`` (SGLang ``event_loop_pp`` with ``pp_async_batch_depth = d``): the last rank
sends a micro-batch's outputs only at its iteration ``d`` later, when it commits that iteration's
output work (``_pp_commit_send_output_work_and_preprocess_output_tensors`` with
``next_first_rank_mb_id = (mb_id + pp) % (pp + d)``), right after receiving that iteration's hidden
states. Plan step ids count the ring's iterations, so plan ``b``'s outputs leave when a plan with step
``>= b + d`` reaches the last stage; when the iterations between were empty (the last rank passes
them at once), they leave when the core waits for them (:meth:`PipelineSim.awaiting`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import simpy

from ppsim.cost.base import CostModel, StageSpec
from ppsim.metrics.records import OpRecord
from ppsim.policy.plan import StepPlan
from ppsim.policy.returnpath import sample_state_bytes


class PipelineSim:
    def __init__(
        self,
        env: simpy.Environment,
        stages: tuple[StageSpec, ...],
        cost: CostModel,
        seam_bytes: Callable[[int], float],
        ops: list[OpRecord],
        token_path: str = "core",
        broadcast_serialized: bool = False,
        overlap_sends: bool = False,
        defer_outputs: int = 0,
    ) -> None:
        self.env, self.stages, self.cost, self.seam_bytes, self.ops = env, stages, cost, seam_bytes, ops
        self.inbox = [simpy.Store(env) for _ in stages]
        self.done: dict[int, simpy.Event] = {}
        self.last_launch_arrival = 0.0
        self.in_flight = 0
        self.token_path = token_path
        self.broadcast_serialized = broadcast_serialized
        self.overlap_sends = overlap_sends
        self.token_ready: dict[int, simpy.Event] = {}  # step -> its sampled tokens are at the first stage
        self.track_tokens = False  # set by the executor when the policy schedules ahead of its tokens
        self.send_free = [0.0] * len(stages)  # when each stage's previous send (or broadcast) completes
        self.stage_end = [0.0] * len(stages)  # when each stage's previous compute ended (idle gaps)
        self.idle = cost.idle_time if getattr(cost, "has_idle", False) else None
        self.spread = getattr(cost, "spread", None)  # a profile's stage_spread: one ratio per (stage, step)
        self.turn = float(getattr(cost, "turnaround_s", 0.0) or 0.0)  # a profile's turnaround
        self.turn_req = float(getattr(cost, "turnaround_per_req_s", 0.0) or 0.0)  # and per request of the step
        self.turn_max = float(getattr(cost, "turnaround_max_reqs", math.inf))  # up to this many (part 25 (c))
        # a profile's stage_corun (PP > 1): the computes of a micro-batch that starts on the first stage while
        # an earlier one is still in the pipeline (not started on the last stage, or ending after now)
        self.corun = float(getattr(cost, "corun_factor", 1.0) or 1.0) if len(stages) > 1 else 1.0
        self.first_started = self.last_started = 0  # computes started on the first and on the last stage
        self.last_ends: deque[float] = deque()  # when the last stage's computes end, in order
        self.co: set[int] = set()  # steps started beside an earlier one
        self.defer_outputs = defer_outputs
        self.held: dict[int, StepPlan] = {}  # finished on the last stage, outputs not yet sent (deferral)
        self.last_arrived = -1  # newest step id that reached the last stage
        self.awaited: set[int] = set()  # steps the core waits for (their deferral has run out)
        for st in stages:
            env.process(self._stage(st))

    def _ready(self, step_id: int) -> simpy.Event:
        ev = self.token_ready.get(step_id)
        if ev is None:
            ev = self.token_ready[step_id] = self.env.event()
        return ev

    def _tokens_out(self, plan: StepPlan) -> None:
        """The last stage sampled ``plan``: route its tokens to the first stage (async policies only)."""
        env = self.env
        ready = self._ready(plan.step_id)
        if self.token_path == "broadcast":
            dt = self.cost.link_time(sample_state_bytes(plan.num_reqs))
            if self.broadcast_serialized:
                free = self.send_free
                end = max(env.now, *free) + dt
                for j in range(len(free)):
                    free[j] = end
                dt = end - env.now
            self.ops.append(OpRecord("broadcast", "broadcast", plan.step_id, env.now, env.now + dt, 0, plan.num_reqs))
        else:
            dt = 2 * self.cost.return_time(plan.num_reqs)  # to the engine core and back to stage 0
        env.timeout(dt).callbacks.append(lambda _e: ready.succeed())

    def launch(self, plan: StepPlan) -> simpy.Event:
        ev = self.env.event()
        self.done[plan.step_id] = ev
        if plan.is_empty:
            self.env.timeout(self.cost.return_time(0)).callbacks.append(lambda _e: ev.succeed())
        else:
            self.in_flight += 1
            # the control message to the first stage is in flight; messages arrive in order
            arrive = max(self.env.now + self.cost.launch_time(plan.num_reqs), self.last_launch_arrival)
            self.last_launch_arrival = arrive
            if arrive > self.env.now:
                self.env.timeout(arrive - self.env.now).callbacks.append(lambda _e, p=plan: self._put(0, p))
            else:
                self._put(0, plan)
        return ev

    def _put(self, index: int, plan: StepPlan) -> None:
        """Deliver ``plan`` to stage ``index``; reaching the last stage releases deferred outputs."""
        if index == len(self.stages) - 1 and self.defer_outputs:
            self.last_arrived = max(self.last_arrived, plan.step_id)
            for sid in [s for s in self.held if s + self.defer_outputs <= self.last_arrived]:
                self._send_output(self.held.pop(sid))
        self.inbox[index].put(plan)

    def _send_output(self, plan: StepPlan) -> None:
        """The last rank sends ``plan``'s outputs: they reach the core after ``return_time``."""
        self.awaited.discard(plan.step_id)
        self.env.timeout(self.cost.return_time(plan.num_reqs)).callbacks.append(lambda _e, p=plan: self._finish(p))

    def awaiting(self, step_id: int) -> None:
        """The core waits for ``step_id``'s outputs: the iterations up to its send have passed."""
        plan = self.held.pop(step_id, None)
        if plan is not None:
            self._send_output(plan)
        elif self.defer_outputs:
            self.awaited.add(step_id)

    def _finish(self, plan: StepPlan) -> None:
        self.in_flight -= 1
        self.done[plan.step_id].succeed()

    def _corun_check(self, step_id: int, now: float) -> None:
        """Mark ``step_id`` to compute beside an earlier micro-batch when one has not finished its last stage:
        not started there yet, or ending after ``now``."""
        ends = self.last_ends
        while ends and ends[0] <= now:  # the first stage starts in launch order: these are done for good
            ends.popleft()
        if self.first_started > self.last_started or ends:
            self.co.add(step_id)
        self.first_started += 1

    def _stage(self, st: StageSpec) -> Generator[simpy.Event, Any, None]:
        env, cost, ops = self.env, self.cost, self.ops
        inbox = self.inbox[st.index]
        nxt = None if st.is_last else self.inbox[st.index + 1]
        track, link_track = f"stage{st.index}", f"link{st.index}->{st.index + 1}"
        free, i = self.send_free, st.index
        while True:
            plan: StepPlan = yield inbox.get()
            if plan.deps and st.is_first:
                for d in plan.deps:
                    ev = self._ready(d)
                    if not ev.processed:
                        yield ev
            if env.now < free[i] and not self.overlap_sends:
                yield env.timeout(free[i] - env.now)
            turn = self.turn + self.turn_req * min(plan.num_reqs, self.turn_max)
            back = self.stage_end[i] + turn  # a stage past the first restarts no sooner than this
            if i and turn and self.stage_end[i] > 0.0 and env.now < back:
                yield env.timeout(back - env.now)
            start = env.now
            if st.is_first and self.corun != 1.0:
                self._corun_check(plan.step_id, start)
            dur = cost.stage_time(st, plan)
            if self.spread is not None:
                dur *= self.spread(st.index, plan.step_id, start - self.stage_end[i])
            if plan.step_id in self.co:
                dur *= self.corun
            if self.idle is not None:  # a step after the stage idled costs more (a profile's stage_idle)
                dur += self.idle(st, start - self.stage_end[i])
            if st.is_last and self.corun != 1.0:
                self.last_started += 1
                self.last_ends.append(start + dur)
                self.co.discard(plan.step_id)
            yield env.timeout(dur)
            self.stage_end[i] = env.now
            ops.append(
                OpRecord(
                    track,
                    "compute",
                    plan.step_id,
                    start,
                    env.now,
                    plan.num_tokens,
                    plan.num_reqs,
                    plan.num_prefill_tokens,
                    plan.num_decode_tokens,
                )
            )
            if nxt is not None:
                nbytes = self.seam_bytes(plan.num_tokens)
                begin = max(env.now, free[i])  # the link carries one send at a time
                free[i] = begin + cost.link_time(nbytes)
                ops.append(
                    OpRecord(
                        link_track, "send", plan.step_id, begin, free[i], plan.num_tokens, plan.num_reqs, nbytes=nbytes
                    )
                )
                env.timeout(free[i] - env.now).callbacks.append(lambda _e, p=plan, j=i + 1: self._put(j, p))
            else:
                if self.track_tokens and plan.num_samples:
                    self._tokens_out(plan)
                if (
                    self.defer_outputs
                    and plan.step_id + self.defer_outputs > self.last_arrived
                    and plan.step_id not in self.awaited
                ):
                    self.held[plan.step_id] = plan  # sent at the last rank's iteration step + d
                else:
                    self._send_output(plan)
