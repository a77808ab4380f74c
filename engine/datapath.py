"""The sampled tokens' routes that differ from vLLM V1's (last stage -> engine core -> first stage).

* :class:`RingSender` (last rank) and :class:`RingForwarder` (rank 0): SGLang and TensorRT-LLM
  send a step's sampled tokens from the last rank to rank 0 over the pipeline ring (SGLang
  ``_pp_send_output_to_next_stage``, TensorRT-LLM's sample-state ring in ``_executor_loop_pp``);
  rank 0's scheduler, not a separate engine core, processes them. Here rank 0 receives them on a
  thread (the scheduler's CPU, beside the stage's compute) and hands them to the engine core's result
  queue: the one hop the simulator charges (``RingReturnCost.return_time``). With SGLang's
  ``pp_async_batch_depth = d`` the last rank sends step ``b``'s tokens only once step ``b + d`` has
  reached it, or when the core waits for ``b`` (:class:`engine.transport.Flush`), as the simulator's
  ``defer_outputs``. One int64 per sampled request (one placeholder when none samples).
* :class:`TokenBroadcast`: vLLM ModelRunnerV2 ``PPHandler``: the last rank broadcasts every step's
  sampled tokens to all ranks on a dedicated process group (``make_sibling_device_group``); rank 0
  fills the placeholders of async-scheduled plans from it instead of from the engine core.
  Serialized (``--pp-broadcast serialized``): on the p2p group, and a rank's next send waits for it
  (the last rank's next compute too), as the simulator's broadcast holding the send channel.

Every wait is bounded by the process group's timeout.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections import deque
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engine.transport import OUTPUTS, message_tag

FORWARD_POLL_S = 0.5  # the forwarder's queue wait between checks of its stop flag


def _tokens_buffer(toks: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(toks or [-1], dtype=torch.long, device=device)


class RingSender:
    """Last rank: each step's sampled tokens to rank 0, ``defer`` of its iterations later."""

    def __init__(self, wire: torch.device, defer: int, timeout_s: float) -> None:
        self.wire, self.defer = wire, defer
        self.timeout = timedelta(seconds=timeout_s)
        self.held: dict[int, torch.Tensor] = {}  # step -> tokens, done here and not sent yet
        self.awaited: set[int] = set()  # steps the core waits for: sent as soon as done
        self.last_arrived = -1  # newest step whose inputs reached this rank
        self.last_sampled = -1  # newest step done here (steps finish in launch order)
        self.works: deque[tuple[Any, torch.Tensor]] = deque()
        self.stats = {"outputs_deferred": 0, "outputs_sent_on_flush": 0}  # reported to the core at the end

    def arrived(self, step_id: int) -> None:
        """Step ``step_id`` reached the last rank: outputs ``defer`` iterations older leave now."""
        self.last_arrived = max(self.last_arrived, step_id)
        if self.defer:
            for sid in sorted(s for s in self.held if s + self.defer <= self.last_arrived):
                self._send(sid, self.held.pop(sid))

    def sampled(self, step_id: int, toks: list[int]) -> None:
        buf = _tokens_buffer(toks, self.wire)
        self.last_sampled = step_id
        if self.defer and step_id + self.defer > self.last_arrived and step_id not in self.awaited:
            self.held[step_id] = buf
            self.stats["outputs_deferred"] += 1
        else:
            self.awaited.discard(step_id)
            self._send(step_id, buf)

    def flush(self, step_id: int) -> None:
        """The core waits for ``step_id``: send it now if held, else as soon as it is done."""
        buf = self.held.pop(step_id, None)
        if buf is not None:
            self._send(step_id, buf)
            self.stats["outputs_sent_on_flush"] += 1
        elif step_id > self.last_sampled:  # not done yet (an older one not held was sent already)
            self.awaited.add(step_id)

    def _send(self, step_id: int, buf: torch.Tensor) -> None:
        while self.works and self.works[0][0].is_completed():
            self.works.popleft()
        self.works.append((dist.isend(buf, dst=0, tag=message_tag(step_id, OUTPUTS)), buf))

    def close(self) -> None:
        for sid in sorted(self.held):  # nothing later will come: what is held leaves now
            self._send(sid, self.held.pop(sid))
        while self.works:
            self.works.popleft()[0].wait(self.timeout)


