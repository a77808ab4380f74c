"""Request specs (immutable input) and their scheduling state (owned by one scheduler)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """What a client sends: ``prompt_len`` tokens in, exactly ``output_len`` tokens out (ignore_eos)."""

    req_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    abort_after_tokens: int | None = None  # client cancels once this many tokens were produced
    abort_after_s: float | None = None  # client cancels this long after sending it, wherever it is (mid-prefill...)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    REJECTED = "rejected"


class ReqState:
    """Mutable scheduling state, as in vLLM V1's ``Request``.

    ``num_computed`` is advanced when a step is *scheduled* (V1 ``_update_after_schedule``), so a
    request whose last known token is in flight has nothing new to schedule until its sampled
    token returns.
    """

    __slots__ = (
        "req",
        "num_computed",
        "num_output",
        "status",
        "epoch",
        "preemptions",
        "next_eligible_step",
        "placeholders",
        "last_sample_step",
        "run_seq",
        "kv_cap",
    )

    def __init__(self, req: Request) -> None:
        self.req = req
        self.num_computed = 0
        self.num_output = 0
        self.status = Status.WAITING
        self.epoch = 0
        self.preemptions = 0
        self.next_eligible_step = 0
        self.placeholders = 0  # async scheduling: sampled tokens scheduled but not yet returned
        self.last_sample_step = -1  # the step that will sample this request's newest token
        self.run_seq = -1  # order of entering the running list (the scheduler's ready index)
        self.kv_cap = 0  # tokens its KV blocks hold, as last seen by the scheduler (0: look them up)

    @property
    def req_id(self) -> int:
        return self.req.req_id

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_len + self.num_output

    @property
    def num_new_tokens(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_done(self) -> bool:
        return self.status in (Status.FINISHED, Status.ABORTED, Status.REJECTED)


TokenOutput = tuple[int, int, bool]
"""A sampled token reaching the engine core, ``(req_id, index, finished)``: the request's ``index``-th
output (1-based), and whether it was its last. A plain tuple, unpacked by its readers: one is built
per output token, and a named tuple costs about three times as much to build."""
