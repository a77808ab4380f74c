"""How the live engine (``ppsim engine``, ``ppsim validate``) runs: the scenario's ``live_engine`` section.

Settings the simulator does not have: the torch.distributed backend, where stages compute, their
threads, the timeouts, the KV pool cap, the checkpoint, the data path. They live in the scenario so
that a config file can set them (``[live_engine]``) and every run's ``config.json`` records them. The
simulator ignores the section (its config.json holds the defaults, so it can be run on the engine as
is). Plain pydantic: importing this module does not import torch.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from ppsim.typed import Model

# Upper bounds: a value past them is a typo (or milliseconds), and past them torch or the OS fails inside
# a stage process (a timeout overflows a C int, a thread pool cannot be created), after the spawn.
MAX_TIMEOUT_S = 86400.0  # one day
MAX_THREADS_PER_STAGE = 1024
MAX_KV_GIB = 4096.0  # 4 TiB per stage: more memory than a host or GPU has (the host check then names the real limit)
# Lower bounds: below them a value means nothing. No stage starts in under 1 s (spawn, import torch), and a
# stage timeout under 1 s declares a working stage stalled whenever the host is busy for a moment (the default
# is 5 s + 4 full steps); a KV cap under 1 MB is a slip of the unit (GiB).
MIN_TIMEOUT_S = 1.0
MIN_KV_GIB = 0.001
# fault injection (a test hook): KIND:STAGE:STEP, STEP a step id or "start" (before start-up)
FAULT_KINDS = ("kill", "stall")
MAX_FAULT_STEP = 10**9  # a day's steps at 0.1 ms each, more than any run makes: a larger one never fires
FAULT_FORM = "use kill:STAGE:STEP (the stage exits) or stall:STAGE:STEP (it stops), STEP a step number or start"


class LiveEngineConfig(Model):
    """Engine settings that the simulator does not have (``engine.run.EngineOptions`` is this class)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    backend: Literal["gloo", "nccl"] = "gloo"
    device: Literal["cpu", "cuda"] = "cpu"
    threads_per_stage: int = Field(default=1, ge=1, description="torch intra-op threads per stage process")
    # None: 5 s + 4 x the expected time of a full-budget step through all stages (from the warm-up)
    stage_timeout_s: float | None = Field(default=None, gt=0, description="declare a stage dead after this")
    # spawn, rendezvous, weights, warm-up: tiny models start in about 5 s on an idle CPU host, 20 s on a busy one
    startup_timeout_s: float = Field(default=60.0, gt=0, description="spawn, rendezvous, weights, warm-up")
    # None: min(the simulator's pool, the blocks the workload can ever hold at once)
    kv_num_blocks: int | None = Field(default=None, ge=1, description="override the KV pool size")
    max_kv_gib: float = Field(default=4.0, gt=0, description="refuse KV caches larger than this per stage")
    # None: the scenario's model if it is a checkpoint directory, else random weights from the seed
    checkpoint: str | None = Field(default=None, description="HF-layout safetensors directory")
    warm_tokens: int = Field(default=256, ge=1, description="tokens in the warm-up step")
    # A TEST HOOK, not a setting: "kill:STAGE:STEP" (stage exits) or "stall:STAGE:STEP" (stage stops), to
    # exercise the fault path (tests/test_engine_faults.py); checked against the stages when the run starts
    inject_fault: str | None = None
    # "policy": the policy's own sends and sampled-token route (engine/datapath.py); "vllm-v1": every
    # policy on vLLM V1's (wait on the previous send, tokens back through the engine core), to measure
    # what the policy's own path changes
    data_path: Literal["policy", "vllm-v1"] = "policy"

    @field_validator("stage_timeout_s", "startup_timeout_s")
    @classmethod
    def _timeout_bounded(cls, v: float | None) -> float | None:
        if v is not None and v > MAX_TIMEOUT_S:
            raise ValueError(f"at most {MAX_TIMEOUT_S:.0f} s (one day); give the timeout in seconds, e.g. 120")
        if v is not None and v < MIN_TIMEOUT_S:
            raise ValueError(
                f"at least {MIN_TIMEOUT_S:g} s: a stage takes longer than that to start or answer, so every run "
                "would end as stalled; give the timeout in seconds, e.g. 30"
            )
        return v

    @field_validator("max_kv_gib")
    @classmethod
    def _kv_cap_bounded(cls, v: float) -> float:
        if not MIN_KV_GIB <= v <= MAX_KV_GIB:
            raise ValueError(
                f"the cap is in GiB, from {MIN_KV_GIB:g} (1 MB) to {MAX_KV_GIB:.0f} (4 TiB, more than any host "
                "has); e.g. 4"
            )
        return v

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("empty; give a checkpoint directory, or leave it out for random weights")
        return v

    @field_validator("inject_fault")
    @classmethod
    def _fault_parsed(cls, v: str | None) -> str | None:
        if v is not None:
            parse_fault(v)
        return v

    @field_validator("threads_per_stage")
    @classmethod
    def _threads_bounded(cls, v: int) -> int:
        if v > MAX_THREADS_PER_STAGE:
            raise ValueError(
                f"at most {MAX_THREADS_PER_STAGE} torch threads per stage process; give about the CPU cores "
                "per stage, e.g. 4"
            )
        return v


def parse_fault(text: str) -> tuple[str, int, int]:
    """``KIND:STAGE:STEP`` -> (kind, stage, step), step -1 for ``start``; ValueError saying what is wrong.
    Whether the stage exists is checked when the run starts (``engine.run``), where the stages are known."""
    parts = text.split(":")
    if len(parts) != 3:
        what = "empty" if not text.strip() else f"{text!r:.60} is not KIND:STAGE:STEP"
        raise ValueError(f"{what}; {FAULT_FORM}, e.g. kill:1:4")
    kind, stage, step = parts
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown kind {kind!r:.40}; {FAULT_FORM}, e.g. kill:1:4")
    if not re.fullmatch(r"[0-9]{1,6}", stage):
        raise ValueError(f"stage {stage!r:.40} is not a stage number (0 is the first); {FAULT_FORM}")
    if step != "start" and not (re.fullmatch(r"[0-9]{1,10}", step) and int(step) <= MAX_FAULT_STEP):
        raise ValueError(
            f"step {step!r:.40} is neither start nor a step number from 0 to {MAX_FAULT_STEP:,} (a larger one "
            f"is never reached); {FAULT_FORM}"
        )
    return kind, int(stage), -1 if step == "start" else int(step)
