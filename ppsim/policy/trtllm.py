"""TensorRT-LLM's PP executor: ``num_micro_batches = pp`` slots and the sample-state ring.

Follows ``tensorrt_llm/_torch/pyexecutor/py_executor.py::PyExecutor._executor_loop_pp``: every
iteration schedules a micro-batch from the requests that are not in flight (``BatchStatePP`` in
slot ``microbatch_id``) and launches its forward, then handles the micro-batch launched
``pp - 1`` iterations earlier (``offset = 1 - pp_size`` on rank 0): it receives that batch's
sample state, relays it to the next rank along ``(pp-1) -> 0 -> 1 -> ... -> (pp-2)``, updates the
requests and emits responses. So at most ``pp`` micro-batches are in flight, each with its own
schedule and sample state.

``relay="sync"`` (default, ``TLLM_PP_ASYNC_BROADCAST_SAMPLE_STATE=0``) forwards the sample state
inline on the executor thread: its CPU time sits on the critical path before the next schedule.
``relay="async"`` hands the forward to a relay thread (with a larger micro-batch window,
``MIN_ASYNC_MICRO_BATCH_NUM``) so the executor thread only waits for the state to arrive. In this
model the larger window changes buffer reuse, not which batch is handled, so it is not a knob.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

from ppsim.policy.actions import Action, Await, Cpu, Emit, Idle, Launch
from ppsim.policy.plan import StepPlan
from ppsim.policy.scheduler import Scheduler


class SlotRingCore:
    """Rank 0's view of the PyExecutor PP loop over ``num_slots`` micro-batch slots."""

    def __init__(self, scheduler: Scheduler, num_slots: int, inline_relay: bool = True) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.scheduler = scheduler
        self.num_slots = num_slots
        self.inline_relay = inline_relay
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
            if slots and (len(slots) >= self.num_slots or not launched):
                yield from self._handle(slots.popleft())

    def _handle(self, plan: StepPlan) -> Generator[Action, Any, None]:
        """Receive the batch's sample state, relay it around the ring, update and respond."""
        yield Await(plan)
        outs = self.scheduler.update_from_output(plan)
        yield Cpu("update", plan.num_reqs, plan.num_samples if self.inline_relay else 0)
        if outs:
            yield Emit(tuple(outs))
