"""llama.cpp's layer-split pipeline: one process, ubatches over devices, ``n_copies`` buffer slots.

Follows ``src/llama-context.cpp::llama_context::decode`` and ``ggml/src/ggml-backend.cpp``
(``ggml_backend_sched_compute_splits``, ``n_copies``): ``llama-server`` builds one batch per
iteration (one token per generating slot, then prompt tokens, up to ``n_batch`` =
``max_num_batched_tokens``); ``llama_decode`` splits it into ubatches of ``n_ubatch`` tokens and
submits their graphs asynchronously, each ubatch using the next of ``n_copies`` copies of the
split inputs, so ubatch j + 1 runs on device 0 while ubatch j runs on device 1. ``llama_decode``
returns only after every ubatch is done (the logits are read), so iterations never overlap.

A batch of decodes (one token per sequence) fits in one ubatch: it does not pipeline, and the
bubble is 1 - 1/P. Model simplification: a copy slot is reused only after its previous ubatch
has left the last device, so at most ``n_copies`` ubatches are in flight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

from ppsim.policy.actions import Action, Await, Cpu, Emit, Idle, Launch
from ppsim.policy.plan import PlanItem, StepPlan, make_plan
from ppsim.policy.scheduler import Scheduler


def split_ubatches(items: tuple[PlanItem, ...], ubatch_tokens: int) -> list[list[PlanItem]]:
    """Cut a batch into ubatches of at most ``ubatch_tokens`` tokens, in order (``split_simple``).

    A prompt longer than the room left is cut into pieces; only the piece holding the item's last
    token samples.
    """
    if ubatch_tokens < 1:
        raise ValueError("ubatch_tokens must be >= 1")
    groups: list[list[PlanItem]] = []
    cur: list[PlanItem] = []
    room = ubatch_tokens
    for it in items:
        start, left = it.start, it.num_tokens
        while left:
            take = min(left, room)
            cur.append(PlanItem(it.req_id, start, take, it.is_prefill, it.samples and take == left, it.epoch))
            start, left, room = start + take, left - take, room - take
            if room == 0:
                groups.append(cur)
                cur, room = [], ubatch_tokens
    if cur:
        groups.append(cur)
    return groups


class UbatchPipelineCore:
    """One ``llama_decode`` per iteration; its ubatches pipeline across the devices."""

    def __init__(self, scheduler: Scheduler, ubatch_tokens: int, n_copies: int) -> None:
        if n_copies < 1:
            raise ValueError("n_copies must be >= 1")
        self.scheduler = scheduler
        self.ubatch_tokens = ubatch_tokens
        self.n_copies = n_copies
        self.next_id = 0  # ubatch ids: the scheduler's batch itself is never launched

    def _new_plan(self, items: list[PlanItem] | tuple[PlanItem, ...]) -> StepPlan:
        plan = make_plan(self.next_id, items)
        self.next_id += 1
        return plan

    def run(self) -> Generator[Action, Any, None]:
        sched = self.scheduler
        while True:
            if not sched.has_requests():
                yield Idle()
                continue
            batch = sched.schedule()
            yield Cpu("schedule", batch.num_reqs)
            if not batch.items:
                empty = self._new_plan(())
                yield Launch(empty)
                yield Await(empty)
                continue
            yield from self._decode(batch)
            outs = sched.update_from_output(batch)
            yield Cpu("update", batch.num_reqs)
            if outs:
                yield Emit(tuple(outs))

    def _decode(self, batch: StepPlan) -> Generator[Action, Any, None]:
        pending: deque[StepPlan] = deque()
        for group in split_ubatches(batch.items, self.ubatch_tokens):
            if len(pending) >= self.n_copies:
                yield Await(pending.popleft())
            ub = self._new_plan(group)
            yield Launch(ub)
            pending.append(ub)
        while pending:
            yield Await(pending.popleft())