class RingForwarder:
    """Rank 0: receive each step's sampled tokens from the last rank; hand them to the engine core."""

    def __init__(self, rank: int, src: int, wire: torch.device, results: Any, timeout_s: float) -> None:
        self.rank, self.src, self.wire, self.results = rank, src, wire, results
        self.timeout = timedelta(seconds=timeout_s)
        self.posted: queue.Queue[tuple[int, list[int], Any, torch.Tensor] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="ring-forwarder", daemon=True)
        self.thread.start()

    def expect(self, step_id: int, req_ids: list[int]) -> None:
        """Post the receive of ``step_id``'s tokens (in launch order, as the control messages come)."""
        buf = torch.empty(max(1, len(req_ids)), dtype=torch.long, device=self.wire)
        work = dist.irecv(buf, src=self.src, tag=message_tag(step_id, OUTPUTS))
        self.posted.put((step_id, req_ids, work, buf))

    def _run(self) -> None:
        try:
            while (item := self.posted.get()) is not None:
                step_id, req_ids, work, buf = item
                work.wait(self.timeout)
                self.results.put(("tokens", step_id, req_ids, buf[: len(req_ids)].tolist(), self.rank))
        except BaseException:  # noqa: BLE001 - the engine core reports it and stops the run
            self.results.put(("error", self.rank, traceback.format_exc(limit=8)))

    def close(self) -> None:
        self.posted.put(None)
        self.thread.join(self.timeout.total_seconds())
        if self.thread.is_alive():
            raise RuntimeError("rank 0: sampled tokens from the last rank did not arrive in time")


class TokenBroadcast:
    """MRV2 ``PPHandler``: the last rank broadcasts sampled tokens; the other ranks receive them in order."""

    def __init__(self, rank: int, world: int, wire: torch.device, serialized: bool, timeout_s: float) -> None:
        self.rank, self.src, self.wire, self.serialized = rank, world - 1, wire, serialized
        self.timeout = timedelta(seconds=timeout_s)
        # every rank creates the group, in the same order (a collective); serialized: the p2p group
        self.group = None if serialized else dist.new_group(list(range(world)), timeout=self.timeout)
        self.posted: deque[tuple[int, list[int], Any, torch.Tensor]] = deque()  # joined, not yet read
        self.sent: deque[tuple[Any, torch.Tensor]] = deque()  # the last rank's, until complete

    def warm(self) -> None:
        """One broadcast on the group before the run, every rank: its first collective sets the group up.

        vLLM's workers and ``PyNcclCommunicator`` run "a small all_reduce for warmup" after creating a
        group for the same reason. (One MRV2 PP=2 validation run in 16 waited 2.3 s for its first
        sampled tokens; 30 controlled runs with this and 30 without stalled in none:
        ``docs/validation.md``.)"""
        buf = torch.zeros(1, dtype=torch.long, device=self.wire)
        dist.broadcast(buf, src=self.src, group=self.group, async_op=True).wait(self.timeout)

    def post(self, step_id: int, req_ids: list[int]) -> Any:
        """A receiving rank joins ``step_id``'s broadcast (every rank in launch order); returns its work."""
        buf = torch.empty(max(1, len(req_ids)), dtype=torch.long, device=self.wire)
        work = dist.broadcast(buf, src=self.src, group=self.group, async_op=True)
        self.posted.append((step_id, req_ids, work, buf))
        return work, buf

    def send(self, toks: list[int]) -> tuple[Any, torch.Tensor]:
        """The last rank broadcasts a step's tokens; returns the work (a serialized one holds the channel)."""
        while self.sent and self.sent[0][0].is_completed():
            self.sent.popleft()
        buf = _tokens_buffer(toks, self.wire)
        work = dist.broadcast(buf, src=self.src, group=self.group, async_op=True)
        self.sent.append((work, buf))
        return work, buf

    def next_tokens(self) -> tuple[int, dict[int, int]]:
        """Wait for the oldest posted broadcast: (step id, request id -> token)."""
        step_id, req_ids, work, buf = self.posted.popleft()
        work.wait(self.timeout)
        return step_id, dict(zip(req_ids, buf[: len(req_ids)].tolist(), strict=True))

    def done(self) -> list[tuple[int, dict[int, int]]]:
        """The broadcasts already complete, oldest first, without waiting (read each step, so none piles up)."""
        out = []
        while self.posted and self.posted[0][2].is_completed():
            out.append(self.next_tokens())
        return out

    def close(self) -> None:
        while self.posted:
            self.posted.popleft()[2].wait(self.timeout)
        while self.sent:
            self.sent.popleft()[0].wait(self.timeout)
