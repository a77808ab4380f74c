"""Starting, watching and stopping the stage processes.

Processes are forked from a fork server that has torch loaded (:func:`stage_context`; ``spawn``, a fresh
interpreter each, off Linux), joined in a gloo/nccl group over a TCP rendezvous on a free local port. The
group is a context manager: however the run ends (normal stop, stage fault, Ctrl-C), every stage is asked to
stop, then sent SIGTERM, then SIGKILL (a SIGSTOPped stage only yields to SIGKILL), and joined. Every wait is
bounded. A stage that exits or reports an error is a :class:`StageFault`.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

from engine.transport import DirectQueue, Flush, StepMsg, Stop
from engine.worker import StageConfig, stage_main
from ppsim.errors import PPSimError

JOIN_TIMEOUT_S = 3.0


class StageFault(PPSimError):
    """A stage died, reported an error, or stopped making progress."""


class StartupTimeout(StageFault):
    """A stage did not come up within the start-up timeout."""


# start-up phases a stage reports, in order, and where a stage that reported only that one is stuck
PHASES = {
    "spawning": "starting its process (importing torch)",
    "started": "joining the process group",
    "joined": "building its layers and loading weights",
    "loaded": "in its warm-up step",
}


def startup_message(phase: dict[int, str], ready: set[int], timeout_s: float) -> str:
    """Name the stage(s) furthest behind; those waiting on them at a later phase are only named as waiting."""
    missing = sorted(set(phase) - ready)
    order = list(PHASES)
    first = min(order.index(phase[r]) for r in missing)
    behind = [r for r in missing if order.index(phase[r]) == first]
    waiting = [r for r in missing if r not in behind]
    who = f"stage {behind[0]}" if len(behind) == 1 else f"stages {behind}"
    msg = f"{who} did not come up within {timeout_s:g} s (stuck {PHASES[order[first]]})"
    if waiting:
        msg += f"; stage(s) {waiting} were waiting for it"
    return msg + "; raise --startup-timeout-s if the host is only slow"


def stage_context() -> Any:
    """``forkserver`` with torch (and the stage code, :func:`server_preload`) preloaded on Linux, else ``spawn``.
    Linux only: a stage's death with the driver goes through ``PR_SET_PDEATHSIG`` against the server
    (engine/lifetime.py), which other platforms lack."""
    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(server_preload())
    return ctx


def server_preload(cwd: str | None = None, pythonpath: str | None = None) -> list[str]:
    """What the fork server imports once: torch, and ``engine.worker`` (0.2-0.6 s of each stage's start-up) where
    the server would import this very file. The server is ``python -c`` in the driver's working directory and
    environment, and imports before a stage takes the driver's ``sys.path``: a driver that put another checkout
    first on its path (a script run from elsewhere) would get that checkout's stage code from the server. So the
    stage code is preloaded only where the working directory or ``PYTHONPATH`` (``cwd``, ``pythonpath``: default,
    this process's) resolve ``engine`` to this package; elsewhere each stage imports it from its own path."""
    import importlib.machinery

    import engine

    cwd = os.getcwd() if cwd is None else cwd
    pythonpath = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    paths = [cwd, *(p for p in pythonpath.split(os.pathsep) if p)]
    spec = importlib.machinery.PathFinder.find_spec("engine", paths)
    same = (
        spec is not None and spec.origin is not None and Path(spec.origin).resolve() == Path(engine.__file__).resolve()
    )
    return ["torch", "torch.distributed", *(["engine.worker"] if same else [])]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_method() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


class StageGroup:
    """The stage processes, their control queues and the shared result queue."""

    def __init__(self, cfgs: list[StageConfig]) -> None:
        self.cfgs = cfgs
        self.ctx = stage_context()
        self.results = DirectQueue(self.ctx)
        self.ctrls = [DirectQueue(self.ctx) for _ in cfgs]
        self.procs: list[Any] = []
        self.stopping = False

    def __enter__(self) -> StageGroup:
        for cfg, ctrl in zip(self.cfgs, self.ctrls, strict=True):
            p = self.ctx.Process(
                target=stage_main, args=(cfg, ctrl, self.results), daemon=True, name=f"ppsim-stage{cfg.rank}"
            )
            p.start()
            self.procs.append(p)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- messages --------------------------------------------------------------------------------
    def send(self, rank: int, msg: StepMsg | Flush | Stop) -> None:
        self.ctrls[rank].put(msg)

    def check_alive(self, skip: int = -1) -> None:
        dead = self._dead(skip)
        if not dead:
            return
        # a stage's death breaks its peers' connections and they die too: name the one that reported first
        errors = self._errors()
        first = next((r for r in errors if r in dead), dead[0])
        why = errors.get(first)
        code = self.procs[first].exitcode
        raise StageFault(f"stage {first} died (exit code {code})" + (f": {why}" if why else ""))

    def _dead(self, skip: int = -1) -> list[int]:
        """Ranks that exited, but for a clean exit after Stop."""
        return [
            i
            for i, p in enumerate(self.procs)
            if i != skip and p.exitcode is not None and (p.exitcode != 0 or not self.stopping)
        ]

    def _errors(self) -> dict[int, str]:
        """rank -> the last line of its ("error", rank, traceback) report, in the order they were reported.

        A stage flushes its report before exiting, so a dead stage's report is already in the queue.
        Only called when the run is ending on a fault: the other messages drained here are dropped.
        """
        found: dict[int, str] = {}
        while True:
            try:
                msg = self.results.get(timeout=0.05)
            except (queue.Empty, OSError, ValueError, EOFError):
                break
            if msg and msg[0] == "error":
                lines = str(msg[2]).strip().splitlines()
                found.setdefault(msg[1], lines[-1] if lines else "")
        return found

    def get(self, timeout_s: float) -> tuple | None:
        """The next result message, or None after ``timeout_s``; raises StageFault on errors."""
        try:
            msg = self.results.get(timeout=max(0.0, timeout_s)) if timeout_s > 0 else self.results.get_nowait()
        except queue.Empty:
            self.check_alive()
            return None
        if msg[0] == "error":
            self._name_first_failure(msg[1])
            raise StageFault(f"stage {msg[1]} failed: {msg[2].strip().splitlines()[-1]}\n{msg[2]}")
        return msg

    def _name_first_failure(self, rank: int) -> None:
        """``rank`` reported an error: raise naming a peer instead if that peer died first, unreported.

        A stage killed outright breaks its neighbours' connections and they report that; a stage
        that failed reports first and exits, and the neighbours' broken connections come after it.
        """
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            dead = self._dead(skip=rank)
            if dead:
                reported = self._errors()  # reports after ``rank``'s
                silent = [i for i in dead if i not in reported]
                if silent:
                    raise StageFault(f"stage {silent[0]} died (exit code {self.procs[silent[0]].exitcode})")
                return
            time.sleep(0.05)

    def wait_ready(self, timeout_s: float) -> dict[int, tuple[float, float]]:
        """rank -> (stage clock at ready, warm-up step seconds)."""
        ready: dict[int, tuple[float, float]] = {}
        phase = dict.fromkeys(range(len(self.procs)), "spawning")
        deadline = time.monotonic() + timeout_s
        while len(ready) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise StartupTimeout(startup_message(phase, set(ready), timeout_s))
            msg = self.get(min(left, 0.5))
            if msg is not None and msg[0] == "ready":
                ready[msg[1]] = (msg[2], msg[3])
            elif msg is not None and msg[0] == "phase":
                phase[msg[1]] = msg[2]
        return ready

    def stop(self, on_message: Any, timeout_s: float) -> None:
        """Ask every stage to finish its queue, flush and exit; hand trailing messages to ``on_message``."""
        self.stopping = True
        for r in range(len(self.procs)):
            self.send(r, Stop())
        bye: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(bye) < len(self.procs):
            left = deadline - time.monotonic()
            if left <= 0:
                late = sorted(set(range(len(self.procs))) - bye)
                raise StageFault(f"stages {late} did not stop in {timeout_s:.3g} s")
            msg = self.get(min(left, 0.5))
            if msg is None:
                continue
            if msg[0] == "bye":
                bye.add(msg[1])
            else:
                on_message(msg)

    def close(self) -> None:
        """Terminate, kill and join whatever still runs; never blocks for long."""
        if self.stopping:  # stages were told to exit: give them a moment
            for p in self.procs:
                p.join(timeout=JOIN_TIMEOUT_S)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=1.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=JOIN_TIMEOUT_S)
        for q in [*self.ctrls, self.results]:
            q.close()
