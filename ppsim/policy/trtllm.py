"""TensorRT-LLM's PP executor: micro-batch slots and the sample-state ring.

Follows ``tensorrt_llm/_torch/pyexecutor/py_executor.py::PyExecutor._executor_loop_pp``: every
iteration schedules a micro-batch from the requests that are not in flight (``BatchStatePP`` in
slot ``microbatch_id``) and launches its forward, then handles the micro-batch launched
``pp - 1`` iterations earlier (``offset = 1 - pp_size`` on rank 0): it receives that batch's
sample state, relays it to the next rank along ``(pp-1) -> 0 -> 1 -> ... -> (pp-2)``, updates the
requests and emits responses. With the default relay at most ``pp`` micro-batches are in flight,
each with its own schedule and sample state.

``relay="sync"`` (default, ``TLLM_PP_ASYNC_BROADCAST_SAMPLE_STATE=0``) forwards the sample state
inline on the executor thread: its CPU time sits on the critical path, and the executor blocks on
the micro-batch launched ``pp - 1`` iterations earlier (``num_micro_batches = pp_size``).
``relay="async"`` hands the ring to a background thread and widens the window to
``num_micro_batches = max(pp_size, MIN_ASYNC_MICRO_BATCH_NUM)`` (1024) slots: the executor retires
whichever micro-batches' sample states have arrived and keeps scheduling the requests that are not
in flight (``inflight_req_ids``), blocking only when the window is full or nothing is schedulable.

Every micro-batch holds at most ``max_batch_size`` requests (the scheduler's per-batch cap);
``max_batch_size x pp`` requests are active at most (``PyTorchModelEngine.get_max_num_sequences``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

from ppsim.policy.actions import Action, Await, Cpu, Emit, Idle, Launch, Poll
from ppsim.policy.plan import StepPlan
from ppsim.policy.scheduler import Scheduler

MIN_ASYNC_MICRO_BATCH_NUM = 1024  # PyExecutor.MIN_ASYNC_MICRO_BATCH_NUM


def trtllm_micro_batches(pp: int, sync_relay: bool) -> int:
    """``PyExecutor.num_micro_batches``: ``pp`` with the inline relay, else ``max(pp, 1024)``."""
    return pp if sync_relay else max(pp, MIN_ASYNC_MICRO_BATCH_NUM)


class SlotRingCore:
    """Rank 0's view of the PyExecutor PP loop over ``num_slots`` micro-batch slots."""

    def __init__(self, scheduler: Scheduler, num_slots: int, inline_relay: bool = True, blocking: bool = True) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.scheduler = scheduler
        self.num_slots = num_slots
        self.inline_relay = inline_relay
        self.blocking = blocking  # sync relay: retire the slot launched num_slots - 1 iterations ago
        self.in_flight: deque[StepPlan] = deque()

    def run(self) -> Generator[Action, Any, None]:
        sched, slots = self.scheduler, self.in_flight
        while True:
            launched = False
            if sched.has_requests():
                plan = sched.schedule()
                yield Cpu("schedule", plan.num_reqs)
                if plan.items:
                    yield Launch(plan)
                    slots.append(plan)
                    launched = True
                elif not slots:
                    # nothing schedulable and nothing in flight: one idle iteration of the loop
                    yield Launch(plan)
                    yield Await(plan)
                    continue
            elif not slots:
                yield Idle()
                continue
            if not self.blocking:  # async relay: retire what has arrived, do not wait
                while slots:
                    arrived = yield Poll(slots[0])
                    if not arrived:
                        break
                    yield from self._handle(slots.popleft())
            if slots and (len(slots) >= self.num_slots or not launched):
                yield from self._handle(slots.popleft())

    def _handle(self, plan: StepPlan) -> Generator[Action, Any, None]:
        """Receive the batch's sample state, relay it around the ring, update and respond."""
        yield Await(plan)
        outs = self.scheduler.update_from_output(plan)
        yield Cpu("update", plan.num_reqs, plan.num_samples if self.inline_relay else 0)
        if outs:
            yield Emit(tuple(outs))
