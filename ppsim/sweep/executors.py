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
import socket
from collections.abc import Iterator
from typing import Any

from ppsim.errors import PPSimError
from ppsim.sweep.evaluate import Task, error_result, evaluate

POLL_S = 0.5
CONNECT_TIMEOUT_S = 10.0


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def run_serial(tasks: list[Task]) -> Iterator[dict[str, Any]]:
    for t in tasks:
        yield evaluate(t)


def _abort_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Ctrl-C (or the caller stopped reading): drop queued configurations, stop the running ones."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown() forgets them
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:  # else the interpreter's exit would wait for the configurations in flight
        if proc.is_alive():
            proc.terminate()


def run_local(tasks: list[Task], workers: int) -> Iterator[dict[str, Any]]:
    """A process pool of ``workers`` (1 = in this process).

    A configuration whose worker fails outside ``evaluate`` (a crashed process, an unpicklable
    result) is reported as status ``error``; the others go on. On KeyboardInterrupt the pool is
    shut down with its queued configurations cancelled and the interrupt propagates; results
    already yielded are the caller's to keep.
    """
    if workers <= 1 or len(tasks) <= 1:
        yield from run_serial(tasks)
        return
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    pool = cf.ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx)
    finished = False
    try:
        futures = {pool.submit(evaluate, t): t for t in tasks}
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
            for f in done:
                try:
                    r = f.result()
                except Exception as err:  # noqa: BLE001 - e.g. BrokenProcessPool: one row, not the sweep
                    r = error_result(futures[f], err)
                yield r
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            _abort_pool(pool)


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
            _connect_ray(ray, address)
        else:
            ray.init(num_cpus=workers or default_workers(), include_dashboard=False, log_to_driver=False)
        started = True  # ours to shut down (for a cluster: disconnect, the cluster stays up)
    refs: dict[Any, Task] = {}
    try:
        remote = ray.remote(num_cpus=1, max_retries=1)(evaluate)
        refs = {remote.remote(t): t for t in tasks}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
            for ref in done:
                try:
                    r = ray.get(ref, timeout=60)
                except Exception as err:  # noqa: BLE001 - a lost worker or task: one row, not the sweep
                    r = error_result(refs[ref], err)
                yield r
    except BaseException:
        for ref in refs:  # Ctrl-C: stop what is queued or running; finished results are kept
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001, S110 - already finished or gone
                pass
        raise
    finally:
        if started:
            ray.shutdown()


def _connect_ray(ray: Any, address: str) -> None:
    """Join the cluster at ``address``; a failure is one line saying what to check, not a traceback.

    ``ray.init`` waits minutes for a GCS that is not there, so a HOST:PORT address is first probed
    with a plain TCP connection bounded by ``CONNECT_TIMEOUT_S``.
    """
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "://" not in address:
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as err:
            raise PPSimError(
                f"--ray-address: nothing answers at {address} ({err.strerror or err}); start the head there with "
                f"`ray start --head --port {port}`, or fix the address"
            ) from None
    try:
        ray.init(address=address, log_to_driver=False)
    except Exception as err:  # noqa: BLE001 - ConnectionError, AuthenticationError, RuntimeError, ...
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]
        raise PPSimError(
            f"--ray-address: cannot join the Ray cluster at {address} ({last}); start it with "
            "`ray start --head --port PORT` on the head node, and if the cluster uses token authentication "
            "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or ~/.ray/auth_token) here as on the cluster"
        ) from None


def check_executor_flags(executor: str, workers: int | None, ray_address: str | None) -> None:
    """Reject flags the chosen executor would ignore."""
    if workers is not None and workers < 1:
        raise PPSimError("--workers: must be >= 1")
    if ray_address is not None and not ray_address.strip():  # else taken as absent: a local Ray started
        raise PPSimError(
            "--ray-address: empty; give the cluster's HOST:PORT (e.g. 10.0.0.1:6379), or drop --ray-address "
            "to start a local Ray instance"
        )
    if ray_address and executor != "ray":
        raise PPSimError("--ray-address: only used with --executor ray; add --executor ray or drop --ray-address")
    if ray_address and workers is not None:
        raise PPSimError(
            "--workers: ignored when connecting to a Ray cluster (--ray-address), whose CPUs decide; drop --workers"
        )


def run_tasks(
    tasks: list[Task], executor: str, workers: int | None = None, ray_address: str | None = None
) -> Iterator[dict[str, Any]]:
    check_executor_flags(executor, workers, ray_address)
    if executor == "local":
        return run_local(tasks, workers or default_workers())
    if executor == "ray":
        return run_ray(tasks, ray_address, workers)
    raise PPSimError(f"--executor: unknown executor {executor!r}; use local or ray")
