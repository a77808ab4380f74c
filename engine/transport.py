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

The control and result queues are :class:`DirectQueue` pipes whose ``put`` pickles and writes the
message in the calling thread, as vLLM writes its step broadcast (``shm_broadcast.MessageQueue``). A
``multiprocessing.Queue`` hands it to a feeder thread instead, which must then get the GIL and a core:
at the interpreter's default 5 ms switch interval it waited for a busy main thread (a step message
reached a waiting stage 0.27-0.28 ms after launch at the median, 2.1-2.8 ms at p90; at the 0.2 ms
interval, :data:`SWITCH_INTERVAL_S`, which the processes still use for the other threads: p90
0.59-0.74 ms), and with both cores busy computing, the scheduler left it waiting 1-4 ms for one
(tiny-moe, PP=2, one request per micro-batch: 29-56 of 191 stage gaps over 2 ms per run; direct
writes with the stages on cores of their own, :func:`engine.worker.stage_cores`: 11-32,
docs/engine.md). The pipes are enlarged to :data:`PIPE_BYTES` where the OS allows, so that a
``put`` does not block on a reader busy writing its own.

With ``--device cuda --backend gloo`` the tensors are staged through host memory (several stages
may share one GPU that way; NCCL refuses two ranks on one device). That mode is for functional
checks and calibration, not for timing.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

SWITCH_INTERVAL_S = 0.0002  # the engine's processes switch threads this often (module docstring)
PIPE_BYTES = 1 << 20  # control / result pipe capacity asked of the OS (Linux's default maximum)


@contextmanager
def switch_interval(seconds: float = SWITCH_INTERVAL_S) -> Iterator[None]:
    """The interpreter's thread switch interval set to ``seconds`` for the block, then restored."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class DirectQueue:
    """A process queue without a feeder thread: ``put`` pickles and writes in the calling thread.

    ``multiprocessing.SimpleQueue`` (a pipe, one lock per end) with the ``queue.Queue`` calls the
    engine uses: ``get(timeout=...)`` and ``get_nowait`` raise ``queue.Empty``. Many writers may share
    it; one process reads it. Made in the parent and handed to spawned processes as arguments."""

    def __init__(self, ctx: Any) -> None:
        self._q = ctx.SimpleQueue()
        _enlarge_pipe(self._q._writer.fileno())

    def put(self, msg: Any) -> None:
        self._q.put(msg)

    def get(self, timeout: float | None = None) -> Any:
        """The next message; ``queue.Empty`` if none arrives within ``timeout`` seconds (None: wait)."""
        if timeout is not None and not self._q._reader.poll(max(0.0, timeout)):
            raise queue.Empty
        return self._q.get()

    def get_nowait(self) -> Any:
        return self.get(0.0)

    def close(self) -> None:
        self._q.close()


def _enlarge_pipe(fd: int) -> None:
    """Ask for a :data:`PIPE_BYTES` pipe; keep the default where the OS has no such call or says no."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass


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
    # the stage loop around the compute (stage_loop.csv; docs/engine.md, "The stage loop"):
    ready_s: float = -1.0  # the step taken off the stage's queue, its sampled-token holes filled
    ctrl_s: float = -1.0  # seconds reading control messages before it (blocking where none was queued)
    out_s: float = -1.0  # seconds from end_s until the outputs were handed on (tokens put / send posted)
    out_cpu_s: float = -1.0  # thread CPU time of that hand-on
    out_switched: int = -1  # involuntary context switches of the stage thread during it


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
