"""What crosses process boundaries: control messages, results, and the stage-to-stage tensors.

* Engine core -> every stage: a :class:`StepMsg` per micro-batch on the stage's control queue
  (vLLM broadcasts its ``SchedulerOutput`` to all workers over a shared-memory queue). Only the
  first stage gets token ids; every stage gets positions and block tables through the items.
* Engine core -> first stage, only for policies that schedule a decode before its input token is
  back and whose tokens reach stage 0 through the core (``vllm-async``): every returned step's
  sampled tokens as a :class:`SampledMsg`; the first stage fills the plan's ``holes`` from them, as
  vLLM's model runner fills placeholders from the previous step's sampled token ids. (``vllm-mrv2``
  fills them from the last rank's broadcast instead, :mod:`engine.datapath`.)
* Engine core -> last stage, SGLang's deferred ring return only: :class:`Flush` (the core waits for
  a step whose outputs the last rank may still hold).
* Stage i -> stage i + 1: ``hidden_states`` and ``residual`` with ``torch.distributed`` isend /
  irecv (vLLM ``IntermediateTensors`` over ``get_pp_group().send_tensor_dict``). A receiver posts
  its irecv as soon as it knows a micro-batch's size (from the control message), before compute
  needs it; a sender waits on its previous send before the next compute (vLLM waits on
  ``_pp_send_work``), or only before the next send (:class:`DataPath` ``overlap_sends``: SGLang,
  TensorRT-LLM). Tags carry the step id and what is sent, so matching does not rely on ordering.
* Every stage -> engine core: tuples on one result queue: ``("ready", rank, clock_s, warm_s)``,
  ``("tokens", step_id, req_ids, token_ids, rank)`` from the last stage (from rank 0 on a ring return,
  :mod:`engine.datapath`), ``("ops", rank, [StageTimes])``,
  ``("error", rank, text)`` and ``("bye", rank)``.

The control and result queues are ``multiprocessing`` queues: a ``put`` hands the message to the
queue's feeder thread, which needs the GIL to pickle and write it. At the interpreter's default
5 ms switch interval that thread could wait for a busy main thread: with two micro-batches in flight
(tiny-moe, PP=2, one request per micro-batch) a step message reached a stage already waiting for it
0.27-0.28 ms after the launch at the median but 2.1-2.8 ms at p90. vLLM writes its step broadcast
in the calling thread (``shm_broadcast.MessageQueue``), so the engine core and the stages run at a
0.2 ms switch interval (:data:`SWITCH_INTERVAL_S`): p90 0.59-0.74 ms, same median (two runs each).

With ``--device cuda --backend gloo`` the tensors are staged through host memory (several stages
may share one GPU that way; NCCL refuses two ranks on one device). That mode is for functional
checks and calibration, not for timing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

SWITCH_INTERVAL_S = 0.0002  # the engine's processes switch threads this often (module docstring)


@contextmanager
def switch_interval(seconds: float = SWITCH_INTERVAL_S) -> Iterator[None]:
    """The interpreter's thread switch interval set to ``seconds`` for the block, then restored."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclass(frozen=True, slots=True)
class StepItem:
    """A plan item with its KV block table, as a stage needs it."""

    req_id: int
    start: int
    num_tokens: int
    samples: bool
    block_table: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepMsg:
    step_id: int
    items: tuple[StepItem, ...]
    token_ids: tuple[int, ...] | None = None  # first stage only: the T input tokens in item order
    # first stage only, async scheduling: (row in token_ids, step id, request id) of input tokens
    # that were still being sampled at launch; filled from :class:`SampledMsg` before compute
    holes: tuple[tuple[int, int, int], ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)


@dataclass(frozen=True, slots=True)
class SampledMsg:
    """Sampled tokens of ``step_id`` forwarded by the engine core to the first stage (async scheduling)."""

    step_id: int
    tokens: tuple[tuple[int, int], ...]  # (request id, token id)


@dataclass(frozen=True, slots=True)
class Stop:
    """Flush records and exit."""


@dataclass(frozen=True, slots=True)
class StageTimes:
    """One stage's clock readings for one micro-batch (engine-relative seconds; -1 = none)."""

    step_id: int
    recv_done_s: float  # inputs from the previous stage fully arrived
    start_s: float
    end_s: float
    send_start_s: float  # isend of the outputs posted
    cpu_s: float = -1.0  # thread CPU time of the compute (start_s..end_s): wall minus time not running
    preempted: int = -1  # involuntary context switches of the stage thread during the compute


