"""Which reading of the host, taken between engine repeats, tracks the repeat's own speed?

``ppsim validate`` reads the host before and after every engine repeat (``validation.json`` ``host``,
:mod:`ppsim.validate.host`): the pure-Python CPU probe, the engine-step probe (a fixed 4-layer stage of
``tiny``) and, since the whole-model probe (``engine/probe.py::model_probe``), the validated model's own
decode step at its whole footprint. Each against its reading at calibration is a slow-down (+0.12: 12%
slower now). The repeat's own slow-down is its step level: the engine's stage computes against the
profile's prediction for the same plans (``step_cost.by_run``: ``1 / (1 + median error) - 1``, thread CPU
time as calibration times). ``price``: the whole-model probe against what the run's profile charges for
that step (``host.model_price_s``, or priced here from the profile for a run from before it); ``shaped``: the
same model on the predicted run's own decode step against the price of that step (part 44). Per
repeat, a probe's reading is the mean of the one before and the one after it. Two more columns read what a
user has before the runs, both against the price: ``before``, the whole-model probe read just before this
repeat alone, and ``drawn``, the mean of those readings over all the validation's repeats (what the
probe-conditioned prediction scales by, ``HostGuard.probe_factor``): where ``before`` misses the level by
less than ``drawn`` does, the probe follows the repeats one by one, not only the draw (part 38's reading,
``--by-draw``).

For each probe: how many repeats it was read on, Pearson's r with the step level over them, the
median |probe - level| (how far a prediction scaled by that probe would still be from the run's own
speed; the row ``none`` is the level itself, the plain prediction's miss), and the same with the
offset taken out, ``mad``: the median |d - median d| of d = level - probe, against the level's own
(``none``): how much of the repeat-to-repeat movement the probe follows, whatever the calibration
reading it is divided by (a single calibration reading moves by 20% on this VM). Over every repeat and
over the PP = 1 repeats alone (no live co-run charge in their level). Writes nothing.

``--conditioned``: instead, per validation, the plain prediction's error and the probe-conditioned one's
(``probe_conditioned`` in ``validation.json``: every stage compute scaled by the probe before each repeat over
the profile's price) on each target metric, and whether the latter is for / against / level on TPOT (0.5
point): a MoE B's reading for part 37's rule (docs/validation.md).

With ``--csv FILE`` (and ``--label``, ``--reading draw|run``) it appends those errors in ``glue_live.py``'s
``--csv`` form, compare ``plain:probed``, for ``glue_live.py judge FILE``. ``--compare probed:shaped`` reads
the probe-conditioned prediction against the shaped probe's (``probe_shaped``: the whole model on the predicted
run's own decode step, part 44) instead.

Run: python experiments/validation/host_probes.py [--conditioned [--compare plain:probed|probed:shaped]
     [--csv FILE --label NAME --reading draw|run]] RUNS [RUNS ...]
     (a ``--runs`` folder of run.py or moe.py, or any folder holding ``validation.json`` files)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.validation.glue_live import CLOSER as LEVEL  # noqa: E402  (a TPOT reading within it: level)
from experiments.validation.glue_live import FIELDS  # noqa: E402
from experiments.validation.tables import SHOWN  # noqa: E402
from ppsim.cli import Parser, run_main  # noqa: E402

PROBES = (  # (column, reading's key, reference's key in validation.json host)
    ("cpu", "probe_s", "reference_probe_s"),
    ("stage", "stage_probe_s", "stage_reference_s"),
    ("model", "model_probe_s", "model_reference_s"),
    ("price", "model_probe_s", "model_price_s"),
    ("shaped", "shaped_probe_s", "shaped_price_s"),  # part 44: the model on the run's own decode step, over its price
)
BEFORE = ("before", "drawn")  # the whole-model probe before this repeat / before every repeat, over the price
COLUMNS = (*(c for c, _, _ in PROBES), *BEFORE)
_prices: dict[tuple[str, str], float | None] = {}


def price_of(v: dict[str, Any]) -> float | None:
    """``host.model_price_s``, or for a run from before it, the run's profile's price of the probe's step
    (``engine/probe.py::model_price``; None where the profile is gone)."""
    got = (v.get("host") or {}).get("model_price_s")
    if got:
        return float(got)
    s = v.get("scenario") or {}
    prof, model = str((s.get("cost") or {}).get("profile_dir") or ""), str(s.get("model") or "")
    if (prof, model) not in _prices:
        _prices[(prof, model)] = None
        if prof and model and (Path(prof) / "fits.json").is_file():
            from engine.probe import model_price
            from ppsim.models.shape import load_model

            _prices[(prof, model)] = model_price(prof, load_model(model))
    return _prices[(prof, model)]


def repeat_rows(v: dict[str, Any], scenario: str) -> list[dict[str, Any]]:
    """One row per engine repeat of one validation: its step level and each probe's slow-down."""
    h, by_run = dict(v.get("host") or {}), (v.get("step_cost") or {}).get("by_run") or {}
    if any(r.get("model_probe_s") for r in h.get("readings") or []):
        h["model_price_s"] = price_of(v)
    readings = h.get("readings") or []
    rows = []
    for run, st in sorted(by_run.items(), key=lambda kv: int(kv[0])):
        err = st.get("median_cpu_error", st.get("median_error"))
        if err is None or err <= -1:
            continue
        pp = int(((v.get("scenario") or {}).get("cluster") or {}).get("pipeline_parallel_size", 0))
        row: dict[str, Any] = {"scenario": scenario, "pp": pp, "repeat": int(run), "level": 1.0 / (1.0 + err) - 1.0}
        around = [r for r in readings if r.get("when") in (f"before {run}", f"after {run}")]
        for col, key, ref in PROBES:
            got = [r[key] for r in around if r.get(key)]
            reference = h.get(ref)
            row[col] = statistics.fmean(got) / reference - 1.0 if got and reference else None
        row.update(before_columns(readings, run, h.get("model_price_s")))
        rows.append(row)
    return rows


