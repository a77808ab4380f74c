"""The fast pipeline: a micro-batch's whole path is computed when it is launched; one SimPy event each.

Same model as the per-event reference (:mod:`ppsim.sim.pipeline`, read its docstring), computed in
closed form. Every stage takes micro-batches in launch order and every link carries one send at a
time in that order, so when micro-batch m is launched every earlier micro-batch's path is already
known and, stage by stage::

    start[m][s] = max(arrival[m][s], end[m-1][s] [+ turnaround if s > 0], token_ready(deps) if s == 0,
                      send_free[s] unless sends overlap compute)
    end[m][s]   = start[m][s] + stage_time(s, m) [x spread(s, m, gap)] [x corun if co[m]]
                  [+ idle_time(s, start[m][s] - end[m-1][s])]
    co[m]       = some end[j][last] > start[m][0], j < m     (an earlier micro-batch still in the pipeline)
    send[m][s]  = [max(end[m][s], send_free[s]), + link_time)   -> arrival[m][s+1] = its end
    return      = end[m][last] + return_time            (the one SimPy event: ``done``)

``arrival[m][0]`` is when the launch control message lands (messages arrive in order, hence
``last_launch_arrival``); a plan with ``deps`` starts on the first stage only once those steps'
sampled tokens are there (``token_ready``: via the core, two return messages after the last stage;
or via an overlapped broadcast, one ``link_time``). The serialized MRV2 broadcast holds every
stage's send channel at the moment the last stage finishes, interleaving with later micro-batches'
sends in time order rather than launch order; that one case runs on the reference pipeline
(:func:`needs_reference`).

SGLang's output deferral (``defer_outputs = d > 0``, see the reference's docstring) is closed-form
too, but its release is known only later: plan ``b``'s outputs leave the last rank at
``max(end[b][last], min(arrival[p][last], await_b))``, where ``p`` is the first later plan with step
``>= b + d`` and ``await_b`` is when the core waits for ``b``. So a deferred plan's ``done`` is
scheduled when the first of the two is known (``p``'s launch, or the core's wait); a wait that comes
before ``p`` reaches the last stage schedules an earlier return, and the first to fire wins.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import simpy

from ppsim.cost.base import CostModel, StageSpec
from ppsim.policy.plan import StepPlan
from ppsim.policy.returnpath import sample_state_bytes

PRUNE_EVERY = 256  # launches between drops of token-ready times already in the past


class EmptyDone:
    """An empty plan's completion without outputs deferred: the timeout of its return message, and the
    event a waiter yields, made only when it can be observed (:meth:`FastPipeline._empty_fire`; the
    timeout carries this object as its value, so no closure is made per plan).

    The completion event of the per-event model is succeeded when the timeout fires and processed at
    its next turn; when nothing else is due at that time, nothing can run in between, so a later
    waiter always finds it processed (and goes on at once): then no event is made at all."""

    __slots__ = ("triggered", "ev")

    def __init__(self) -> None:
        self.triggered = False  # the timeout fired (its event, if any, succeeded then)
        self.ev: simpy.Event | None = None

    def wait(self, env: simpy.Environment) -> tuple[simpy.Event, ...]:
        """What a waiter yields: the event (made now if the timeout has not fired), or nothing."""
        if not self.triggered and self.ev is None:
            self.ev = env.event()
        return () if self.ev is None else (self.ev,)


def needs_reference(broadcast_serialized: bool) -> bool:
    """True when the closed form does not hold (a serialized broadcast, see the module docstring)."""
    return broadcast_serialized


class FastPipeline:
    """Drop-in for :class:`ppsim.sim.pipeline.PipelineSim` (``launch``, ``done``, ``in_flight``)."""

    def __init__(
        self,
        env: simpy.Environment,
        stages: tuple[StageSpec, ...],
        cost: CostModel,
        seam_bytes: Callable[[int], float],
        ops: Any,
        token_path: str = "core",
        broadcast_serialized: bool = False,
        overlap_sends: bool = False,
        defer_outputs: int = 0,
    ) -> None:
        if needs_reference(broadcast_serialized):
            raise ValueError("a serialized broadcast needs the reference pipeline")
        self.env, self.stages, self.cost, self.seam_bytes, self.ops = env, stages, cost, seam_bytes, ops
        self.done: dict[int, simpy.Event] = {}
        self.last_launch_arrival = 0.0
        self.in_flight = 0
        self.token_path = token_path
        self.overlap_sends = overlap_sends
        self.track_tokens = False  # set by the executor when the policy schedules ahead of its tokens
        n = len(stages)
        self.stage_free = [0.0] * n  # when each stage finishes its latest micro-batch
        self.send_free = [0.0] * n  # when each stage's latest send completes
        self.token_ready: dict[int, float] = {}  # step -> its sampled tokens are at the first stage
        self.tracks = [(f"stage{s.index}", f"link{s.index}->{s.index + 1}") for s in stages]
        self.launches = 0
        # every stage's time of a plan in one call, where the cost model has it (the same values)
        self.stage_times = getattr(cost, "stage_times", None)
        # a step after the stage idled costs more (a profile's stage_idle): gap = start - previous end
        self.idle = cost.idle_time if getattr(cost, "has_idle", False) else None
        # each compute drawn from the live engine's step-to-step spread (a profile's stage_spread, PP > 1)
        self.spread = getattr(cost, "spread", None)
        # a stage past the first restarts no sooner than this after its previous compute (a profile's turnaround)
        self.turn = float(getattr(cost, "turnaround_s", 0.0) or 0.0)
        self.turn_req = float(getattr(cost, "turnaround_per_req_s", 0.0) or 0.0)  # and per request of the plan
        self.turn_max = float(getattr(cost, "turnaround_max_reqs", math.inf))  # up to this many (part 25 (c))
        # stages computing at once slow each other (a profile's stage_corun, PP > 1): every compute of a
        # micro-batch that starts on the first stage while an earlier one is still in the pipeline times this
        self.corun = float(getattr(cost, "corun_factor", 1.0) or 1.0) if n > 1 else 1.0
        self.last_ends: deque[float] = deque()  # last-stage ends of earlier micro-batches, in order
        self.messages: dict[int, tuple[float, float]] = {}  # requests -> (launch_time, return_time)
        self.seams: dict[int, tuple[float, float]] = {}  # tokens -> (seam bytes, link time)
        self.ret0: float | None = None  # an empty plan's return message (a pure function of the count)
        self.defer_outputs = defer_outputs
        self.arrive_last = 0.0  # when the latest micro-batch reaches the last stage
        self.held: dict[int, tuple[StepPlan, float]] = {}  # deferred, not yet released: (plan, end on last)
        self.sends: dict[int, tuple[StepPlan, float, float]] = {}  # released: (plan, end on last, send time)
        self.on_return, self.on_empty_return = self._finish, self._empty_fire  # bound once

    def _finish(self, to: simpy.Timeout) -> None:
        """A return message's timeout fired: its plan's completion event (the timeout's value) succeeds.

        Succeeded, it would be processed at its turn; when nothing else is due now, its turn is the
        very next, and nothing can run in between: then it is processed here, as
        ``Environment.step`` would (its waiters resume), without a trip through the event queue."""
        ev = to._value
        if ev.triggered:  # a deferred plan whose earlier release has already fired
            return
        self.in_flight -= 1
        q = self.env._queue
        if q and q[0][0] <= self.env._now:  # something else is due now: the event takes its turn
            ev.succeed()
            return
        ev._ok, ev._value = True, None  # ev.succeed() and its processing by Environment.step
        callbacks, ev.callbacks = ev.callbacks, None
        for callback in callbacks:
            callback(ev)

    def _empty_fire(self, to: simpy.Timeout) -> None:
        """An empty plan's return message arrived (its :class:`EmptyDone` is the timeout's value)."""
        done = to._value
        done.triggered = True
        ev = done.ev
        if ev is None:
            q = self.env._queue
            if not q or q[0][0] > self.env._now:
                return  # nothing else is due now: its event would be processed next, unobserved
            ev = done.ev = self.env.event()  # something due now may observe it before its turn
        ev.succeed()

    def launch(self, plan: StepPlan) -> simpy.Event:
        env, cost = self.env, self.cost
        if not plan.items:  # empty
            if self.ret0 is None:
                self.ret0 = cost.return_time(0)
            if not self.defer_outputs:
                done = self.done[plan.step_id] = EmptyDone()
                to = env.timeout(self.ret0, done)
                to.callbacks.append(self.on_empty_return)
                return to
            to = env.timeout(self.ret0)
            ev = self.done[plan.step_id] = env.event()
            to.callbacks.append(lambda _e: ev.succeed())
            return ev
        ev = env.event()
        self.done[plan.step_id] = ev
        self.in_flight += 1
        now = env._now  # env.now
        n_req = len(plan.items)
        msg = self.messages.get(n_req)
        if msg is None:  # pure functions of the request count
            msg = self.messages[n_req] = (cost.launch_time(n_req), cost.return_time(n_req))
        arrive = max(now + msg[0], self.last_launch_arrival)
        self.last_launch_arrival = arrive
        end = self._path(plan, arrive)
        if self.defer_outputs:
            self._defer(plan, end)
        else:
            ret = end + msg[1]
            env.timeout(ret - now, ev).callbacks.append(self.on_return)
        self.launches += 1
        if self.launches % PRUNE_EVERY == 0 and self.token_ready:
            # a ready time at or before now can never delay a later start (every start is >= now)
            self.token_ready = {k: v for k, v in self.token_ready.items() if v > now}
        return ev

    def _defer(self, plan: StepPlan, end: float) -> None:
        """``plan`` reaches the last stage at ``arrive_last``: it releases the outputs held ``d`` steps
        or more before it; its own wait for a later plan (or for the core's wait)."""
        arrive, d = self.arrive_last, self.defer_outputs
        for sid in [s for s in self.held if s + d <= plan.step_id]:
            held, held_end = self.held.pop(sid)
            self._send(held, held_end, arrive)
        self.held[plan.step_id] = (plan, end)

    def _send(self, plan: StepPlan, end: float, release: float) -> None:
        """The last rank sends ``plan``'s outputs at ``max(end, release)``; they reach the core one
        ``return_time`` later."""
        send = end if end > release else release
        self.sends[plan.step_id] = (plan, end, send)
        ret = send + self.cost.return_time(plan.num_reqs)
        self.env.timeout(ret - self.env.now, self.done[plan.step_id]).callbacks.append(self.on_return)

    def awaiting(self, step_id: int) -> None:
        """The core waits for ``step_id``'s outputs: a deferred send leaves now (or when the plan ends)."""
        if not self.defer_outputs:
            return
        now = self.env.now
        held = self.held.pop(step_id, None)
        if held is not None:
            self._send(held[0], held[1], now)
            return
        sent = self.sends.pop(step_id, None)
        if sent is not None and sent[2] > max(sent[1], now) and not self.done[step_id].triggered:
            # released by a later plan whose arrival at the last stage is still ahead: the wait is first
            self._send(sent[0], sent[1], now)

    def _path(self, plan: StepPlan, t: float) -> float:
        """Times ``plan`` through every stage from its arrival ``t`` at the first; returns the last end."""
        cost, ops, stage_free, send_free = self.cost, self.ops, self.stage_free, self.send_free
        step, n_tok, n_req = plan.step_id, plan.num_tokens, len(plan.items)
        n_pre, n_dec = plan.num_prefill_tokens, plan.num_decode_tokens
        end = t
        nbytes = link = 0.0
        if len(self.stages) > 1:  # every seam carries the same bytes (pure functions of the token count)
            seam = self.seams.get(n_tok)
            if seam is None:
                nbytes = self.seam_bytes(n_tok)
                seam = self.seams[n_tok] = (nbytes, cost.link_time(nbytes))
            nbytes, link = seam
        batched = self.stage_times
        times = batched(self.stages, plan) if batched is not None else None
        turn, corun = self.turn + self.turn_req * (n_req if n_req < self.turn_max else self.turn_max), self.corun
        co = False
        for st in self.stages:
            i = st.index
            free = stage_free[i]
            if turn and i and free > 0.0:
                free += turn
            start = t if t > free else free
            if i == 0 and plan.deps:
                ready = self.token_ready
                for d in plan.deps:
                    r = ready.get(d)
                    if r is not None and r > start:
                        start = r
            if st.is_last:
                self.arrive_last = t
            if not self.overlap_sends and start < send_free[i]:
                start = send_free[i]
            if i == 0 and corun != 1.0:  # an earlier micro-batch still in the pipeline: they compute at once
                ends = self.last_ends
                while ends and ends[0] <= start:  # stage 0 starts in launch order: these are done for good
                    ends.popleft()
                co = bool(ends)
            dur = times[i] if times is not None else cost.stage_time(st, plan)
            gap = start - stage_free[i]  # since the stage's previous compute: the spread's table, the idle charge
            if self.spread is not None:
                dur *= self.spread(i, step, gap)
            if co:
                dur *= corun
            if self.idle is not None:
                dur += self.idle(st, gap)
            end = start + dur
            stage_free[i] = end
            track, link_track = self.tracks[i]
            ops.add_compute(track, step, start, end, n_tok, n_req, n_pre, n_dec)
            if not st.is_last:
                begin = end if end > send_free[i] else send_free[i]
                t = send_free[i] = begin + link
                ops.add_other(link_track, "send", step, begin, t, n_tok, n_req, nbytes)
            elif self.track_tokens and plan.num_samples:
                self._tokens_out(plan, end)
        if corun != 1.0:
            self.last_ends.append(end)
        return end

    def _tokens_out(self, plan: StepPlan, end: float) -> None:
        if self.token_path == "broadcast":
            dt = self.cost.link_time(sample_state_bytes(plan.num_reqs))
            self.ops.add("broadcast", "broadcast", plan.step_id, end, end + dt, 0, plan.num_reqs, 0, 0, 0.0)
        else:
            dt = 2 * self.cost.return_time(plan.num_reqs)  # to the engine core and back to stage 0
        self.token_ready[plan.step_id] = end + dt
