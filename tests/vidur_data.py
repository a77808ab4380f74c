"""Where the tests find Vidur's measured GPU profiles (a Vidur checkout's ``data/profiling``).

``$PPSIM_VIDUR_ROOT`` when set, else ``../shared/data/vidur-profiling`` beside this repository.
Tests that need the data skip with :data:`SKIP_REASON` when neither holds it.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "PPSIM_VIDUR_ROOT"
BESIDE_REPO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur-profiling"


def vidur_root() -> Path:
    env = os.environ.get(ENV)
    return Path(env) if env else BESIDE_REPO


VIDUR_ROOT = vidur_root()
PRESENT = (VIDUR_ROOT / "compute").is_dir()
SKIP_REASON = (
    f"Vidur profiling data not found at {VIDUR_ROOT}: set {ENV} to a Vidur checkout's data/profiling "
    f"(or place it at {BESIDE_REPO})"
)
