"""Where Vidur's profiling data is, and which (device, model) folders of it ppsim can model.

The data root is ``$PPSIM_VIDUR_ROOT`` when set, else ``../shared/data/vidur-profiling`` beside the
repository (the layout of a checkout next to the shared data). :func:`main_of` is the scripts' entry
point: a missing root or a damaged table is one line naming ``PPSIM_VIDUR_ROOT`` and the file, exit 2.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from calibration.vidur_import import (  # the importer's checked readers: file, line, column named
    DEVICE_PRESET,
    PRESET_TO_VIDUR,
    Row,
    checked_rows,
    int_cell,
    num_cell,
)
from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError

ROOT_VAR = "PPSIM_VIDUR_ROOT"
VIDUR_ROOT = Path(
    os.environ.get(ROOT_VAR) or Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur-profiling"
)
FIX = f"set {ROOT_VAR} to Vidur's profiling data (data/profiling of a Vidur checkout)"
VIDUR_TO_PRESET = {v: k for k, v in PRESET_TO_VIDUR.items()}
# Folders left out, and why (each is reported in results.md).
SKIPPED = {
    "microsoft/phi-2": "GELU MLP without a gate and a parallel attention/MLP block: ppsim models gated (SwiGLU) "
    "MLPs only, and Vidur profiled it at TP 1 only",
}
MAX_TOKENS = 4096  # Vidur's tables reach 4096 tokens for every model (32768 for Llama-3)


def rows(path: Path) -> list[Row]:
    """``path``'s rows; a missing, non-UTF-8 or truncated file is a :class:`PPSimError` naming it."""
    return checked_rows(path)


def check_root() -> None:
    """The data root holds the compute table of at least one (device, model) that ppsim models."""
    if not VIDUR_ROOT.is_dir():
        raise PPSimError(f"{VIDUR_ROOT} is not a directory; {FIX}")
    if not cases():
        raise PPSimError(
            f"{VIDUR_ROOT} holds no compute/<device>/<org>/<model>/mlp.csv of a device and model ppsim has "
            f"presets for; {FIX}"
        )


def main_of(doc: str, work: Callable[[], object], argv: list[str] | None = None) -> int:
    """A script's entry point: no flags (``--help`` says what it does), the data root checked, then
    ``work``; bad data is one line naming PPSIM_VIDUR_ROOT and the file, exit status 2."""
    Parser(description=doc.split("\n\n")[0], epilog=f"Reads ${ROOT_VAR} (now {VIDUR_ROOT}).").parse_args(argv)

    def checked_work() -> None:
        try:
            check_root()
            work()
        except PPSimError as err:
            msg = str(err)
            for flag in ("--root: ", f"{ROOT_VAR}: "):  # the importer names its flag: here the variable
                msg = msg.removeprefix(flag)
            raise PPSimError(msg) from None

    # every error names the variable, exit 2 (an OutputError's too); Ctrl-C and OSError unhandled as before
    return run_main(checked_work, prefix=f"{ROOT_VAR}: ", exit_code=2, signals=False, os_errors=False)


def cases() -> list[tuple[str, str, str, str]]:
    """(vidur device, ppsim device preset, vidur model, ppsim model preset) for every usable mlp.csv."""
    out = []
    for path in sorted((VIDUR_ROOT / "compute").glob("*/*/*/mlp.csv")):
        dev = path.parents[2].name
        vm = str(path.parent.relative_to(path.parents[2]))
        if vm in VIDUR_TO_PRESET and dev in DEVICE_PRESET:
            out.append((dev, DEVICE_PRESET[dev], vm, VIDUR_TO_PRESET[vm]))
    return out


def skipped() -> list[tuple[str, str]]:
    """(folder, reason) for every mlp.csv the comparison leaves out."""
    out = []
    for path in sorted((VIDUR_ROOT / "compute").glob("*/*/*/mlp.csv")):
        dev, vm = path.parents[2].name, str(path.parent.relative_to(path.parents[2]))
        if vm not in VIDUR_TO_PRESET:
            out.append((f"{dev}/{vm}", SKIPPED.get(vm, "no ppsim model preset")))
        elif dev not in DEVICE_PRESET:
            out.append((f"{dev}/{vm}", "no ppsim device preset"))
    return out


def gemm_table(path: Path) -> Iterator[tuple[int, int, dict[str, float]]]:
    """(tp, tokens, {vidur op: median seconds}) per row of an mlp.csv, up to MAX_TOKENS tokens."""
    for r in rows(path):
        T = int_cell(r, "num_tokens")
        if T <= MAX_TOKENS:
            ops = {
                k.split(".")[1]: num_cell(r, k) * 1e-3
                for k, v in r.items()
                if k.startswith("time_stats.") and k.endswith(".median") and v != ""
            }
            yield int_cell(r, "num_tensor_parallel_workers"), T, ops