HIDDEN, RESIDUAL, OUTPUTS = 0, 1, 2  # what a point-to-point message carries (the tag's low bits)
WARM = 3  # the start-up messages (StageLink.warm): low bits no step's message has


def message_tag(step_id: int, k: int) -> int:
    return (step_id % (1 << 24)) * 4 + k


@dataclass(frozen=True, slots=True)
class DataPath:
    """The policy's own data path (:class:`ppsim.policy.pipelines.PipeOptions` and its return cost).

    ``overlap_sends``: the next compute does not wait for the previous send, only the next send does
    (SGLang, TensorRT-LLM). ``token_path="broadcast"``: the last rank broadcasts each step's sampled
    tokens to every rank (vLLM MRV2 ``PPHandler``), on its own process group, or on the p2p group
    holding the send channel when ``broadcast_serialized``. ``ring_return``: the last rank sends the
    sampled tokens to rank 0 over the ring and rank 0 hands them to the engine core (SGLang,
    TensorRT-LLM), ``defer_outputs`` of the last rank's iterations later (SGLang
    ``pp_async_batch_depth``). Default: vLLM V1 (wait on the previous send; tokens to the core).
    """

    overlap_sends: bool = False
    token_path: str = "core"
    broadcast_serialized: bool = False
    ring_return: bool = False
    defer_outputs: int = 0


@dataclass(frozen=True, slots=True)
class Flush:
    """Engine core -> last stage (deferred ring return): the core waits for ``step_id``; send it when done."""

    step_id: int


class StageLink:
    """Point-to-point tensors to and from the neighbouring stages of ``rank``."""

    def __init__(
        self, rank: int, world: int, hidden_size: int, dtype: torch.dtype, device: torch.device, host_staged: bool
    ) -> None:
        self.rank, self.world, self.hidden_size = rank, world, hidden_size
        self.dtype, self.device, self.host_staged = dtype, device, host_staged
        self.wire = torch.device("cpu") if host_staged else device
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []
        self._channel: list[tuple[dist.Work, torch.Tensor]] = []  # a serialized broadcast holding the channel

    def warm(self, timeout: timedelta) -> None:
        """One small message on each route a run's tensors take: to the next stage, and from the last
        stage to the first (the ring return), before the run. NCCL creates a pair's communicator at its
        first send; tag ``WARM`` is no step's."""
        buf = torch.zeros(1, device=self.wire)
        last = self.world - 1
        works = []
        if self.rank < last:
            works.append(dist.isend(buf, dst=self.rank + 1, tag=message_tag(0, WARM)))
        if self.rank > 0:
            works.append(dist.irecv(torch.empty_like(buf), src=self.rank - 1, tag=message_tag(0, WARM)))
        if self.rank == last:
            works.append(dist.isend(buf, dst=0, tag=message_tag(1, WARM)))
        if self.rank == 0:
            works.append(dist.irecv(torch.empty_like(buf), src=last, tag=message_tag(1, WARM)))
        for w in works:
            w.wait(timeout)

    def post_recv(self, step_id: int, num_tokens: int) -> tuple[list[dist.Work], torch.Tensor, torch.Tensor]:
        h = torch.empty(num_tokens, self.hidden_size, dtype=self.dtype, device=self.wire)
        r = torch.empty_like(h)
        works = [
            dist.irecv(h, src=self.rank - 1, tag=message_tag(step_id, 0)),
            dist.irecv(r, src=self.rank - 1, tag=message_tag(step_id, 1)),
        ]
        return works, h, r

    def wait_recv(self, pending: tuple[list[dist.Work], torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        works, h, r = pending
        for w in works:
            w.wait()
        return h.to(self.device), r.to(self.device)

    def wait_sends(self) -> None:
        """Wait for the previous send (and, on the last rank, a serialized broadcast it holds)."""
        for w, _buf in self._sends:
            w.wait()
        self._sends.clear()

    def wait_channel(self) -> None:
        """Wait for a serialized broadcast this rank joined: it holds the send channel."""
        for w, _buf in self._channel:
            w.wait()
        self._channel.clear()

    def hold_channel(self, work: dist.Work, buf: torch.Tensor) -> None:
        self._channel.append((work, buf))

    def send(self, step_id: int, hidden: torch.Tensor, residual: torch.Tensor) -> None:
        self.wait_sends()
        self.wait_channel()
        for k, t in enumerate((hidden, residual)):
            buf = t.detach().to(self.wire).contiguous()
            self._sends.append((dist.isend(buf, dst=self.rank + 1, tag=message_tag(step_id, k)), buf))
