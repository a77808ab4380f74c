"""The held-out tally the README states, recomputed from the committed results of every draw.

Each held-out draw of ``run.py`` commits ``results-dense-1024-seedN.csv`` (``dense-1024``) or ``results-seedN.csv``
(``tiny``): one row per scenario with each metric's error and its speed-adjusted replay. A draw meets a target when
the median |error| over its held-out scenarios is within it (``tables.TARGETS``: 5% throughput and TPOT, 10% TTFT and
E2EL at p50 and p99, 0.05 bubble points), the test ``results-*.md`` prints as "met". This script reads every draw
since ``--since`` and prints, per draw, what it missed; then how many met every target, the range of TPOT among the
others, and how many meet every target with the runs' own speed (the replay: not a prediction) and with the
probe-conditioned prediction (docs/validation.md part 37: a prediction, read before the runs; counted over the draws
whose results carry it, ``*_probed``, since seeds 70 / 91); then per policy the median |error| of TPOT and median
TTFT over every held-out scenario of those draws, plain and replayed, and the probe-conditioned prediction's over the
scenarios of the draws that read it (beside the plain prediction's on those same scenarios).
``tests/test_validation_tally.py`` checks the README's sentence against it. Each draw counts as it was predicted when
it ran (the model of that day): the tally is of predictions made, not a re-prediction with today's model.

Run: python experiments/validation/tally.py [--since 30] [--until N] [--dir experiments/validation]
"""

from __future__ import annotations

import csv
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments.validation.tables import RELATIVE, TARGETS  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402
from ppsim.errors import PPSimError  # noqa: E402

HERE = Path(__file__).resolve().parent
FILES = {"dense-1024": re.compile(r"results-dense-1024-seed(\d+)\.csv"), "tiny": re.compile(r"results-seed(\d+)\.csv")}
POLICY_METRICS = ("mean_tpot_ms", "median_ttft_ms")


@dataclass(frozen=True)
class Draw:
    model: str
    seed: int
    errors: dict[str, float]  # metric -> median |error| over the draw's held-out scenarios
    replay: dict[str, float]  # the same of the speed-adjusted replay
    rows: tuple[dict[str, str], ...]
    probed: dict[str, float] | None = None  # the same of the probe-conditioned prediction; None: not read

    @property
    def probed_missed(self) -> list[str] | None:
        return None if self.probed is None else [m for m, lim in TARGETS.items() if self.probed[m] > lim]

    @property
    def missed(self) -> list[str]:
        return [m for m, lim in TARGETS.items() if self.errors[m] > lim]

    @property
    def replay_missed(self) -> list[str]:
        return [m for m, lim in TARGETS.items() if self.replay[m] > lim]


def _median_abs(rows: list[dict[str, str]], column: str, where: Path) -> float:
    try:
        return statistics.median(abs(float(r[column])) for r in rows)
    except (KeyError, ValueError) as err:
        raise PPSimError(f"--dir: {where} has no number in column {column} ({err}); run.py writes it") from None


def probe_read(row: dict[str, str], metrics: Iterable[str]) -> bool:
    """Whether a results row carries the probe-conditioned prediction (``*_probed``) of every one of ``metrics``."""
    return all(row.get(f"{m}_probed") not in (None, "") for m in metrics)


def read_draw(path: Path, model: str, seed: int) -> Draw:
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("set") == "held-out"]
    if not rows:
        raise PPSimError(f"--dir: {path} has no held-out scenario; give the folder of run.py's held-out results")
    errors = {m: _median_abs(rows, f"{m}_error", path) for m in TARGETS}
    replay = {m: _median_abs(rows, f"{m}_adjusted", path) for m in TARGETS}
    read = all(probe_read(r, TARGETS) for r in rows)
    probed = {m: _median_abs(rows, f"{m}_probed", path) for m in TARGETS} if read else None
    return Draw(model, seed, errors, replay, tuple(rows), probed)


