"""The scheduler's ready index (only running requests with tokens to schedule are visited) builds the
same plans as vLLM's full walk over the running list, step by step, under every limit it supports."""

from __future__ import annotations

import random

import pytest

from ppsim.policy.kv import BlockPool
from ppsim.policy.plan import PlanItem, make_plan
from ppsim.policy.requests import Request, Status
from ppsim.policy.scheduler import Scheduler, SchedulerLimits


class FullWalkScheduler(Scheduler):
    """vLLM's loop as written before the ready index: every running request is visited."""

    def schedule(self):  # noqa: ANN201 - the base's, with the full walk always taken
        items: list[PlanItem] = []
        budget, preempted = self._full_walk(items, self.limits.max_num_batched_tokens)
        if not preempted:
            self._schedule_waiting(items, budget)
        deps = self._deps
        plan = make_plan(self.step, items, tuple(sorted(deps)) if deps else ())
        if deps:
            self._deps = set()
        self.step += 1
        return plan

    def _full_walk(self, items: list[PlanItem], budget: int) -> tuple[int, bool]:
        lim, running = self.limits, self.running
        preempted, decodes, i, n_run = False, 0, 0, len(running)
        while i < n_run and budget > 0:
            if lim.max_batch_reqs is not None and len(items) >= lim.max_batch_reqs:
                break
            st = running[i]
            i += 1
            req = st.req
            prompt, num_out, ph, start = req.prompt_len, st.num_output, st.placeholders, st.num_computed
            total = prompt + num_out + ph
            n = total - start
            if ph and num_out + ph >= req.output_len:
                continue
            if n <= 0 or st.next_eligible_step > self.step:
                continue
            is_decode = n == 1 and start >= prompt
            if is_decode and lim.decode_cap is not None and decodes >= lim.decode_cap:
                continue
            n = min(n, budget)
            while not self.kv.allocate(req.req_id, start + n):
                victim = running.pop()
                n_run -= 1
                self._preempt(victim)
                preempted = True
                if victim is st:
                    return budget, preempted
            samples = start + n == total
            items.append(PlanItem(req.req_id, start, n, n > 1 or start < prompt, samples, st.epoch))
            st.num_computed = start + n
            if samples:
                if lim.decode_spacing:
                    st.next_eligible_step = self.step + lim.decode_spacing
                if lim.async_placeholders:
                    if ph:
                        self._deps.add(st.last_sample_step)
                    st.placeholders = ph + 1
                st.last_sample_step = self.step
            decodes += is_decode
            budget -= n
        return budget, preempted


LIMITS = {
    "vllm-default": {},
    "async": {"async_placeholders": True},
    "spacing": {"decode_spacing": 2},
    "decode-cap": {"decode_cap": 3},
    "batch-cap": {"max_batch_reqs": 4, "admit_cap": 2},
    "no-chunking": {"enable_chunked_prefill": False},
}


def drive(cls: type[Scheduler], extra: dict, seed: int, depth: int, num_blocks: int) -> list:
    """A batch queue of ``depth`` over random arrivals and aborts; every plan and output, in order."""
    rng = random.Random(seed)
    limits = SchedulerLimits(max_num_seqs=12, max_num_batched_tokens=96, **extra)
    sched = cls(limits, BlockPool(num_blocks, 4))
    log: list = []
    in_flight: list = []
    next_id = 0
    for _ in range(600):
        if rng.random() < 0.3:
            prompt = rng.randint(1, 90 if extra.get("enable_chunked_prefill", True) else 96)
            sched.add_request(Request(next_id, 0.0, prompt, rng.randint(1, 12)))
            next_id += 1
        if next_id and rng.random() < 0.03:
            victim = rng.randrange(next_id)
            log.append(("abort", victim, sched.abort(victim)))
        if sched.has_requests():
            plan = sched.schedule()
            log.append((plan.step_id, plan.items, plan.deps))
            in_flight.append(plan)
        if in_flight and (len(in_flight) >= depth or not sched.has_requests() or not in_flight[-1].items):
            log.append(tuple(sched.update_from_output(in_flight.pop(0))))
        for rid in [
            r for r, st in sched.requests.items() if st.status is not Status.RUNNING and st.status is not Status.WAITING
        ]:
            del sched.requests[rid]  # forgotten once ended, as the driver does
    log.append(("preemptions", sched.num_preemptions))
    return log


@pytest.mark.parametrize("name", sorted(LIMITS))
@pytest.mark.parametrize("seed,depth,num_blocks", [(1, 4, 400), (2, 4, 60), (3, 1, 40), (4, 2, 30)])
def test_ready_index_builds_the_full_walks_plans(name: str, seed: int, depth: int, num_blocks: int) -> None:
    full = drive(FullWalkScheduler, LIMITS[name], seed, depth, num_blocks)
    ready = drive(Scheduler, LIMITS[name], seed, depth, num_blocks)
    assert ready == full
    assert sum(1 for e in full if len(e) == 3 and isinstance(e[0], int) and e[1]) > 50  # it did schedule


def test_tight_pool_preempts() -> None:
    """The scenarios above include preemption (else the ready index's preemption path is untested)."""
    log = drive(Scheduler, {}, 2, 4, 60)
    assert log[-1][1] > 0
