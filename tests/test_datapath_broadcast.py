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


def _link_rank(rank: int, world: int, port: int, out: mp.Queue) -> None:
    import torch.distributed as dist

    from engine.transport import StageLink

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    try:
        link = StageLink(rank, world, 8, torch.float32, torch.device("cpu"), host_staged=False)
        link.warm(timedelta(seconds=30))
        # a step's tensors after the warm messages: each rank receives exactly what its neighbour sent
        pending = link.post_recv(0, 2) if rank > 0 else None
        if rank < world - 1:
            link.send(0, torch.full((2, 8), float(rank)), torch.full((2, 8), float(rank) + 0.5))
            link.wait_sends()
        if pending is not None:
            h, r = link.wait_recv(pending)
            out.put((rank, float(h[0, 0]), float(r[0, 0])))
    finally:
        dist.destroy_process_group()


def test_link_warm_messages_every_route_and_leaves_steps_untouched() -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port, world = _free_port(), 3
    procs = [ctx.Process(target=_link_rank, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = sorted(out.get(timeout=60) for _ in range(world - 1))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    assert got == [(1, 0.0, 0.5), (2, 1.0, 1.5)]
    assert [p.exitcode for p in procs] == [0] * world
