"""SGLang's pipeline design (``sglang-ring``): a micro-batch ring with per-slot running batches.

Follows ``python/sglang/srt/managers/scheduler_pp_mixin.py::SchedulerPPMixin.event_loop_pp``:

- Every PP rank runs a full scheduler over the same requests (rank 0 forwards ``recv_reqs`` to the
  next rank with the hidden states), so all ranks make the same decisions; ppsim runs rank 0's.
- ``init_pp_loop_state``: ``pp_loop_size = pp_size + pp_async_batch_depth`` micro-batch slots, each
  with its own running batch (``running_mbs[mb_id]``). A request decodes in the slot where its
  prefill ended, once per loop round.
- Per iteration ``mb_id``: schedule slot ``mb_id`` (``get_next_batch_to_run``: a new prefill batch
  if one can be formed, else the slot's decode batch; PP disables mixed chunks), launch it, receive
  the outputs of slot ``(mb_id + 1) % pp_loop_size`` (launched ``pp_loop_size - 1`` iterations ago)
  and process them. With ``pp_async_batch_depth > 0`` the outputs are received *before* the launch
  (``_pp_commit_send_output_work_and_preprocess_output_tensors``), so rank 0's GPU keeps working on
  the previous slot while the CPU waits; with depth 0 the launch comes first and the ring hop plus
  the last rank's post-processing (the "straggler") show as a bubble on every iteration. With depth d
the last rank also sends a batch's outputs d of its iterations later (the executor's pipeline models
that deferral: ``PipeOptions.defer_outputs``; plan step ids count the loop's iterations).
- ``get_new_batch_prefill`` / ``get_num_allocatable_reqs``: a prefill batch admits at most
  ``pp_max_micro_batch_size - running_bs(slot)`` requests (default ``max(max_running // pp, 1)``)
  and at most the chunk budget of tokens; a prompt longer than the budget becomes the
  ``chunked_req`` and its next chunk is scheduled in the *next* slot at once, so chunk i+1 enters
  stage 0 while chunk i is on stage 1 (chunked pipeline prefill). With dynamic chunking the budget
  for a continuing chunk comes from :mod:`ppsim.policy.chunking`. One deviation: SGLang lets the
  chunked request's last chunk join a full slot (running_bs may exceed the cap by one); ppsim runs
  the slot's decode batch instead and places the last chunk in the next slot with room, so the
  per-micro-batch cap always holds.
- Outputs travel last rank -> rank 0 -> 1 -> ... (``_pp_send_output_to_next_stage``); rank k
  forwards them one iteration after it got them, in step with the hidden states, so only the hop
  to rank 0 delays the scheduler. That hop is the cost model's ``return_time`` (see
  :mod:`ppsim.cost.ring`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from ppsim.policy.actions import Action, Await, Cpu, Emit, Idle, Launch
from ppsim.policy.kv import BlockPool
from ppsim.policy.plan import PlanItem, StepPlan, make_plan
from ppsim.policy.requests import ReqState, Status, TokenOutput
from ppsim.policy.scheduler import Scheduler, SchedulerLimits


@dataclass(frozen=True, slots=True)
class SGLangKnobs:
    """SGLang server args the ring reads (``server_args.py``), resolved."""

    async_batch_depth: int = 0  # --pp-async-batch-depth (default 0)
    max_micro_batch_size: int | None = None  # --pp-max-micro-batch-size (None: max(max_running // pp, 1))
    chunked_prefill_size: int = 8192  # --chunked-prefill-size
    max_prefill_tokens: int = 16384  # --max-prefill-tokens (PrefillAdder rem_input_tokens)
    page_size: int = 1  # --page-size
    chunk_budget: Callable[[int], int] | None = None  # prefix -> budget (dynamic chunking), else fixed


def micro_batch_cap(max_running: int, pp: int, given: int | None) -> int:
    """``pp_max_micro_batch_size``: given, or ``max(max_running_requests // pp_size, 1)``."""
    return given if given is not None else max(max_running // pp, 1)


class RingScheduler(Scheduler):
    """vLLM-style request bookkeeping (add/abort/update) with SGLang's per-slot batch formation."""

    def __init__(
        self,
        limits: SchedulerLimits,
        kv: BlockPool,
        num_slots: int,
        chunk_size: int,
        page_size: int = 1,
        chunk_budget: Callable[[int], int] | None = None,
        max_prefill_tokens: int = 16384,
    ) -> None:
        super().__init__(limits, kv)
        self.slots: list[list[ReqState]] = [[] for _ in range(num_slots)]
        self.chunked: ReqState | None = None
        self.chunk_size = chunk_size
        self.max_prefill_tokens = max_prefill_tokens
        self.page_size = page_size
        self.chunk_budget = chunk_budget

    # --- bookkeeping -------------------------------------------------------------------------
    def _forget(self, st: ReqState) -> None:
        for members in self.slots:
            if st in members:
                members.remove(st)
        if self.chunked is st:
            self.chunked = None

    def _preempt(self, st: ReqState) -> None:
        self._forget(st)
        super()._preempt(st)

    def abort(self, req_id: int) -> bool:
        st = self.requests.get(req_id)
        if st is not None and not st.is_done:
            self._forget(st)
        return super().abort(req_id)

    def update_from_output(self, plan: StepPlan) -> list[TokenOutput]:
        outs = super().update_from_output(plan)
        if any(finished for _req_id, _index, finished in outs):
            self.slots = [[s for s in m if s.status is Status.RUNNING] for m in self.slots]
        return outs

    # --- batch formation ---------------------------------------------------------------------
    def _budget(self) -> int:
        """Prefill tokens this batch may take: ``PrefillAdder``'s ``rem_chunk_tokens`` (the chunk size,
        or the dynamic prediction for a continuing chunk) within ``rem_input_tokens`` (max_prefill_tokens)."""
        size = self.chunk_size
        if self.chunked is not None and self.chunk_budget is not None:
            size = self.chunk_budget(self.chunked.num_computed)
        return min(size, self.max_prefill_tokens)

    def _take(self, st: ReqState, budget: int) -> int:
        """Tokens of ``st``'s prompt this batch takes (PrefillAdder truncation to the page size)."""
        need = st.req.prompt_len - st.num_computed if st.num_computed < st.req.prompt_len else st.num_new_tokens
        n = min(need, budget)
        if n < need and self.page_size > 1:
            n = n // self.page_size * self.page_size
        return n

    def _prefill_items(self, slot: int, cap: int) -> list[PlanItem]:
        """``get_new_batch_prefill``: the chunked request first, then waiting requests in order."""
        allocatable = cap - len(self.slots[slot])
        if self.chunked is None and (not self.waiting or allocatable <= 0):
            return []
        items: list[PlanItem] = []
        budget = self._budget()
        st = self.chunked
        if st is not None:
            n = self._take(st, budget)
            final = st.num_computed + n >= st.num_tokens
            if n <= 0 or (final and allocatable <= 0) or not self.kv.allocate(st.req_id, st.num_computed + n):
                return []  # the last chunk joins this slot's running batch only if the slot has room
            items.append(self._admitted(st, n, slot))
            budget -= n
        while self.waiting and budget > 0 and self.chunked is None and len(items) < allocatable:
            if len(self.running) >= self.limits.max_num_seqs:
                break
            st = self.waiting[0]
            n = self._take(st, budget)
            if n <= 0 or not self.kv.allocate(st.req_id, st.num_computed + n):
                break
            self.waiting.popleft()
            st.status = Status.RUNNING
            self.running.append(st)
            items.append(self._admitted(st, n, slot))
            budget -= n
        return items

    def _admitted(self, st: ReqState, n: int, slot: int) -> PlanItem:
        item = self._item(st, n)
        if st.num_computed < st.num_tokens:
            self.chunked = st  # more prompt left: the next slot continues it
        else:
            if self.chunked is st:
                self.chunked = None
            self.slots[slot].append(st)  # the finished prefill merges into this slot's running batch
        return item

    def _decode_items(self, slot: int) -> list[PlanItem]:
        """``update_running_batch``: one token for each ready request of the slot; retract on KV shortage."""
        members = self.slots[slot]
        items: list[PlanItem] = []
        i = 0
        while i < len(members):
            st = members[i]
            if st.num_tokens - st.num_computed <= 0:
                i += 1
                continue
            while not self.kv.allocate(st.req_id, st.num_computed + 1):
                victim = members[-1]
                self.running.remove(victim)
                self._preempt(victim)
                if victim is st:
                    return items
            items.append(self._item(st, 1))
            i += 1
        return items

    def schedule_slot(self, slot: int, cap: int) -> StepPlan:
        """``get_next_batch_to_run`` for micro-batch slot ``slot``; advances the step counter."""
        items = self._prefill_items(slot, cap) or self._decode_items(slot)
        plan = make_plan(self.step, items)
        self.step += 1
        return plan


class SGLangRingCore:
    """Rank 0's ``event_loop_pp`` as a generator of engine-core actions."""

    def __init__(self, scheduler: RingScheduler, pp: int, depth: int, cap: int) -> None:
        if pp < 1 or depth < 0 or cap < 1:
            raise ValueError("pp >= 1, pp_async_batch_depth >= 0 and pp_max_micro_batch_size >= 1 required")
        self.scheduler = scheduler
        self.pp = pp
        self.depth = depth
        self.cap = cap
        self.loop_size = pp + depth
        self.mbs: list[StepPlan | None] = [None] * self.loop_size

    def _collect(self, mb_id: int) -> Generator[Action, Any, None]:
        """Receive and process the outputs of slot ``mb_id`` (``_pp_process_batch_result``)."""
        plan = self.mbs[mb_id]
        if plan is None:
            return
        yield Await(plan)
        self.mbs[mb_id] = None
        outs = self.scheduler.update_from_output(plan)
        yield Cpu("update", plan.num_reqs)
        if outs:
            yield Emit(tuple(outs))

    def run(self) -> Generator[Action, Any, None]:
        sched, L = self.scheduler, self.loop_size
        while True:
            launched = False
            for mb_id in range(L):
                nxt = (mb_id + 1) % L
                plan = None
                if sched.has_requests():
                    plan = sched.schedule_slot(mb_id, self.cap)
                    if plan.is_empty:
                        plan = None
                    else:
                        yield Cpu("schedule", plan.num_reqs)
                else:
                    sched.step += 1  # step ids count the loop's iterations (the output deferral counts them)
                self.mbs[mb_id] = plan
                if self.depth > 0:
                    yield from self._collect(nxt)
                if plan is not None:
                    yield Launch(plan)
                    launched = True
                if self.depth == 0:
                    yield from self._collect(nxt)
            if launched or any(p is not None for p in self.mbs):
                continue
            if sched.has_requests():
                # nothing schedulable and nothing in flight: an empty step lets time pass (and lets
                # the executor detect a stall)
                empty = make_plan(sched.step, [])
                sched.step += 1
                yield Launch(empty)
                yield Await(empty)
            else:
                yield Idle()


def build_sglang_core(
    pp: int, max_num_seqs: int, max_model_len: int | None, knobs: SGLangKnobs, kv: BlockPool
) -> SGLangRingCore:
    """The ``sglang-ring`` engine core over a fresh :class:`RingScheduler`.

    SGLang's budgets are its own: ``chunked_prefill_size`` and ``max_prefill_tokens`` bound a prefill
    batch; vLLM's ``max_num_batched_tokens`` plays no part (a decode batch is bounded by requests).
    """
    cap = micro_batch_cap(max_num_seqs, pp, knobs.max_micro_batch_size)
    budget = min(knobs.chunked_prefill_size, knobs.max_prefill_tokens)
    limits = SchedulerLimits(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len, max_batch_reqs=cap
    )
    loop = pp + knobs.async_batch_depth
    sched = RingScheduler(
        limits, kv, loop, knobs.chunked_prefill_size, knobs.page_size, knobs.chunk_budget, knobs.max_prefill_tokens
    )
    return SGLangRingCore(sched, pp, knobs.async_batch_depth, cap)
