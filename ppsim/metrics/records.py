"""Records of a run (built by :class:`ppsim.metrics.ledger.Ledger` and the executors). Times in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    req_id: int
    arrival_s: float  # when the client meant to send it
    input_tokens: int
    output_tokens: int  # requested
    sent_s: float | None = None  # when it was sent (after the closed-loop semaphore)
    scheduled_s: float | None = None  # first micro-batch launch that included it
    token_times: list[float] = field(default_factory=list)
    finish_s: float | None = None
    preemptions: int = 0
    status: str = "pending"  # finished | aborted | rejected | unfinished

    @property
    def first_token_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One operation on a track: ``kind`` compute (a stage) or send (a link)."""

    track: str  # "stage0", "link0->1", "core"
    kind: str
    step_id: int
    start_s: float
    end_s: float
    num_tokens: int
    num_reqs: int
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    nbytes: float = 0.0

    def row(self) -> tuple:
        """The fields in :data:`OP_FIELDS` order."""
        return (
            self.track,
            self.kind,
            self.step_id,
            self.start_s,
            self.end_s,
            self.num_tokens,
            self.num_reqs,
            self.num_prefill_tokens,
            self.num_decode_tokens,
            self.nbytes,
        )


OP_FIELDS = [
    "track",
    "kind",
    "step_id",
    "start_s",
    "end_s",
    "num_tokens",
    "num_reqs",
    "num_prefill_tokens",
    "num_decode_tokens",
    "nbytes",
]


# the engine's stage_loop.csv: one row per stage compute, engine-relative seconds (-1: none; docs/engine.md, "The
# stage loop"; written by engine/executor.py, read by experiments/validation/stage_loop.py without torch)
LOOP_FIELDS = [
    "stage",
    "step_id",
    "num_tokens",
    "num_reqs",
    "ready_s",
    "recv_done_s",
    "start_s",
    "end_s",
    "ctrl_s",
    "out_s",
    "out_cpu_s",
    "out_switched",
    "cpu_s",
    "preempted",
]
