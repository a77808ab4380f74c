"""One pipeline stage as a process: receive, compute, send; record when each happened.

The loop mirrors a vLLM PP worker's ``execute_model``: take the next control message (in launch
order), make sure the previous stage's ``hidden_states``/``residual`` have arrived, run this
stage's layers over the whole micro-batch, then either isend the pair downstream or (last stage)
sample greedily and return the tokens to the engine core. Receives for control messages already
queued are posted before the current compute, so transfers overlap it. The policy's own data path
(:class:`engine.transport.DataPath`: overlapped sends, the ring return to rank 0, MRV2's token
broadcast, SGLang's deferred output send) is set up in :meth:`Stage._data_path` (:mod:`engine.datapath`).

Stages hold no request state and make no decisions. Every wait has a timeout or is ended by the
driver (SIGTERM, then SIGKILL); a stage also dies with its parent (``PR_SET_PDEATHSIG``) and
ignores SIGINT so that Ctrl-C is handled once, by the driver.
"""

from __future__ import annotations

import gc
import os
import queue
import resource
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.checkpoint import load_stage_weights
from engine.datapath import RingForwarder, RingSender, TokenBroadcast
from engine.kvcache import PagedKVCache, set_attention_backends
from engine.lifetime import die_with_parent
from engine.model import StageModel, build_stage, torch_dtype
from engine.step import forward_step
from engine.transport import (
    SWITCH_INTERVAL_S,
    DataPath,
    Flush,
    SampledMsg,
    StageLink,
    StageTimes,
    StepItem,
    StepMsg,
    Stop,
)
from ppsim.models.shape import ModelShape

PREPOST = 4  # receives posted ahead of the current micro-batch
FLUSH_EVERY = 32  # stage time records per result message
CTRL_POLL_S = 0.5  # control-queue wait between parent-alive checks
SAMPLED_KEEP = 65536  # forwarded sampled tokens kept for async-scheduled plans (a plan needs recent ones)


@dataclass(frozen=True)
class StageConfig:
    """Everything a stage process needs (picklable)."""

    rank: int
    world: int
    init_method: str
    shape: ModelShape
    start_layer: int
    end_layer: int
    num_blocks: int
    block_size: int
    seed: int
    checkpoint: str | None
    backend: str
    device: str
    threads: int
    dist_timeout_s: float
    warm_tokens: int
    warm_reqs: int = 1  # requests the warm-up step's tokens are split over (vLLM: max_num_seqs)
    router_zipf: float = 0.0  # MoE router popularity skew (engine/moe.py)
    fault: tuple[str, int] | None = None  # ("kill" | "stall", step id): fault injection for tests
    path: DataPath = DataPath()  # the policy's send and sampled-token paths


