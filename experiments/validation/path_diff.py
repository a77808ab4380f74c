"""Where each stage's time went, engine against simulator, for finished ``ppsim validate`` dirs.

``ppsim validate`` prints this as part 6 of its report (:mod:`ppsim.validate.path`); this script
recomputes it from the dirs' ``engine-N/stage_ops.csv`` and ``sim/stage_ops.csv`` (dirs written before
the part existed, or the runs of ``experiments/validation/run.py``), one table per dir, then per dir
the seconds by which the engine's span exceeds the simulator's and how they split: compute, idle
beside other stages, idle pipeline (at light load the spans are set by the arrivals and nearly equal,
while the engine's extra compute shows as less idle time).

Run: python experiments/validation/path_diff.py DIR [...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.validation.control_path import read_ops
from experiments.validation.runfiles import reading_run
from ppsim.cli import Parser, run_main
from ppsim.errors import PPSimError
from ppsim.validate.path import SPLIT, format_path, span_differences, summarize_path


def check_dir(d: Path) -> None:
    """Refuse a dir without what :func:`path_of` reads (checked for every dir before the first table)."""
    if not d.is_dir():
        raise PPSimError(f"dirs: {d} is not a directory; pass ppsim validate output dirs")
    if not any(d.glob("engine-*/stage_ops.csv")) or not (d / "sim" / "stage_ops.csv").is_file():
        raise PPSimError(f"dirs: {d}: no engine-N/stage_ops.csv or sim/stage_ops.csv; pass a ppsim validate output dir")


def path_of(d: Path) -> dict:
    check_dir(d)
    engine = [read_ops(p) for p in sorted(d.glob("engine-*/stage_ops.csv"))]
    return summarize_path(engine, read_ops(d / "sim" / "stage_ops.csv"))


def differences(p: dict) -> str:
    """Per stage: engine span - simulator span, and the same difference of each part, seconds."""
    return "; ".join(
        f"stage {s} {d['span_s']:+.3f} s ({' / '.join(f'{d[k]:+.3f}' for k in SPLIT)})"
        for s, d in span_differences(p).items()
    )


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/path_diff.py", description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="ppsim validate output dirs")
    args = ap.parse_args(argv)
    return run_main(lambda: report(args.dirs))


def report(dirs: list[Path]) -> int:
    for d in dirs:
        check_dir(d)
    summary = []
    for d in dirs:
        with reading_run(d):
            p = path_of(d)
        print(f"## {d.name}\n{format_path(p)}\n")
        summary.append(f"{d.name}: {differences(p)}")
    print("engine span - simulator span, s (busy / idle beside other stages / idle pipeline):")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
