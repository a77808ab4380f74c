"""A child process that dies with its parent.

Every helper process this project spawns (the engine's stages, calibration's co-running stage, its
link and control-path partners) asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG``), so that a parent ended by a signal that skips its clean-up (SIGTERM, SIGKILL)
leaves nothing behind: calibration's co-running stage spends most of its life stopped (SIGSTOP) and
would otherwise stay so forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Call first thing in a child; off Linux it does nothing (the callers' own timeouts still end them)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    parent = multiprocessing.parent_process()  # None outside a multiprocessing child
    if parent is not None and not _still_there(parent.pid):  # it died before the request: nobody will signal
        os._exit(1)
    _drop_fork_server_lifeline()


def _drop_fork_server_lifeline() -> None:
    """A ``forkserver`` child holds a copy of its starter's end of the pipe that keeps the fork server running
    (so that it could start processes through the same server); while any child holds it the server outlives
    its starter, and the children, whose parent it is, would outlive both. This project's children start none
    that way: close it, so that the server exits when its starter does and the kernel then kills them."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:  # None: not a child; a pid: the starter
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None


def _still_there(pid: int) -> bool:
    """Whether the process that started this one (``pid``) is alive. A ``spawn`` child's parent is that process
    itself; a ``forkserver`` child's is the fork server, which exits once that process has (its end of the server's
    pipe closes), so the request above reached a live fork server if that process is still there afterwards."""
    if os.getppid() == pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (a reused pid: not ours, but not gone either)
        return True
    return True
