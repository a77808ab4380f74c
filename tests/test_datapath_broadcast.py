"""MRV2's token broadcast on two real gloo processes: the start-up warm broadcast, then a step's tokens."""

from __future__ import annotations

import multiprocessing as mp
import socket
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, serialized: bool, out: mp.Queue) -> None:
    import torch.distributed as dist

    from engine.datapath import TokenBroadcast

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=30)
    )
    try:
        bcast = TokenBroadcast(rank, 2, torch.device("cpu"), serialized, timeout_s=30.0)
        bcast.warm()
        assert not bcast.posted and not bcast.sent  # the warm broadcast leaves nothing behind
        if rank == 1:
            bcast.send([11, 12, 13])
            bcast.close()
        else:
            bcast.post(7, [3, 4, 5])
            out.put(bcast.next_tokens())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("serialized", [False, True])
def test_warm_broadcast_then_a_steps_tokens(serialized: bool) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, serialized, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = out.get(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert got == (7, {3: 11, 4: 12, 5: 13})
    assert [p.exitcode for p in procs] == [0, 0]
