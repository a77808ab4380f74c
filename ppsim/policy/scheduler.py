"""Continuous batching with chunked prefill, FCFS with recompute preemption (vLLM V1 ``Scheduler``).

Follows ``vllm/v1/core/sched/scheduler.py::Scheduler.schedule``: running requests first (decodes
and unfinished prefills), each taking ``min(num_new_tokens, budget)`` tokens; then waiting
requests in arrival order while the token budget, ``max_num_seqs`` and the KV pool allow. A
request whose last token is in flight has ``num_new_tokens == 0`` and is skipped, so one request's
decode is never in two in-flight micro-batches, while the next prefill chunk of a long prompt may
enter the next micro-batch (chunks pipeline across stages). When a running request cannot grow
its KV, the newest running request is preempted (blocks freed, recomputed later).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ppsim.policy.kv import BlockPool
from ppsim.policy.plan import PlanItem, StepPlan, make_plan
from ppsim.policy.requests import ReqState, Request, Status, TokenOutput

_tuple_new = tuple.__new__  # PlanItem built without its Python-level __new__ (hot loop)


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None
    # Caps set by the pipeline policy (None = no cap):
    admit_cap: int | None = None  # requests newly scheduled or resumed per step (PP throttle)
    decode_cap: int | None = None  # decodes per step (MRV2 option)
    decode_spacing: int = 0  # a request is eligible again only this many steps after scheduled
    # vLLM AsyncScheduler: a sampling step adds an output placeholder, so the request can be
    # scheduled again before its token is back (the plan then lists the step it depends on)
    async_placeholders: bool = False
    max_batch_reqs: int | None = None  # requests per micro-batch (SGLang --pp-max-micro-batch-size)


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv: BlockPool) -> None:
        self.limits = limits
        self.kv = kv
        self.waiting: deque[ReqState] = deque()
        self.running: list[ReqState] = []
        self.requests: dict[int, ReqState] = {}
        self.step = 0
        self.num_preemptions = 0
        self._deps: set[int] = set()
        # running requests with tokens to schedule (num_new_tokens > 0), by when they entered running:
        # the running list is in that order, so the running loop visits these in order and skips the
        # rest (a request whose sampled token is in flight) without looking at them
        self._ready: dict[int, ReqState] = {}
        self._seq = 0
        self._partial: tuple[int, int, int, int, float, int, int] | None = None

    # --- requests ---------------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        """Queue ``req``; False (and status REJECTED) if it can never fit in the KV pool."""
        st = ReqState(req)
        self.requests[req.req_id] = st
        total = req.prompt_len + req.output_len
        too_long = self.limits.max_model_len is not None and total > self.limits.max_model_len
        if too_long or self.kv.blocks_for(total) > self.kv.num_blocks:
            st.status = Status.REJECTED
            return False
        self.waiting.append(st)
        return True

    def abort(self, req_id: int) -> bool:
        """Cancel a request wherever it is; frees its blocks. False if it had already ended."""
        st = self.requests.get(req_id)
        if st is None or st.is_done:
            return False
        if st.status is Status.WAITING:
            self.waiting.remove(st)
        else:
            self.running.remove(st)
            self._ready.pop(st.run_seq, None)
        self.kv.free(req_id)
        st.kv_cap = 0
        st.status = Status.ABORTED
        return True

    def has_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def has_unfinished(self) -> bool:
        return self.has_requests()

    # --- scheduling ---------------------------------------------------------------------------
    def _item(self, st: ReqState, n: int) -> PlanItem:
        start = st.num_computed
        req = st.req
        samples = start + n == req.prompt_len + st.num_output + st.placeholders  # num_tokens, inlined
        item = PlanItem(req.req_id, start, n, n > 1 or start < req.prompt_len, samples, st.epoch)
        st.num_computed = start + n
        if samples:
            # vLLM AsyncScheduler._update_after_schedule skips prefill chunks that do not sample
            if self.limits.decode_spacing:
                st.next_eligible_step = self.step + self.limits.decode_spacing
            if self.limits.async_placeholders:
                if st.placeholders:
                    self._deps.add(st.last_sample_step)
                st.placeholders += 1
            st.last_sample_step = self.step
        return item

    def _preempt(self, st: ReqState) -> None:
        self._ready.pop(st.run_seq, None)
        self.kv.free(st.req.req_id)
        st.kv_cap = 0
        st.status = Status.WAITING
        st.num_computed = 0
        st.epoch += 1
        st.preemptions += 1
        st.next_eligible_step = 0
        st.placeholders = 0
        self.num_preemptions += 1
        self.waiting.appendleft(st)

    def _schedule_running(self, items: list[PlanItem], budget: int) -> tuple[int, bool]:
        """Running requests in order, each ``min(num_new_tokens, budget)`` tokens (``_item`` inlined:
        this loop runs once per ready request per step). Only requests with tokens to schedule are
        visited (``_ready``); the others would be skipped (``num_new_tokens == 0``)."""
        ready = self._ready
        if not ready:
            return budget, False
        lim = self.limits
        cap, decode_cap = lim.max_batch_reqs, lim.decode_cap
        spacing, placeholders_on = lim.decode_spacing, lim.async_placeholders
        if cap is None and decode_cap is None and not spacing and not placeholders_on:
            return self._schedule_running_plain(items, budget)
        preempted = False
        decodes = 0
        running = self.running
        step, allocate, append = self.step, self.kv.allocate, items.append
        # allocate's no-op case, inlined: a request's blocks already hold its tokens (a decode needs a new
        # block only every block_size tokens)
        tables, bs = self.kv._tables, self.kv.block_size
        for seq in sorted(ready) if len(ready) > 1 else list(ready):
            if budget <= 0 or (cap is not None and len(items) >= cap):
                break
            st = ready.get(seq)
            if st is None:  # preempted in this loop: preemption pops from the end of running, so
                break  # every later one went too
            req = st.req
            prompt, num_out, ph, start = req.prompt_len, st.num_output, st.placeholders, st.num_computed
            total = prompt + num_out + ph  # num_tokens + placeholders
            n = total - start
            if ph and num_out + ph >= req.output_len:
                continue  # async: the last token is already scheduled (vLLM skips the extra step)
            if n <= 0 or st.next_eligible_step > step:
                continue
            is_decode = n == 1 and start >= prompt
            if is_decode and decode_cap is not None and decodes >= decode_cap:
                continue
            if n > budget:
                n = budget
            table = tables.get(req.req_id)
            if table is None or -(-(start + n) // bs) > len(table):
                while not allocate(req.req_id, start + n):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is st:
                        return budget, preempted
            samples = start + n == total
            append(_tuple_new(PlanItem, (req.req_id, start, n, n > 1 or start < prompt, samples, st.epoch)))
            st.num_computed = start + n
            if samples:  # as _item
                if spacing:
                    st.next_eligible_step = step + spacing
                if placeholders_on:
                    if ph:
                        self._deps.add(st.last_sample_step)
                    st.placeholders = ph + 1
                else:
                    del ready[seq]  # its token is now in flight
                st.last_sample_step = step
            decodes += is_decode
            budget -= n
        return budget, preempted

    def _schedule_running_plain(self, items: list[PlanItem], budget: int) -> tuple[int, bool]:
        """:meth:`_schedule_running` without the caps, decode spacing and async placeholders (vLLM's
        default scheduler): the same rules with the tests that cannot fire removed (no placeholders,
        every request eligible, no per-step request or decode cap)."""
        ready, running = self._ready, self.running
        allocate, append = self.kv.allocate, items.append
        tables, bs = self.kv._tables, self.kv.block_size
        preempted = False
        # make_plan's sums, taken here (the plan's first items are these)
        n_pre = n_samp = pre_kv = dec_ctx = 0
        pairs = 0.0
        for seq in sorted(ready) if len(ready) > 1 else list(ready):
            if budget <= 0:
                break
            if preempted and seq not in ready:  # preempted in this loop (see _schedule_running)
                break
            st = ready[seq]
            req = st.req
            prompt, start = req.prompt_len, st.num_computed
            total = prompt + st.num_output
            n = total - start
            if n <= 0:
                continue
            if n > budget:
                n = budget
            req_id = req.req_id
            end = start + n
            if end > st.kv_cap:  # its blocks may not hold the new tokens: allocate's no-op case, inlined
                table = tables.get(req_id)
                if table is None or -(-end // bs) > len(table):
                    while not allocate(req_id, end):
                        victim = running.pop()
                        self._preempt(victim)
                        if victim is st:
                            self._partial = None
                            return budget, True
                        preempted = True
                st.kv_cap = len(tables[req_id]) * bs
            samples = end == total
            is_prefill = n > 1 or start < prompt
            append(_tuple_new(PlanItem, (req_id, start, n, is_prefill, samples, st.epoch)))
            st.num_computed = end
            if is_prefill:
                n_pre += n
                pairs += n * (start + (n + 1) / 2)
                pre_kv += end
            else:
                dec_ctx += end
            if samples:  # (last_sample_step is read only with async placeholders: not set here)
                n_samp += 1
                del ready[seq]  # its token is now in flight
            budget -= n
        self._partial = (len(items), self.limits.max_num_batched_tokens - budget, n_pre, n_samp, pairs, pre_kv, dec_ctx)
        return budget, preempted

    def _schedule_waiting(self, items: list[PlanItem], budget: int) -> None:
        lim = self.limits
        admitted = 0
        while self.waiting and budget > 0 and len(self.running) < lim.max_num_seqs:
            if lim.max_batch_reqs is not None and len(items) >= lim.max_batch_reqs:
                break
            if lim.admit_cap is not None and admitted >= lim.admit_cap:
                break
            st = self.waiting[0]
            n = st.num_tokens - st.num_computed
            if not lim.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if not self.kv.allocate(st.req.req_id, n):
                break
            self.waiting.popleft()
            st.status = Status.RUNNING
            self.running.append(st)
            items.append(self._item(st, n))
            st.run_seq = seq = self._seq
            self._seq = seq + 1
            if st.req.prompt_len + st.num_output + st.placeholders > st.num_computed:
                self._ready[seq] = st
            budget -= n
            admitted += 1

    def schedule(self) -> StepPlan:
        """Plan the next micro-batch (possibly empty). Advances the step counter."""
        items: list[PlanItem] = []
        budget, preempted = self.limits.max_num_batched_tokens, False
        self._partial = None  # set by the plain running loop: make_plan's sums of its items
        if self._ready:  # else every running request's token is in flight
            budget, preempted = self._schedule_running(items, budget)
        if not preempted and self.waiting:
            self._schedule_waiting(items, budget)
        deps = self._deps
        plan = make_plan(self.step, items, tuple(sorted(deps)) if deps else (), self._partial)
        if deps:
            self._deps = set()
        self.step += 1
        return plan

    # --- results ------------------------------------------------------------------------------
    def update_from_output(self, plan: StepPlan) -> list[TokenOutput]:
        """Apply a finished micro-batch: each sampling item appends one token to its request."""
        if not self.limits.async_placeholders:
            return self._update_plain(plan)
        outs: list[TokenOutput] = []
        finished = False
        reqs, ready, running_status = self.requests, self._ready, Status.RUNNING
        for req_id, _start, _n, _pre, samples, epoch in plan.items:  # PlanItem fields, unpacked
            if not samples:
                continue
            st = reqs.get(req_id)  # None: ended and forgotten by the executor while in flight
            if st is None or st.epoch != epoch or st.status is not running_status:
                continue  # preempted or aborted while in flight: the token is dropped
            num_out = st.num_output = st.num_output + 1
            ph = st.placeholders
            if ph:
                st.placeholders = ph = ph - 1
            req = st.req
            done = num_out >= req.output_len
            if done:
                st.status = Status.FINISHED
                self.kv.free(req_id)
                st.kv_cap = 0
                ready.pop(st.run_seq, None)
                finished = True
            elif req.prompt_len + num_out + ph > st.num_computed:
                ready[st.run_seq] = st  # its token is back: schedulable again
            outs.append((req_id, num_out, done))
        if finished:
            self.running = [s for s in self.running if s.status is running_status]
        return outs

    def _update_plain(self, plan: StepPlan) -> list[TokenOutput]:
        """:meth:`update_from_output` without async placeholders (none is ever set): the same rule
        with the placeholder count left out."""
        outs: list[TokenOutput] = []
        append = outs.append
        finished = False
        reqs, ready, running_status = self.requests, self._ready, Status.RUNNING
        for req_id, _start, _n, _pre, samples, epoch in plan.items:  # PlanItem fields, unpacked
            if not samples:
                continue
            st = reqs.get(req_id)  # None: ended and forgotten by the executor while in flight
            if st is None or st.epoch != epoch or st.status is not running_status:
                continue  # preempted or aborted while in flight: the token is dropped
            num_out = st.num_output = st.num_output + 1
            req = st.req
            if num_out >= req.output_len:
                st.status = Status.FINISHED
                self.kv.free(req_id)
                st.kv_cap = 0
                ready.pop(st.run_seq, None)
                finished = True
                append((req_id, num_out, True))
                continue
            if req.prompt_len + num_out > st.num_computed:
                ready[st.run_seq] = st  # its token is back: schedulable again
            append((req_id, num_out, False))
        if finished:
            self.running = [s for s in self.running if s.status is running_status]
        return outs
