"""The engine's control path: how long a launch message takes to reach a stage, and sampled tokens
to come back to the engine core.

The live engine (``engine/launcher.py``) sends each micro-batch to its stages as a pickled
:class:`engine.transport.StepMsg` on a ``multiprocessing`` queue (spawn context) and receives the
last stage's sampled tokens on another. This profiler times exactly that path between two spawned
processes: the driver puts a ``StepMsg`` of ``n`` items, the child stamps its arrival
(``time.perf_counter``, the host-wide monotonic clock on Linux, so one-way times are exact), and
answers with a tokens message of ``n`` ids, which the driver stamps. Medians over repeats, for
``n`` in the scheduler grid. Every wait has a timeout.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from calibration.core_path import rows_of
from ppsim.errors import PPSimError

WARMUP = 5


def _step_msg(n: int, step_id: int) -> Any:
    from engine.transport import StepItem, StepMsg

    items = tuple(StepItem(i, 100, 1, True, tuple(range(i * 8, i * 8 + 8))) for i in range(n))
    return StepMsg(step_id, items, tuple(range(n)))


def _child(ctrl: Any, results: Any) -> None:
    from engine.lifetime import die_with_parent

    die_with_parent()
    while True:
        msg = ctrl.get(timeout=60)
        if msg is None:
            return
        t_arrive = time.perf_counter()
        ids = [it.req_id for it in msg.items]
        results.put(("tokens", msg.step_id, ids, [0] * len(ids), t_arrive, time.perf_counter()))


def _answer(results: Any, proc: Any, timeout_s: float) -> tuple:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            if not proc.is_alive():
                raise PPSimError(f"control profiler: the child process died (exit code {proc.exitcode})") from None
    raise PPSimError(f"control profiler: no answer within {timeout_s:.0f} s; retry")


def profile_control(ns: tuple[int, ...], repeats: int = 30, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Rows ``launch`` and ``return`` (one-way seconds) per message size ``n``."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    ctrl, results = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_child, args=(ctrl, results), daemon=True)
    proc.start()
    launch: dict[int, list[float]] = {n: [] for n in ns}
    ret: dict[int, list[float]] = {n: [] for n in ns}
    try:
        step = 0
        for i in range(repeats + WARMUP):
            for n in ns:  # sizes interleaved, so a burst of load hits all of them alike
                msg = _step_msg(n, step)
                time.sleep(0.002)  # the receiver is idle and blocked in get(), as a waiting stage is
                t_put = time.perf_counter()
                ctrl.put(msg)
                _, _, _, _, t_arrive, t_sent = _answer(results, proc, timeout_s)
                t_back = time.perf_counter()
                step += 1
                if i >= WARMUP:
                    launch[n].append(t_arrive - t_put)
                    ret[n].append(t_back - t_sent)
    finally:
        try:
            ctrl.put(None)
        except Exception:  # noqa: BLE001 - the child may already be gone
            pass
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
    return rows_of(
        {op: [(n, x) for n, xs in data.items() for x in xs] for op, data in (("launch", launch), ("return", ret))}
    )
