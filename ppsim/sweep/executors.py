"""Where configurations are evaluated: in this process, a local process pool, or a Ray cluster.

Every executor maps :func:`ppsim.sweep.evaluate.evaluate` over tasks and yields results as they
finish (in completion order; the caller keys them). Waits poll with a timeout so progress can be
drawn and Ctrl-C is honoured. ``evaluate`` is deterministic, so results do not depend on the
executor. Ray is imported only when asked for (``pip install 'ppsim[ray]'``).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
from collections.abc import Iterator
from typing import Any

from ppsim.errors import PPSimError
from ppsim.sweep.evaluate import Task, evaluate

POLL_S = 0.5


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def run_serial(tasks: list[Task]) -> Iterator[dict[str, Any]]:
    for t in tasks:
        yield evaluate(t)


def run_local(tasks: list[Task], workers: int) -> Iterator[dict[str, Any]]:
    """A process pool of ``workers`` (1 = in this process)."""
    if workers <= 1 or len(tasks) <= 1:
        yield from run_serial(tasks)
        return
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        pending = {pool.submit(evaluate, t) for t in tasks}
        try:
            while pending:
                done, pending = cf.wait(pending, timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
                for f in done:
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()


def run_ray(tasks: list[Task], address: str | None, workers: int | None) -> Iterator[dict[str, Any]]:
    """Ray tasks, one per configuration; connects to ``address`` or starts a local instance."""
    try:
        import ray
    except ImportError:
        raise PPSimError(
            "--executor ray: ray is not installed; pip install 'ppsim[ray]' or use --executor local"
        ) from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers or default_workers(), include_dashboard=False, log_to_driver=False)
            started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(evaluate)
        pending = [remote.remote(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in done:
                yield ray.get(ref, timeout=60)
    finally:
        if started:
            ray.shutdown()


def run_tasks(tasks: list[Task], executor: str, workers: int | None = None,
              ray_address: str | None = None) -> Iterator[dict[str, Any]]:
    if executor == "local":
        return run_local(tasks, workers or default_workers())
    if executor == "ray":
        return run_ray(tasks, ray_address, workers)
    raise PPSimError(f"--executor: unknown executor {executor!r}; use local or ray")
