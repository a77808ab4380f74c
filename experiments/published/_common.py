"""Shared output helpers for the published-result scripts: a markdown table and a CSV per result."""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path
from typing import Any

from ppsim.cli import Parser, run_main
from ppsim.metrics.io import atomic_write, save_figure  # noqa: F401 - re-exported to the scripts
from ppsim.outputs import check_output_dir

OUT = Path(__file__).resolve().parent / "out"


def parse_args(argv: list[str] | None, doc: str | None) -> argparse.Namespace:
    """``--out`` and ``--quick``; a bad value or an ``--out`` that cannot be written is one line, exit 2."""
    p = Parser(description=doc)
    p.add_argument("--out", default=str(OUT), help="where the .md/.csv/.png go (default experiments/published/out)")
    p.add_argument("--quick", action="store_true", help="a smaller grid (smoke tests)")
    args = p.parse_args(argv)

    def check() -> None:
        check_output_dir(args.out, "--out", replace=False)

    if code := run_main(check, exit_code=2, signals=False, os_errors=False):  # exit 2 as argparse's errors
        p.exit(code)
    return args


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_result(
    out_dir: str | Path, name: str, title: str, rows: list[dict[str, Any]], columns: list[str], notes: str
) -> str:
    """``name.csv`` and ``name.md`` (title, table, notes) under ``out_dir``; returns the markdown."""
    out = Path(out_dir)
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({c: fmt(r[c]) for c in columns})
    atomic_write(out / f"{name}.csv", buf.getvalue())
    md = f"## {title}\n\n{markdown_table(rows, columns)}\n\n{notes.strip()}\n"
    atomic_write(out / f"{name}.md", md)
    print(md)
    return md


def pyplot():  # noqa: ANN201 - matplotlib's module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
