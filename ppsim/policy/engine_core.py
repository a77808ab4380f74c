"""Engine-core loops: vLLM V1 ``step`` (sync) and ``step_with_batch_queue``.

Follows ``vllm/v1/engine/core.py::EngineCore.step_with_batch_queue``: when there are requests,
schedule and launch a batch without waiting (an empty schedule still takes a queue slot, as in
vLLM); return early only if the batch executed something, the queue has room and the oldest
in-flight batch is not done; otherwise block on the *oldest* batch and update the scheduler from
its output. Requests that arrive while the core blocks are seen at its next schedule. Queue depth
``max_concurrent_batches`` is the pp size (1 for the synchronous ``step``).

With ``relay`` the scheduler pays the sampled-token return path on its own CPU every step
(``vllm/v1/core/sched/scheduler.py::Scheduler._make_cached_request_data``: with ``use_pp`` the new
token ids of every cached request are copied into the step's ``CachedRequestData``), see
:mod:`ppsim.policy.returnpath`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any

from ppsim.policy.actions import Action, Await, Cpu, Emit, Idle, Launch, Poll
from ppsim.policy.plan import StepPlan
from ppsim.policy.returnpath import relay_tokens
from ppsim.policy.scheduler import Scheduler

_tuple_new = tuple.__new__  # the per-step actions (named tuples) built without a Python-level __new__


class BatchQueueCore:
    """One engine core over one scheduler with a batch queue of ``depth`` micro-batches."""

    def __init__(self, scheduler: Scheduler, depth: int, relay: bool = False) -> None:
        if depth < 1:
            raise ValueError("batch queue depth must be >= 1")
        self.scheduler = scheduler
        self.depth = depth
        self.relay = relay
        self.queue: deque[StepPlan] = deque()
        self._cpu: dict[tuple[str, int, int], Cpu] = {}  # actions are immutable values: one of each, reused

    def run(self) -> Generator[Action, Any, None]:
        sched, queue, depth, relay, cpu_actions = self.scheduler, self.queue, self.depth, self.relay, self._cpu
        while True:
            if sched.waiting or sched.running:  # sched.has_requests(), inlined
                plan = sched.schedule()
                items = plan.items
                if not relay:
                    n_relay = 0
                elif plan.num_prefill_tokens:
                    n_relay = relay_tokens(plan)
                else:  # decode-only: every token relayed (relay_tokens' own shortcut)
                    n_relay = plan.num_tokens
                key = ("schedule", len(items), n_relay)
                yield cpu_actions.get(key) or self._cpu_action(key)
                yield _tuple_new(Launch, (plan,))
                queue.appendleft(plan)
                if items and len(queue) < depth:
                    oldest_done = yield _tuple_new(Poll, (queue[-1],))
                    if not oldest_done:
                        continue
            elif not queue:
                yield Idle()
                continue
            plan = queue.pop()
            yield _tuple_new(Await, (plan,))
            outs = sched.update_from_output(plan)
            key = ("update", len(plan.items), 0)
            yield cpu_actions.get(key) or self._cpu_action(key)
            if outs:
                yield _tuple_new(Emit, (tuple(outs),))

    def _cpu_action(self, key: tuple[str, int, int]) -> Cpu:
        act = self._cpu[key] = _tuple_new(Cpu, key)
        return act
