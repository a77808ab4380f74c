"""The engine's process queues (engine/transport.py DirectQueue) and where its CPU stages run
(engine/worker.py stage_cores)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time

import pytest

from engine.transport import PIPE_BYTES, DirectQueue
from engine.worker import stage_cores


def _put_and_exit(q: DirectQueue, rank: int) -> None:
    for i in range(3):
        q.put(("msg", rank, i, "x" * 20_000))
    os._exit(1)  # as a failing stage does right after its error report: no feeder thread to flush


def test_a_put_is_written_before_it_returns_even_if_the_writer_exits_at_once():
    ctx = mp.get_context("spawn")
    q = DirectQueue(ctx)
    procs = [ctx.Process(target=_put_and_exit, args=(q, r)) for r in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=30) for _ in range(6)]
    for p in procs:
        p.join(timeout=30)
    q.close()
    assert sorted((m[1], m[2]) for m in got) == [(r, i) for r in range(2) for i in range(3)]
    assert all(len(m[3]) == 20_000 for m in got)  # many writers, no message interleaved with another
    assert [p.exitcode for p in procs] == [1, 1]


def test_get_waits_its_timeout_then_raises_empty():
    q = DirectQueue(mp.get_context("spawn"))
    with pytest.raises(queue.Empty):
        q.get_nowait()
    t = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.1)
    assert time.monotonic() - t >= 0.09
    q.put(("ready", 0))
    assert q.get(timeout=1.0) == ("ready", 0)
    q.close()


def _pipe_max_bytes() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except OSError:  # not Linux
        return 0


@pytest.mark.skipif(_pipe_max_bytes() < PIPE_BYTES, reason="the OS allows no 1 MiB pipe")
def test_the_pipe_holds_more_than_the_default_64_kib_where_the_os_allows():
    q = DirectQueue(mp.get_context("spawn"))
    for _ in range(12):  # 12 x ~20 KB: a default pipe (64 KiB) would block the writer here
        q.put("y" * 20_000)
    assert [len(q.get(timeout=1.0)) for _ in range(12)] == [20_000] * 12
    q.close()


def test_cpu_stages_get_cores_of_their_own_where_they_fit():
    cores = {0, 1, 2, 3}
    assert [stage_cores(r, 2, 1, "cpu", cores) for r in range(2)] == [{0}, {1}]
    assert [stage_cores(r, 2, 2, "cpu", cores) for r in range(2)] == [{0, 1}, {2, 3}]
    assert stage_cores(0, 1, 1, "cpu", {4, 7}) == {4}  # the cores this process may use, in order
    assert stage_cores(3, 4, 1, "cpu", {2, 3, 5, 8}) == {8}


def test_stages_that_do_not_fit_or_run_on_gpus_are_left_to_the_os():
    assert stage_cores(0, 4, 1, "cpu", {0, 1}) is None  # PP=4 on 2 cores
    assert stage_cores(0, 2, 2, "cpu", {0, 1, 2}) is None
    assert stage_cores(0, 2, 1, "cuda", {0, 1, 2, 3}) is None


def _pinned(q: DirectQueue, rank: int, world: int) -> None:
    from engine.worker import pin

    q.put((pin(rank, world, 1, "cpu"), os.sched_getaffinity(0)))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2 cores")
def test_a_pinned_process_runs_on_its_own_core_only():
    ctx = mp.get_context("spawn")
    q = DirectQueue(ctx)
    p = ctx.Process(target=_pinned, args=(q, 1, 2))
    p.start()
    got, now = q.get(timeout=60)
    p.join(timeout=30)
    q.close()
    assert got == now and len(now) == 1  # one core, the second of those this process may use
    assert now == stage_cores(1, 2, 1, "cpu", os.sched_getaffinity(0))


def _gloo_idle(q: DirectQueue, rank: int, port: int) -> None:
    import torch.distributed as dist

    from engine.worker import idle_helpers

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tids = idle_helpers()
    pid = os.getpid()
    main_policy = os.sched_getscheduler(0)
    loop_policies = [os.sched_getscheduler(t) for t in tids]
    names = [open(f"/proc/{pid}/task/{t}/comm").read().strip() for t in tids]
    dist.barrier()
    dist.destroy_process_group()
    q.put((rank, names, loop_policies, main_policy))


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies")
def test_gloo_event_loop_threads_run_at_sched_idle_and_the_main_thread_does_not():
    from engine.launcher import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    q = DirectQueue(ctx)
    procs = [ctx.Process(target=_gloo_idle, args=(q, r, port)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    q.close()
    for rank, names, loop_policies, main_policy in got:
        assert names and set(names) == {"gloo_tcp_loop"}, rank  # gloo's event loop was found and changed
        assert loop_policies == [os.SCHED_IDLE] * len(names)
        assert main_policy == os.SCHED_OTHER  # the stage's own thread keeps the default policy
