"""A child process that dies with its parent.

Every helper process this project spawns (the engine's stages, calibration's co-running stage, its
link and control-path partners) asks the kernel to SIGKILL it when its parent dies
(``PR_SET_PDEATHSIG``), so that a parent ended by a signal that skips its clean-up (SIGTERM, SIGKILL)
leaves nothing behind: calibration's co-running stage spends most of its life stopped (SIGSTOP) and
would otherwise stay so forever.
"""

from __future__ import annotations

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
    if parent is not None and os.getppid() != parent.pid:  # it died before the request: nobody will signal
        os._exit(1)