def before_columns(readings: list[dict[str, Any]], run: str, price: float | None) -> dict[str, float | None]:
    """``before``: the whole-model probe read just before repeat ``run`` over the price, - 1; ``drawn``: the
    mean of the readings before every repeat over it, - 1 (None where not read or not priced)."""

    def vs(got: list[float]) -> float | None:
        return statistics.fmean(got) / price - 1.0 if got and price else None

    befores = [r for r in readings if str(r.get("when", "")).startswith("before") and r.get("model_probe_s")]
    return {
        "before": vs([r["model_probe_s"] for r in befores if r["when"] == f"before {run}"]),
        "drawn": vs([r["model_probe_s"] for r in befores]),
    }


def collect(paths: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for p in paths:
        for f in sorted(Path(p).rglob("validation.json")):
            rows += [{**r, "draw": p} for r in repeat_rows(json.loads(f.read_text()), f.parent.name)]
    return rows


def by_draw(rows: list[dict[str, Any]], reading: str) -> tuple[list[str], dict[str, int]]:
    """Part 38's readings: per draw (``reading`` = ``draw``: each RUNS folder) or per validation (``run``),
    the median over its repeats of |before - level| and of |drawn - level|; ``for`` where the probe before
    each repeat misses by less than the draw's mean of them (by more than :data:`LEVEL`), ``against``
    where by more, else ``level``. Returns the lines and the count of each."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["before"] is not None and r["drawn"] is not None:
            groups.setdefault(r["draw"] if reading == "draw" else f"{r['draw']}/{r['scenario']}", []).append(r)
    lines, counts = [], {"for": 0, "against": 0, "level": 0}
    for name, rs in groups.items():
        each = statistics.median(abs(r["before"] - r["level"]) for r in rs)
        mean = statistics.median(abs(r["drawn"] - r["level"]) for r in rs)
        got = "level" if abs(each - mean) <= LEVEL else "for" if each < mean else "against"
        counts[got] += 1
        lines.append(
            f"{name}: {len(rs)} repeats, median |before - level| {each:.3f}, |drawn - level| {mean:.3f}; {got}"
        )
    return lines, counts


def pearson(xs: list[float], ys: list[float]) -> float:
    try:
        return statistics.correlation(xs, ys) if len(xs) >= 3 else math.nan
    except statistics.StatisticsError:
        return math.nan


def mad(xs: list[float]) -> float:
    """Median absolute deviation from the median."""
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per probe: repeats read, r with the level, median |probe - level|, mad of level - probe; ``none``:
    median |level|, mad of the level."""
    levels = [r["level"] for r in rows]
    out = [
        f"none   n {len(rows):3d}  median |level| {statistics.median(abs(x) for x in levels):.3f}"
        f"  mad {mad(levels):.3f}"
    ]
    for col in COLUMNS:
        pairs = [(r[col], r["level"]) for r in rows if r[col] is not None]
        if not pairs:
            out.append(f"{col:6s} n   0")
            continue
        xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
        miss = statistics.median(abs(a - b) for a, b in pairs)
        plain = statistics.median(abs(b) for b in ys)
        out.append(
            f"{col:6s} n {len(pairs):3d}  r {pearson(xs, ys):+.2f}  median |probe - level| {miss:.3f}"
            f"  mad {mad([b - a for a, b in pairs]):.3f}  (on the same repeats: |level| {plain:.3f}, mad {mad(ys):.3f})"
        )
    return out


CONDITIONED = (SHOWN[0], "mean_ttft_ms", *SHOWN[1:])  # the targets, and the mean TTFT moe.py reports


# --compare: (the base's key in validation.json, None for the plain prediction; the new one's)
PAIRS = {
    "plain:probed": (None, "probe_conditioned"),
    "probed:shaped": ("probe_conditioned", "probe_shaped"),  # part 44's trial: probe_conditioned the fixed probe's
    "fixed:probed": ("probe_fixed", "probe_conditioned"),  # since its adoption: probe_conditioned the shaped probe's
}


def errors_of(v: dict[str, Any], key: str | None) -> dict[str, float]:
    """Per-metric errors of the plain prediction (``key`` None) or of ``v[key]`` ({}: not there)."""
    rows = v.get("rows", []) if key is None else (v.get(key) or {}).get("rows", [])
    return {r["metric"]: r["error"] for r in rows}


def conditioned_line(name: str, v: dict[str, Any], compare: str = "plain:probed") -> str | None:
    """One validation's errors of the two predictions ``compare`` names (by default the plain and the
    probe-conditioned), and the TPOT reading; None without the second."""
    base_key, new_key = PAIRS[compare]
    pc = v.get(new_key)
    if not pc:
        return None
    plain, probed = errors_of(v, base_key), errors_of(v, new_key)
    cells = [f"{m} {plain[m]:+.3f} -> {probed[m]:+.3f}" for m in CONDITIONED if m in plain and m in probed]
    a, b = abs(plain.get("mean_tpot_ms", 0.0)), abs(probed.get("mean_tpot_ms", 0.0))
    reading = "level" if abs(a - b) <= LEVEL else "for" if b < a else "against"
    factors = " -> ".join(f"{(v.get(k) or {}).get('factor', 1.0):.3f}" for k in (base_key, new_key) if k)
    step = f" (step {pc['step'][0]}@{pc['step'][1]})" if pc.get("step") else ""
    return f"{name}: factor {factors}{step}; " + ", ".join(cells) + f"; TPOT {reading}"


def fmt(x: float | None) -> str:
    return "    -" if x is None else f"{x:+.3f}"


def write_csv(
    path: str,
    label: str,
    reading: str,
    profile: str,
    found: list[tuple[str, dict[str, Any]]],
    compare: str = "plain:probed",
) -> int:
    """Append one row per validation and metric in ``glue_live.py``'s ``--csv`` form (compare ``plain:probed``:
    base = the plain prediction's error, new = the probe-conditioned one's, part 37's rule; ``probed:shaped``:
    base = the probe-conditioned, new = the shaped probe's, part 44's), for ``glue_live.py judge``.
    ``reading``: ``draw`` (all of ``found`` one reading, ``label``) or ``run`` (each one)."""
    from experiments.validation.replay_adjusted import COLUMNS

    base_key, new_key = PAIRS[compare]
    out = []
    for name, v in found:
        plain, probed = errors_of(v, base_key), errors_of(v, new_key)
        key = label if reading == "draw" else f"{label}/{name}"
        out += [
            [compare, key, profile, f"{label}/{name}", m, plain[m], probed[m]]
            for m in COLUMNS
            if m in probed and m in plain
        ]
    fresh = not Path(path).exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if fresh:
            w.writerow(FIELDS)
        w.writerows(out)
    return len(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = Parser(prog="experiments/validation/host_probes.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="--runs folders of run.py or moe.py (validation.json below them)")
    ap.add_argument("--conditioned", action="store_true", help="the plain and probe-conditioned errors instead")
    ap.add_argument(
        "--by-draw", action="store_true", help="part 38: the probe before each repeat against the draw's mean of them"
    )
    ap.add_argument("--csv", help="with --conditioned: append glue_live.py judge's rows to this file")
    ap.add_argument("--label", default="RUNS", help="the reading's name in --csv (e.g. TINY70, MOE79)")
    ap.add_argument(
        "--reading", choices=("draw", "run"), default="draw", help="one reading per draw (RUNS folder) or per run"
    )
    ap.add_argument("--profile-name", default="profile", help="the profile column of --csv")
    ap.add_argument(
        "--compare",
        choices=tuple(PAIRS),
        default="plain:probed",
        help="with --conditioned: the two predictions read (part 37: plain:probed; part 44: probed:shaped on its "
        "trial's runs, fixed:probed since)",
    )
    args = ap.parse_args(argv)
    if args.csv and not args.conditioned:
        ap.error("--csv: goes with --conditioned (it writes the plain and probe-conditioned errors)")
    if args.compare != "plain:probed" and not args.conditioned:
        ap.error("--compare: goes with --conditioned (it names the two predictions read)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [p for p in args.runs if not Path(p).is_dir()]
    if missing:
        print(f"RUNS: {missing[0]} is not a folder; give a --runs folder of run.py or moe.py", file=sys.stderr)
        return 2
    if args.conditioned:
        base_key, new_key = PAIRS[args.compare]
        found = [
            (f.parent.name, v)
            for p in args.runs
            for f in sorted(Path(p).rglob("validation.json"))
            if (v := json.loads(f.read_text())).get(new_key) and (base_key is None or v.get(base_key))
        ]
        if not found:
            print(f"RUNS: no {new_key.replace('_', ' ')} prediction under {', '.join(args.runs)}", file=sys.stderr)
            return 2
        print("\n".join(line for name, v in found if (line := conditioned_line(name, v, args.compare))))
        if args.csv:
            n = write_csv(args.csv, args.label, args.reading, args.profile_name, found, args.compare)
            print(f"{n} rows appended to {args.csv}")
        return 0
    rows = collect(args.runs)
    if not rows:
        print(f"RUNS: no validation.json with step costs under {', '.join(args.runs)}", file=sys.stderr)
        return 2
    if args.by_draw:
        lines, counts = by_draw(rows, args.reading)
        if not lines:
            print("RUNS: no repeat with the whole-model probe read before it and priced", file=sys.stderr)
            return 2
        print("\n".join(lines) + "\n" + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return 0
    print("scenario                                  rep   level    cpu  stage  model  price shaped before  drawn")
    for r in rows:
        probes = " ".join(fmt(r[c]) for c in ("level", *COLUMNS))
        print(f"{r['scenario'][:40]:40s} {r['repeat']:4d} {probes}")
    print("all repeats:\n" + "\n".join(summary(rows)))
    one = [r for r in rows if r["pp"] == 1]
    if one:
        print("PP = 1 repeats:\n" + "\n".join(summary(one)))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
