"""Reading finished ``ppsim validate`` output dirs in the analysis scripts: a damaged file is one line."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ppsim.errors import PPSimError


@contextmanager
def reading_run(d: str | Path, flag: str = "dirs") -> Iterator[None]:
    """Turn what a damaged ``validation.json`` / ``*.csv`` of run dir ``d`` raises while it is read (bad
    JSON or numbers, a missing key or column) into one :class:`PPSimError` naming the dir."""
    try:
        yield
    except PPSimError:
        raise
    except (KeyError, ValueError, TypeError, IndexError, csv.Error) as err:
        what = f"{type(err).__name__}: {err}"
        raise PPSimError(
            f"{flag}: {d} holds a damaged validation.json or CSV ({what[:200]}); run `ppsim validate` again"
        ) from None
