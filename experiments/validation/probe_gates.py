"""Would a gate on the probe's factor have read the probe-conditioned prediction better? (in-sample)

The probe-conditioned prediction (docs/validation.md part 37) scales every stage compute by the factor the
whole-model probe read before the runs. A gate decides how much of that factor to take: ``plain`` none,
``probed`` all of it, ``shrinkW`` the fraction W of its distance from 1, ``deadD`` all of it only where it is
more than D from 1, ``softD`` its distance beyond D. Each committed held-out draw that read the probe
(``results-*seedN.csv`` with ``probe_factor``) carries, per scenario, the plain prediction's error and the
probe-conditioned one's; a gate's factor g in between is read off the straight line through those two
(the simulation is near linear in the compute factor: part 38), so no scenario is simulated again. Per
model it prints each gate's median over draws of the draw's median |error|, and on how many draws that
median is within the target. In-sample: the gates are read on the draws that suggested them; a gate that
won here would still be judged on fresh draws before any use.

Run: python experiments/validation/probe_gates.py [--metric mean_tpot_ms]
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.validation import tally  # noqa: E402
from experiments.validation.tables import TARGETS  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402

HERE = Path(__file__).parent


def _shrink(w: float) -> Callable[[float], float]:
    return lambda f: 1.0 + w * (f - 1.0)


def _dead(d: float) -> Callable[[float], float]:
    return lambda f: f if abs(f - 1.0) > d else 1.0


def _soft(d: float) -> Callable[[float], float]:
    return lambda f: 1.0 + max(0.0, abs(f - 1.0) - d) * (1.0 if f > 1.0 else -1.0)


GATES: dict[str, Callable[[float], float]] = {
    "plain": lambda f: 1.0,
    "probed": lambda f: f,
    **{f"shrink{w:g}": _shrink(w) for w in (0.25, 0.5, 0.75)},
    **{f"dead{d:g}": _dead(d) for d in (0.03, 0.05, 0.08)},
    **{f"soft{d:g}": _soft(d) for d in (0.03, 0.05)},
}


def error_at(row: dict[str, str], g: float, metric: str) -> float:
    """The scenario's error on ``metric`` at compute factor ``g``, on the line through the plain prediction
    (factor 1) and the probe-conditioned one (its ``probe_factor``)."""
    plain, probed, f = float(row[f"{metric}_error"]), float(row[f"{metric}_probed"]), float(row["probe_factor"])
    return plain if abs(f - 1.0) < 1e-9 else plain + (probed - plain) * (g - 1.0) / (f - 1.0)


def draws(folder: Path = HERE) -> dict[tuple[str, int], list[dict[str, str]]]:
    """Held-out rows of every committed draw since seed 30 (``tally.draws``) that read the probe, per (model, seed)."""
    return {(d.model, d.seed): list(d.rows) for d in tally.draws(folder, 30) if d.probed is not None}


def table(found: dict[tuple[str, int], list[dict[str, str]]], metric: str) -> list[str]:
    """One line per model and gate: the median over draws of each draw's median |error|, and how many meet
    the target."""
    lines = []
    for model in sorted({k[0] for k in found}):
        keys = sorted(k for k in found if k[0] == model)
        for name, gate in GATES.items():
            meds = [
                statistics.median(abs(error_at(r, gate(float(r["probe_factor"])), metric)) for r in found[k])
                for k in keys
            ]
            met = sum(m <= TARGETS[metric] for m in meds)
            lines.append(
                f"{model:10s} {name:10s} {statistics.median(meds):6.1%}  within target on {met} of {len(keys)}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/probe_gates.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--metric", default="mean_tpot_ms", choices=[m for m in TARGETS if m != "pipeline_bubble_fraction"])
    args = ap.parse_args(argv)
    found = draws()
    if not found:
        print(f"no held-out results with the probe-conditioned prediction under {HERE}", file=sys.stderr)
        return 2
    print(f"{args.metric}: median over draws of the draw's median |error| (in-sample, {len(found)} draws)")
    print("\n".join(table(found, args.metric)))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