def draws(folder: Path, since: int, until: int | None = None) -> list[Draw]:
    """Every committed held-out draw of seed ``since`` to ``until`` (default: the last) in ``folder``, by model then
    seed."""
    if not folder.is_dir():
        raise PPSimError(f"--dir: {folder} is not a directory; give the folder of run.py's results files")
    found = []
    for path in folder.iterdir():
        for model, pattern in FILES.items():
            m = pattern.fullmatch(path.name)
            if m and int(m[1]) >= since and (until is None or int(m[1]) <= until):
                found.append(read_draw(path, model, int(m[1])))
    if not found:
        upto = "" if until is None else f" and <= {until}"
        raise PPSimError(f"--dir: no results-*seedN.csv with N >= {since}{upto} in {folder}; widen --since / --until")
    return sorted(found, key=lambda d: (d.model, d.seed))


@dataclass(frozen=True)
class Tally:
    """What the README's sentence states about ``draws``."""

    draws: int
    met: dict[str, list[int]]  # model -> seeds of the draws that met every target
    missed: int  # the other draws
    missed_tpot: int  # of them, those that missed TPOT
    tpot_range: tuple[float, float] | None  # the TPOT median |error| of those that missed TPOT, lowest and highest
    replay_met: int  # draws whose replay meets every target
    probed_draws: int = 0  # draws whose results carry the probe-conditioned prediction
    probed_met: int = 0  # of them, those it meets every target on


def summary(found: list[Draw]) -> Tally:
    others = [d for d in found if d.missed]
    tpot = [d.errors["mean_tpot_ms"] for d in others if "mean_tpot_ms" in d.missed]
    return Tally(
        draws=len(found),
        met={model: [d.seed for d in found if d.model == model and not d.missed] for model in FILES},
        missed=len(others),
        missed_tpot=sum("mean_tpot_ms" in d.missed for d in others),
        tpot_range=(min(tpot), max(tpot)) if tpot else None,
        replay_met=sum(not d.replay_missed for d in found),
        probed_draws=sum(d.probed is not None for d in found),
        probed_met=sum(d.probed_missed == [] for d in found),
    )


def per_policy(found: list[Draw]) -> dict[tuple[str, str], dict[str, float]]:
    """(model, policy) -> scenarios; ``all``: the median |error| over them and the relative metrics, as results.md's
    policy table, with the replay's (``all_replay``) and the engine spread (``all_spread``); the median |error| of
    ``POLICY_METRICS``, plain and replayed, and TPOT's median engine spread: over every held-out scenario of
    ``found``."""
    by: dict[tuple[str, str], list[dict[str, str]]] = {}
    for d in found:
        for r in d.rows:
            by.setdefault((d.model, r["policy"]), []).append(r)
    out = {}
    for key, rows in sorted(by.items()):
        cell: dict[str, float] = {"n": len(rows)}
        cell["mean_tpot_ms_spread"] = statistics.median(float(r["mean_tpot_ms_spread"]) for r in rows)
        # as results.md's policy table: the median over scenarios and the relative metrics, the spread beside it
        for name, col in (("all", "error"), ("all_replay", "adjusted"), ("all_spread", "spread")):
            cell[name] = statistics.median(abs(float(r[f"{m}_{col}"])) for r in rows for m in RELATIVE)
        for m in POLICY_METRICS:
            cell[m] = statistics.median(abs(float(r[f"{m}_error"])) for r in rows)
            cell[f"{m}_replay"] = statistics.median(abs(float(r[f"{m}_adjusted"])) for r in rows)
        probed = [r for r in rows if probe_read(r, RELATIVE)]
        cell["n_probed"] = len(probed)
        if probed:  # the probe-conditioned prediction, over the scenarios of the draws that read it
            cell["all_probed"] = statistics.median(abs(float(r[f"{m}_probed"])) for r in probed for m in RELATIVE)
            cell["mean_tpot_ms_probed"] = statistics.median(abs(float(r["mean_tpot_ms_probed"])) for r in probed)
            cell["all_plain_of_probed"] = statistics.median(
                abs(float(r[f"{m}_error"])) for r in probed for m in RELATIVE
            )
        out[key] = cell
    return out


def policy_cell(c: dict[str, float]) -> str:
    """A :func:`per_policy` cell as the README's per-policy table shows it: median |error| (engine spread) / replay."""
    return f"{c['all']:.1%} (±{c['all_spread']:.1%}) / {c['all_replay']:.1%}"


def probed_cell(c: dict[str, float]) -> str:
    """A :func:`per_policy` cell's probe-conditioned prediction: median |error| over the metrics, TPOT's, and the plain
    prediction's median |error| on the same scenarios; ``-`` where no draw of the policy read it."""
    if not c["n_probed"]:
        return "-"
    return f"{c['all_probed']:.1%} (TPOT {c['mean_tpot_ms_probed']:.1%}; plain {c['all_plain_of_probed']:.1%})"


