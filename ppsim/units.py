"""Binary byte units, and sizes written in them for messages (no dependencies: imported by ppsim, the
engine and calibration alike)."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, to 3 significant digits: 32.0 KiB, 3.00 TiB."""
    i = 0
    while n >= 1024 and i < len(_UNITS) - 1:
        n, i = n / 1024, i + 1
    decimals = 0 if i == 0 or n >= 100 else (1 if n >= 10 else 2)
    return f"{n:.{decimals}f} {_UNITS[i]}"


def format_gib(n: float, decimals: int = 1) -> str:
    """``n`` bytes in GiB to a fixed number of decimals, whatever its size: 0.3 GiB, 131.4 GiB."""
    return f"{n / GIB:.{decimals}f} GiB"
