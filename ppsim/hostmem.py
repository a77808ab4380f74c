"""The host's available memory, read from /proc/meminfo (Linux); tests point :data:`MEMINFO` at a file."""

from __future__ import annotations

import re
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def host_available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo: what the kernel can hand out without swapping; None if unknown
    (not Linux, or a file without that line), in which case callers skip their check."""
    try:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", MEMINFO.read_text(), re.MULTILINE)
    except (OSError, ValueError):  # unreadable, or not text
        return None
    return int(found.group(1)) * 1024 if found else None
