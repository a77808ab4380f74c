"""Stage and link processes: a micro-batch flows stage 0 -> ... -> last, then back to the core.

A stage takes micro-batches in order. Before computing the next one it waits for its previous
send to finish (vLLM's worker waits on ``_pp_send_work`` before reusing buffers); the send itself
overlaps the stage's next compute otherwise. A link carries one send at a time, each taking
``cost.link_time(seam bytes)``. The last stage samples and returns the tokens to the engine core
after ``cost.return_time``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from ppsim.cost.base import CostModel, StageSpec
from ppsim.metrics.records import OpRecord
from ppsim.policy.plan import StepPlan


class PipelineSim:
    def __init__(
        self,
        env: simpy.Environment,
        stages: tuple[StageSpec, ...],
        cost: CostModel,
        seam_bytes: Callable[[int], float],
        ops: list[OpRecord],
    ) -> None:
        self.env, self.stages, self.cost, self.seam_bytes, self.ops = env, stages, cost, seam_bytes, ops
        self.inbox = [simpy.Store(env) for _ in stages]
        self.done: dict[int, simpy.Event] = {}
        self.in_flight = 0
        for st in stages:
            env.process(self._stage(st))

    def launch(self, plan: StepPlan) -> simpy.Event:
        ev = self.env.event()
        self.done[plan.step_id] = ev
        if plan.is_empty:
            self.env.timeout(self.cost.return_time(0)).callbacks.append(lambda _e: ev.succeed())
        else:
            self.in_flight += 1
            self.inbox[0].put(plan)
        return ev

    def _finish(self, plan: StepPlan) -> None:
        self.in_flight -= 1
        self.done[plan.step_id].succeed()

    def _stage(self, st: StageSpec) -> Generator[simpy.Event, Any, None]:
        env, cost, ops = self.env, self.cost, self.ops
        inbox = self.inbox[st.index]
        nxt = None if st.is_last else self.inbox[st.index + 1]
        track, link_track = f"stage{st.index}", f"link{st.index}->{st.index + 1}"
        send_done_at = 0.0
        while True:
            plan: StepPlan = yield inbox.get()
            if env.now < send_done_at:
                yield env.timeout(send_done_at - env.now)
            start = env.now
            yield env.timeout(cost.stage_time(st, plan))
            ops.append(
                OpRecord(track, "compute", plan.step_id, start, env.now, plan.num_tokens, plan.num_reqs,
                         plan.num_prefill_tokens, plan.num_decode_tokens)
            )
            if nxt is not None:
                nbytes = self.seam_bytes(plan.num_tokens)
                tx = cost.link_time(nbytes)
                send_done_at = env.now + tx
                ops.append(OpRecord(link_track, "send", plan.step_id, env.now, send_done_at, plan.num_tokens,
                                    plan.num_reqs, nbytes=nbytes))
                env.timeout(tx).callbacks.append(lambda _e, p=plan, box=nxt: box.put(p))
            else:
                env.timeout(cost.return_time(plan.num_reqs)).callbacks.append(lambda _e, p=plan: self._finish(p))
