"""The sampled-token return path of a ring (SGLang): one hop last rank -> rank 0, plus the straggler.

``scheduler_pp_mixin.py::_pp_send_output_to_next_stage``: the last rank packs ``next_token_ids``
into a tensor dict and sends it to rank 0 with a point-to-point send; rank 0 forwards it to rank 1
one loop iteration later, and so on, in step with the hidden states, so only the first hop delays
rank 0's scheduler. Before that send the last rank does its own CPU post-processing of the batch
(``_pp_prepare_tensor_dict``, ``process_batch_result`` on its copy of the requests): the
"straggler". With ``pp_async_batch_depth == 0`` the last rank sends the output of the batch it has
just launched, so its CPU waits for its GPU and the post-processing sits between two of its
batches: ppsim adds it to the last stage's time. With depth >= 1 it sends the output of a batch
launched ``depth`` iterations earlier (``next_first_rank_mb_id = (mb_id + pp) % loop_size``), which
is already done, and the post-processing overlaps the GPU: hidden. The return time is one hop,
``link_time(output bytes)``, instead of the engine-core relay of vLLM. The ``depth``-iteration
deferral of that send (outputs leave the last rank in step with later batches) is the pipeline's
(``PipeOptions.defer_outputs``: ``ppsim/sim/pipeline.py`` and ``ppsim/sim/fast.py``).

TensorRT-LLM's sample-state ring (``py_executor.py::_executor_loop_pp``) takes the same route:
last rank -> rank 0 (one hop, ``return_time``), then rank 0 forwards it to rank 1 (and so on). With
the synchronous relay (``TLLM_PP_ASYNC_BROADCAST_SAMPLE_STATE=0``) that forward is a send on rank 0's
executor thread, so one more hop sits on its critical path: ``relay_time``. It has no straggler
(``straggler_us = 0``).

With a profile of ppsim's live engine (``calibration/core_path.py``), the return and the launch are
those measured there with the ring: the hop, rank 0's receiving thread and the engine core's queue
(the engine core stands for rank 0's scheduler), and rank 0 posting the ring's receive per step.
"""

from __future__ import annotations

import math

from ppsim.cost.base import CostModel, StageSpec
from ppsim.policy.plan import StepPlan

OUTPUT_BYTES_PER_REQ = 8  # next_token_ids: one int64 per request (no logprobs)


class RingReturnCost:
    """Wraps a cost model; only ``return_time`` changes."""

    def __init__(self, inner: CostModel, straggler_us: float, straggler_per_req_us: float, depth: int) -> None:
        self.inner = inner
        self.straggler_us = straggler_us
        self.straggler_per_req_us = straggler_per_req_us
        self.depth = depth

    def straggler(self, n: int) -> float:
        """Seconds of the last rank's CPU post-processing of a batch of ``n`` requests."""
        return (self.straggler_us + self.straggler_per_req_us * n) * 1e-6

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        t = self.inner.stage_time(stage, plan)
        if stage.is_last and self.depth == 0 and not plan.is_empty:
            t += self.straggler(plan.num_reqs)
        return t

    def link_time(self, nbytes: float) -> float:
        return self.inner.link_time(nbytes)

    @property
    def has_idle(self) -> bool:
        return bool(getattr(self.inner, "has_idle", False))

    @property
    def turnaround_s(self) -> float:
        return float(getattr(self.inner, "turnaround_s", 0.0))

    @property
    def turnaround_per_req_s(self) -> float:
        return float(getattr(self.inner, "turnaround_per_req_s", 0.0))

    @property
    def turnaround_max_reqs(self) -> float:
        return float(getattr(self.inner, "turnaround_max_reqs", math.inf))

    @property
    def corun_factor(self) -> float:
        """The inner model's charge for stages computing at once (a profile's ``stage_corun``), if any."""
        return float(getattr(self.inner, "corun_factor", 1.0))

    @property
    def spread(self):  # noqa: ANN201
        """The inner model's step-to-step spread of stage computes (a profile's ``stage_spread``), if any."""
        return getattr(self.inner, "spread", None)

    def idle_time(self, stage: StageSpec, gap_s: float) -> float:
        return self.inner.idle_time(stage, gap_s)

    def cpu_time(self, kind: str, n: int) -> float:
        return self.inner.cpu_time(kind, n)

    def launch_time(self, n: int) -> float:
        """The step's launch; with a profile of the live engine's ring, as measured there."""
        measured = self._measured("ring_launch_time", n)
        return self.inner.launch_time(n) if measured is None else measured

    def relay_time(self, n: int) -> float:
        """Forwarding ``n`` requests' sample state one hop down the ring from rank 0's executor thread."""
        wire = getattr(self.inner, "wire_time", self.inner.link_time)
        return wire(OUTPUT_BYTES_PER_REQ * max(n, 1))

    def return_time(self, n: int) -> float:
        """One hop, last rank -> rank 0; with a profile of the live engine's ring, as measured there (the
        hop, rank 0's receiving thread, and the engine core's queue that stands for rank 0's scheduler)."""
        measured = self._measured("ring_return_time", n)
        return self.inner.link_time(OUTPUT_BYTES_PER_REQ * max(n, 1)) if measured is None else measured

    def _measured(self, name: str, n: int) -> float | None:
        f = getattr(self.inner, name, None)
        return None if f is None else f(n)
