"""MRV2's token broadcast on two real gloo processes: the start-up warm broadcast, then a step's tokens."""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from engine.launcher import init_method  # noqa: E402 - after the torch check


def _rank(rank: int, init: str, serialized: bool, out: mp.Queue) -> None:
    import torch.distributed as dist

    from engine.datapath import TokenBroadcast

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=30))
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


def _run_ranks(target, world: int, *args) -> tuple[list, list[int | None]]:  # noqa: ANN001
    """``target(rank, *args, out)`` in ``world`` spawned processes: (what they put on ``out``, their exit codes)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    got = []
    try:
        while len(got) < world - 1:  # every rank but one reports
            got.append(out.get(timeout=60))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return got, [p.exitcode for p in procs]


@pytest.mark.parametrize("serialized", [False, True])
def test_warm_broadcast_then_a_steps_tokens(serialized: bool) -> None:
    got, codes = _run_ranks(_rank, 2, init_method(), serialized)
    assert got == [(7, {3: 11, 4: 12, 5: 13})]
    assert codes == [0, 0]


def _link_rank(rank: int, world: int, init: str, out: mp.Queue) -> None:
    import torch.distributed as dist

    from engine.transport import StageLink

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=30))
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
    world = 3
    got, codes = _run_ranks(_link_rank, world, world, init_method())
    assert sorted(got) == [(1, 0.0, 0.5), (2, 1.0, 1.5)]
    assert codes == [0] * world