def _device(cfg: StageConfig) -> torch.device:
    if cfg.device == "cuda":
        dev = torch.device("cuda", cfg.rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def warm_items(tokens: int, reqs: int, block_size: int, num_blocks: int) -> tuple[StepItem, ...]:
    """The warm-up step's prefill items: ``tokens`` split over ``min(tokens, reqs)`` requests as vLLM's dummy run
    splits them, each on blocks of its own; fewer requests where their blocks would not fit ``num_blocks``."""
    k = max(1, min(tokens, reqs))
    while True:
        sizes = [tokens // k] * k
        sizes[-1] += tokens % k
        need = sum(-(-c // block_size) for c in sizes)
        if need <= num_blocks or k == 1:
            break
        k -= 1
    items, first = [], 0
    for i, c in enumerate(sizes):
        nb = -(-c // block_size)
        items.append(StepItem(-1 - i, 0, c, True, tuple(range(first, first + nb))))
        first += nb
    return tuple(items)


class Stage:
    def __init__(self, cfg: StageConfig, ctrl: Any, results: Any) -> None:
        self.cfg, self.ctrl, self.results = cfg, ctrl, results
        self.dev = _device(cfg)
        set_attention_backends(self.dev)
        s = cfg.shape
        self.is_first, self.is_last = cfg.rank == 0, cfg.rank == cfg.world - 1
        dtype = torch_dtype(s.dtype)
        self.model: StageModel = build_stage(
            s, cfg.start_layer, cfg.end_layer, self.is_first, self.is_last, cfg.seed, dtype, self.dev, cfg.router_zipf
        )
        if cfg.checkpoint:
            load_stage_weights(self.model, cfg.checkpoint)
        self.kv = PagedKVCache(
            self.model.num_layers, cfg.num_blocks, cfg.block_size, s.num_kv_heads, s.head_dim, dtype, self.dev
        )
        self.link = StageLink(
            cfg.rank,
            cfg.world,
            s.hidden_size,
            dtype,
            self.dev,
            host_staged=cfg.device == "cuda" and cfg.backend == "gloo",
        )
        self._data_path(cfg)
        self.parent = os.getppid()
        self.times: list[StageTimes] = []
        self.sampled: dict[tuple[int, int], int] = {}  # (step id, request id) -> token, first stage
        self.pending: deque[tuple[StepMsg, Any]] = deque()
        self.stopping = False

    def _data_path(self, cfg: StageConfig) -> None:
        """The policy's routes for sampled tokens (engine/datapath.py); none of them at one stage."""
        p, multi, wire = cfg.path, cfg.world > 1, self.link.wire
        self.overlap = p.overlap_sends
        self.ring_out = (
            RingSender(wire, p.defer_outputs, cfg.dist_timeout_s)
            if (multi and p.ring_return and self.is_last)
            else None
        )
        self.ring_in = (
            RingForwarder(cfg.rank, cfg.world - 1, wire, self.results, cfg.dist_timeout_s)
            if (multi and p.ring_return and self.is_first)
            else None
        )
        self.bcast = (
            TokenBroadcast(cfg.rank, cfg.world, wire, p.broadcast_serialized, cfg.dist_timeout_s)
            if (multi and p.token_path == "broadcast")
            else None
        )
        self.own_tokens = p.token_path == "broadcast" and not multi  # one rank keeps what it samples

    # --- one micro-batch ---------------------------------------------------------------------
    @torch.inference_mode()
    def compute(self, msg: StepMsg, hidden: torch.Tensor | None, residual: torch.Tensor | None):  # noqa: ANN201
        m, bs = self.model, self.cfg.block_size
        return forward_step(m, self.kv, msg.items, msg.token_ids, hidden, residual, bs, self.dev)

    def warm_up(self) -> float:
        """Two forwards of ``warm_tokens`` prompt tokens over ``warm_reqs`` requests (slots later overwritten);
        seconds of the second. As vLLM's profile run (``_dummy_run``: ``min(num_tokens, max_num_seqs)`` requests
        of ``num_tokens // num_reqs`` tokens, the last one the rest), so that a first step of many prefill items
        does not pay what the warm-up left cold (docs/validation.md, What is left out)."""
        n = max(1, min(self.cfg.warm_tokens, self.cfg.num_blocks * self.cfg.block_size))
        items = warm_items(n, self.cfg.warm_reqs, self.cfg.block_size, self.cfg.num_blocks)
        msg = StepMsg(-1, items, tuple([0] * n) if self.is_first else None)
        h = None if self.is_first else torch.randn(n, self.cfg.shape.hidden_size, device=self.dev)
        h = h.to(torch_dtype(self.cfg.shape.dtype)) if h is not None else None
        elapsed = 0.0
        for _ in range(2):
            t = time.perf_counter()
            self.compute(msg, h, h)
            elapsed = time.perf_counter() - t
        self._warm_links()
        return elapsed

    def _warm_links(self) -> None:
        """A small all-reduce over every stage (as vLLM's workers after start-up), a message on each
        point-to-point route, then the broadcast group's."""
        if self.cfg.world == 1:
            return
        timeout = timedelta(seconds=self.cfg.dist_timeout_s)
        dist.all_reduce(torch.zeros(1, device=self.link.wire), async_op=True).wait(timeout)
        self.link.warm(timeout)
        if self.bcast is not None:
            self.bcast.warm()

    def _maybe_fault(self, step_id: int) -> None:
        if self.cfg.fault is not None and step_id >= self.cfg.fault[1]:
            os.kill(os.getpid(), signal.SIGKILL if self.cfg.fault[0] == "kill" else signal.SIGSTOP)

    def step(self, msg: StepMsg, pending_recv: Any, ready: float = -1.0, ctrl: float = -1.0) -> None:
        """Run one micro-batch: wait for its input, compute, hand the outputs on; ``ready`` (when the loop
        took it) and ``ctrl`` (seconds reading control messages before) go into its record."""
        self._maybe_fault(msg.step_id)
        hidden = residual = None
        recv_done = -1.0
        if pending_recv is not None:
            hidden, residual = self.link.wait_recv(pending_recv)
            recv_done = time.perf_counter()
        if self.ring_out is not None:
            self.ring_out.arrived(msg.step_id)
        if not self.overlap:  # vLLM: the previous send (_pp_send_work) is waited before the next compute
            self.link.wait_sends()
            if self.is_last:  # a serialized broadcast is the last rank's send
                self.link.wait_channel()
        switches0 = _involuntary_switches()
        start, cpu0 = time.perf_counter(), time.thread_time()
        hidden, residual, req_ids, toks = self.compute(msg, hidden, residual)
        end = send_start = time.perf_counter()
        cpu = time.thread_time() - cpu0
        preempted = _involuntary_switches() - switches0 if switches0 >= 0 else -1
        out_cpu0, out_switches0 = time.thread_time(), _involuntary_switches()
        if self.is_last:
            self._tokens_out(msg.step_id, req_ids, toks)
            send_start = -1.0
        else:  # overlapped sends: wait here, for the previous send only; the isend is posted after it
            self.link.wait_sends()
            self.link.wait_channel()
            send_start = time.perf_counter()
            self.link.send(msg.step_id, hidden, residual)
            if self.bcast is not None:
                self._join_broadcast(msg)
        out = time.perf_counter() - end
        switched = _involuntary_switches() - out_switches0 if out_switches0 >= 0 else -1
        loop = {"ready_s": ready, "ctrl_s": ctrl, "out_s": out, "out_cpu_s": time.thread_time() - out_cpu0}
        loop["out_switched"] = switched
        self.times.append(StageTimes(msg.step_id, recv_done, start, end, send_start, cpu, preempted, **loop))
        if len(self.times) >= FLUSH_EVERY:
            self.flush()

    def _tokens_out(self, step_id: int, req_ids: list[int], toks: list[int]) -> None:
        """Last rank: the sampled tokens go to the core, or to rank 0 over the ring, and/or to the broadcast."""
        if self.bcast is not None and req_ids:
            work, buf = self.bcast.send(toks)
            if self.bcast.serialized:
                self.link.hold_channel(work, buf)
        if self.own_tokens:
            self._keep_sampled(step_id, zip(req_ids, toks, strict=True))
        if self.ring_out is not None:
            self.ring_out.sampled(step_id, toks)
        else:
            self.results.put(("tokens", step_id, req_ids, toks, self.cfg.rank))

    def _join_broadcast(self, msg: StepMsg) -> None:
        """A serialized broadcast is joined after this rank's own send of the step, holding its channel."""
        if self.bcast.serialized and any(it.samples for it in msg.items):
            self.link.hold_channel(*self.bcast.post(msg.step_id, _sample_ids(msg)))
        for step, got in self.bcast.done():  # middle ranks need none of them (stages hold no request state)
            if self.is_first:
                self._keep_sampled(step, got.items())

    def flush(self) -> None:
        if self.times:
            self.results.put(("ops", self.cfg.rank, self.times))
            self.times = []

    # --- control loop ----------------------------------------------------------------------------
    def _next_ctrl(self, block: bool) -> StepMsg | SampledMsg | Stop | None:
        while True:
            try:
                return self.ctrl.get(timeout=CTRL_POLL_S) if block else self.ctrl.get_nowait()
            except queue.Empty:
                if not block:
                    return None
                if os.getppid() != self.parent:
                    raise RuntimeError("engine core process is gone") from None

    def _take(self, block: bool) -> bool:
        """Handle one control message; False if none was waiting (non-blocking)."""
        msg = self._next_ctrl(block)
        if msg is None:
            return False
        if isinstance(msg, Stop):
            self.stopping = True
        elif isinstance(msg, Flush):
            if self.ring_out is not None:
                self.ring_out.flush(msg.step_id)
        elif isinstance(msg, SampledMsg):
            self._keep_sampled(msg.step_id, msg.tokens)
        else:
            recv = None if self.is_first else self.link.post_recv(msg.step_id, msg.num_tokens)
            if self.ring_in is not None:
                self.ring_in.expect(msg.step_id, _sample_ids(msg))
            if (
                self.bcast is not None
                and not self.is_last
                and not self.bcast.serialized
                and (any(it.samples for it in msg.items))
            ):
                self.bcast.post(msg.step_id, _sample_ids(msg))
            self.pending.append((msg, recv))
        return True

    def _keep_sampled(self, step_id: int, tokens: Any) -> None:
        """Sampled (request id, token) pairs of ``step_id``, kept until a plan's placeholder takes them."""
        self.sampled.update({(step_id, r): t for r, t in tokens})
        if len(self.sampled) > SAMPLED_KEEP:  # tokens no plan asked for (known at launch): drop the oldest
            for key in sorted(self.sampled)[: len(self.sampled) - SAMPLED_KEEP // 2]:
                del self.sampled[key]

    def _fill_holes(self, msg: StepMsg) -> StepMsg:
        """Wait for the sampled tokens an async-scheduled plan needs, and put them in place."""
        if not msg.holes:
            return msg
        while any((step, req) not in self.sampled for _row, step, req in msg.holes):
            if self.bcast is not None:  # MRV2: from the last rank's broadcast, oldest first
                if not self.bcast.posted:
                    raise RuntimeError(f"step {msg.step_id}: its sampled tokens were never broadcast")
                step, got = self.bcast.next_tokens()
                self._keep_sampled(step, got.items())
                continue
            if self.stopping:
                raise RuntimeError(f"step {msg.step_id}: stopped while waiting for sampled tokens")
            self._take(block=True)
        ids = list(msg.token_ids or ())
        for row, step, req in msg.holes:
            ids[row] = self.sampled.pop((step, req))
        return StepMsg(msg.step_id, msg.items, tuple(ids))

    def loop(self) -> None:
        while self.pending or not self.stopping:
            taking = time.perf_counter()
            while not self.stopping and len(self.pending) < PREPOST:
                if not self._take(block=not self.pending):
                    break
            ctrl = time.perf_counter() - taking
            if self.pending:
                msg, recv = self.pending.popleft()
                msg = self._fill_holes(msg)
                self.step(msg, recv, time.perf_counter(), ctrl)
        self.link.wait_sends()
        self.link.wait_channel()
        for part in (self.ring_out, self.bcast, self.ring_in):
            if part is not None:
                part.close()
        stats = dict(self.ring_out.stats) if self.ring_out is not None else {}
        if self.cfg.world > 1 and self.cfg.device == "cpu":
            stats[f"loops_not_idle_rank{self.cfg.rank}"] = len(busy_helpers())
        if stats:
            self.results.put(("stats", self.cfg.rank, stats))
        self.flush()


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def _involuntary_switches() -> int:
    """Times the calling thread was taken off its core while runnable; -1 where not counted."""
    return -1 if _RUSAGE_THREAD is None else resource.getrusage(_RUSAGE_THREAD).ru_nivcsw


def _sample_ids(msg: StepMsg) -> list[int]:
    """Request ids of the items that sample, in item order (the rows the last stage samples)."""
    return [it.req_id for it in msg.items if it.samples]


def _startup_fault(cfg: StageConfig) -> None:
    """Fault injection before start-up (step -1): die, or hang as a stage stuck importing or on a driver."""
    if cfg.fault is None or cfg.fault[1] >= 0:
        return
    if cfg.fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # the parent's start-up timeout ends this (SIGTERM)
        time.sleep(1.0)


def stage_cores(rank: int, world: int, threads: int, device: str, available: set[int]) -> set[int] | None:
    """The cores a stage runs on: ``threads`` of its own where every stage's threads fit ``available``
    (the cores this host lets the engine use); None where they do not, or off CPU (the OS places it).

    As each worker of a GPU deployment has its device and host cores to itself: on shared cores a
    helper thread that delivers a message (gloo's receive loop) waited 1-4 ms for the scheduler while
    both cores computed (docs/engine.md). The engine core and the host sampler are not pinned."""
    if device != "cpu" or threads < 1 or world * threads > len(available):
        return None
    cores = sorted(available)
    return set(cores[rank * threads : (rank + 1) * threads])


def pin(rank: int, world: int, threads: int, device: str) -> set[int] | None:
    """Put the calling process on :func:`stage_cores`' cores, before torch and gloo start their threads
    (which inherit them); the cores, or None where the OS places it (not Linux, or they do not fit)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = stage_cores(rank, world, threads, device, os.sched_getaffinity(0))
    if cores is not None:
        os.sched_setaffinity(0, cores)
    return cores


HELPER_THREADS = ("gloo_tcp_loop",)  # gloo's TCP event loop (one per device of the process group)


def _helpers(names: tuple[str, ...]) -> list[int]:
    """Thread ids of this process's threads named ``names``."""
    out = []
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            if (task / "comm").read_text().strip() in names:
                out.append(int(task.name))
        except OSError:  # the thread ended meanwhile
            continue
    return out


def _policy(tid: int) -> int | None:
    try:
        return os.sched_getscheduler(tid)
    except OSError:  # the thread ended meanwhile
        return None


def idle_helpers(names: tuple[str, ...] = HELPER_THREADS) -> list[int]:
    """Put this process's threads named ``names`` at ``SCHED_IDLE``; their thread ids (none off Linux).

    gloo's event loop busy-polls a level-triggered socket while the pair it serves is locked by another
    thread (``Pair::handleEvents``: ``std::try_to_lock``, skip, ``epoll_wait`` again). Woken by a message
    while the stage's main thread was inside gloo holding that lock (posting a receive), it preempted the
    main thread on their shared core and spun until the scheduler took the core back, 3-8 ms, before the
    main thread could let go (docs/engine.md). At ``SCHED_IDLE`` it never preempts the main thread: it runs
    when the main thread waits, which is when a message is wanted. Every process group has a loop of its
    own, so this runs once the stage has made all of its groups (MRV2's broadcast group among them)."""
    if not hasattr(os, "SCHED_IDLE"):
        return []
    done = []
    for tid in _helpers(names):
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            done.append(tid)
        except OSError:  # the thread ended meanwhile
            continue
    return done


def busy_helpers(names: tuple[str, ...] = HELPER_THREADS) -> list[int]:
    """This process's threads named ``names`` not at ``SCHED_IDLE`` (none off Linux): reported by every
    CPU stage at the end of its run, so that a group created after :func:`idle_helpers` shows."""
    if not hasattr(os, "SCHED_IDLE"):
        return []
    return [t for t in _helpers(names) if _policy(t) not in (None, os.SCHED_IDLE)]


def stage_main(cfg: StageConfig, ctrl: Any, results: Any) -> None:
    """Entry point of a stage process (the target :func:`engine.launcher.stage_context` starts)."""
    die_with_parent()  # off Linux the parent-pid check in the control loop still ends the stage
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # its helper threads (engine/transport.py)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(cfg.threads)
    pin(cfg.rank, cfg.world, cfg.threads, cfg.device)
    try:
        _startup_fault(cfg)
        results.put(("phase", cfg.rank, "started"))
        if cfg.world > 1:
            dist.init_process_group(
                cfg.backend,
                init_method=cfg.init_method,
                rank=cfg.rank,
                world_size=cfg.world,
                timeout=timedelta(seconds=cfg.dist_timeout_s),
            )
        results.put(("phase", cfg.rank, "joined"))
        stage = Stage(cfg, ctrl, results)
        if cfg.world > 1 and cfg.device == "cpu":
            idle_helpers()  # every group's loop: the default one's and the data path's own (MRV2's broadcast)
        results.put(("phase", cfg.rank, "loaded"))
        warm_s = stage.warm_up()
        gc.collect()
        gc.freeze()  # as vLLM after start-up: later collections skip the long-lived model objects
        results.put(("ready", cfg.rank, time.perf_counter(), warm_s))
        stage.loop()
        results.put(("bye", cfg.rank))
        if cfg.world > 1:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - report anything, then exit non-zero
        results.put(("error", cfg.rank, traceback.format_exc(limit=8)))  # written before put returns
        os._exit(1)