def probed_pair(dense: dict[str, float], tiny: dict[str, float]) -> str:
    """The README's per-policy probe-conditioned cell: median |error| of ``dense-1024`` / ``tiny`` over the scenarios
    that read the probe, the plain prediction's on the same scenarios in brackets."""
    if not (dense["n_probed"] and tiny["n_probed"]):
        return "-"
    return (
        f"{dense['all_probed']:.1%} / {tiny['all_probed']:.1%} "
        f"({dense['all_plain_of_probed']:.1%} / {tiny['all_plain_of_probed']:.1%})"
    )


def probed_seeds(found: list[Draw], model: str) -> tuple[int, int] | None:
    """The first and last seed of ``model``'s draws that read the probe; None: none did."""
    seeds = [d.seed for d in found if d.model == model and d.probed is not None]
    return (min(seeds), max(seeds)) if seeds else None


def _cell(m: str, v: float) -> str:
    return f"{v:.3f}" if m == "pipeline_bubble_fraction" else f"{v:.1%}"


def report(folder: Path, since: int, until: int | None) -> None:
    found = draws(folder, since, until)
    for d in found:
        missed = ", ".join(f"{m} {_cell(m, d.errors[m])}" for m in d.missed) or "every target met"
        replay = ", ".join(d.replay_missed) or "every target"
        probed = (
            ""
            if d.probed_missed is None
            else f"; probe-conditioned: {', '.join(d.probed_missed) or 'met every target'}"
        )
        print(
            f"{d.model} seed {d.seed}: {missed}; replay: {'met ' + replay if not d.replay_missed else replay}{probed}"
        )
    t = summary(found)
    met = "; ".join(f"{model} {', '.join(map(str, seeds)) or 'none'}" for model, seeds in t.met.items())
    print(f"met every target: {met}")
    span = f" (TPOT {t.tpot_range[0]:.1%}-{t.tpot_range[1]:.1%})" if t.tpot_range else ""
    seeds = f"{since}-{max(d.seed for d in found)}"
    print(
        f"the other {t.missed} of the {t.draws} draws of seeds {seeds} missed a target, "
        f"{t.missed_tpot} of them TPOT{span}; with the runs' speed (replay) {t.replay_met} of {t.draws} "
        f"meet every target; the probe-conditioned prediction {t.probed_met} of the {t.probed_draws} that read it"
    )
    print(
        "\n| model | policy | scenarios | median \\|error\\| (engine spread) / replay | TPOT (engine spread) / replay "
        "| median TTFT / replay |"
    )
    print("|---|---|---|---|---|---|")
    cells = per_policy(found)
    for (model, policy), c in cells.items():
        every = policy_cell(c)
        tpot = f"{c['mean_tpot_ms']:.1%} (±{c['mean_tpot_ms_spread']:.1%}) / {c['mean_tpot_ms_replay']:.1%}"
        ttft = f"{c['median_ttft_ms']:.1%} / {c['median_ttft_ms_replay']:.1%}"
        print(f"| {model} | {policy} | {c['n']:.0f} | {every} | {tpot} | {ttft} |")
    print(
        "\n| model | policy | scenarios that read the probe | probe-conditioned: median \\|error\\| (TPOT; plain "
        "prediction on the same scenarios) |"
    )
    print("|---|---|---|---|")
    for (model, policy), c in cells.items():
        print(f"| {model} | {policy} | {c['n_probed']:.0f} | {probed_cell(c)} |")


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/tally.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--since", type=int, default=30, help="the first seed counted (default 30)")
    ap.add_argument("--until", type=int, help="the last seed counted (default: every later one)")
    ap.add_argument("--dir", default=str(HERE), help="the folder of run.py's committed results files")
    args = ap.parse_args(argv)
    if args.since < 0:
        ap.error(f"--since: {args.since} must be a seed, 0 or more")
    if args.until is not None and args.until < args.since:
        ap.error(f"--until: {args.until} is below --since {args.since}; give a range of seeds")
    return run_main(lambda: report(Path(args.dir), args.since, args.until))


if __name__ == "__main__":
    sys.exit(main())
