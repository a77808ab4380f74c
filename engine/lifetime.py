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
    """Call first thing in a child; off Linux it does nothing (the callers' own timeouts still end them).

    A ``spawn`` child whose parent died before the request exits at once (nobody would signal it). A child of
    the engine's fork server (:func:`engine.launcher.stage_context`) has that server for its parent: it gives up
    its copy of the server's lifeline (:func:`_drop_fork_server_lifeline`), so the server exits once the driver
    has, whenever that was, and the kernel then kills the child."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if _drop_fork_server_lifeline():
        return
    parent = multiprocessing.parent_process()  # None outside a multiprocessing child
    if parent is not None and os.getppid() != parent.pid:  # it died before the request: nobody will signal
        os._exit(1)


def _drop_fork_server_lifeline() -> bool:
    """A ``forkserver`` child holds a copy of its starter's end of the pipe that keeps the fork server running
    (so that it could start processes through the same server); while any child holds it the server outlives
    its starter, and the children, whose parent it is, would outlive both. This project's children start none
    that way: close it, so that the server exits when its starter does. Whether this is such a child."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None or getattr(server, "_forkserver_pid", None) is not None:  # None: not a child; a pid: the starter
        return False
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None
    return True
