"""The sampled-token return path: how the token sampled on the last stage reaches the first stage.

The first stage needs each request's newest token to embed it in the next step, but only the last
stage samples. The engines differ in the route and in who pays for it:

* **scheduler relay** (vLLM V1, ``vllm/v1/core/sched/scheduler.py::Scheduler._make_cached_request_data``):
  the last stage returns tokens to the engine core; with ``use_pp`` the scheduler copies the new
  token ids of every cached (already running) request into ``CachedRequestData`` for the next step.
  That is engine-core CPU on the critical path, proportional to requests x new tokens per step:
  :func:`relay_tokens` counts them, the executor charges ``cost.relay_time`` for them.
* **ring hops** (TensorRT-LLM ``py_executor.py`` sample-state ring, SGLang ``_pp_send_output_to_next_stage``):
  the last stage sends the sample state to rank 0, which forwards it to rank 1 and so on to rank
  P-2. Stage ``s`` holds the tokens after :func:`ring_hops` link messages.
* **broadcast** (vLLM ModelRunnerV2 ``vllm/v1/worker/gpu/pp_utils.py::PPHandler``): the last rank
  broadcasts the sampled tokens to every rank on a dedicated NCCL group; one collective.
"""

from __future__ import annotations

from ppsim.policy.plan import StepPlan

TOKEN_ID_BYTES = 8  # sampled token ids travel as int64


def relay_tokens(plan: StepPlan) -> int:
    """Token ids the scheduler copies for ``plan``: all scheduled tokens of cached requests.

    A request seen before (``start > 0``) is a cached request; ``_make_cached_request_data`` sends
    ``all_token_ids[num_computed : num_computed + num_scheduled]`` for each. New requests carry their
    prompt in ``NewRequestData`` and cost nothing extra.
    """
    if not plan.num_prefill_tokens:  # every item a decode, so cached (a request's first item is a prefill)
        return plan.num_tokens
    return sum(it.num_tokens for it in plan.items if it.start > 0)


def ring_hops(stage: int, pp: int) -> int:
    """Link messages until stage ``stage`` holds a sample state sent by the last stage.

    Order last -> 0 -> 1 -> ... -> P-2: rank 0 after one hop, rank s after s + 1 hops; the last
    stage already holds it (0 hops).
    """
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} outside 0..{pp - 1}")
    return 0 if stage == pp - 1 else stage + 1


def sample_state_bytes(num_reqs: int) -> int:
    """Bytes of one step's sampled token ids (one per request)."""
    return TOKEN_ID_BYTES * max(num_reqs, 1)
