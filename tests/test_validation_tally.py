"""experiments/validation/tally.py: the held-out tally from the committed results, and the README's sentence on it."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from experiments.validation import tally
from experiments.validation.tables import TARGETS

ROOT = Path(__file__).resolve().parents[1]


def _draw(path: Path, rows: list[dict[str, object]]) -> None:
    """A results CSV of held-out scenarios: every metric's error and replay 0 unless a row says otherwise."""
    cols = ["set", "scenario", "policy"] + [f"{m}_{k}" for m in TARGETS for k in ("error", "adjusted", "spread")]
    cols += sorted({k for r in rows for k in r} - set(cols))  # e.g. the probe-conditioned *_probed
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        for i, r in enumerate(rows):
            w.writerow({c: 0.0 for c in cols} | {"set": "held-out", "scenario": f"h{i}", "policy": "p"} | r)


def test_a_draw_meets_a_target_when_its_median_abs_error_is_within_it(tmp_path):
    """TPOT at -4%, +6%, +5% (median |error| 5%: met, at the limit) and the bubble at 0.06 points in the replay
    (missed there only); a development row is not counted; another draw misses TPOT at 7%."""
    tpot = "mean_tpot_ms_error"
    _draw(tmp_path / "results-dense-1024-seed31.csv", [{tpot: -0.04}, {tpot: 0.06}, {tpot: 0.05}])
    with (tmp_path / "results-dense-1024-seed31.csv").open("a") as f:
        f.write("development,d0,p" + ",9.0" * 3 * len(TARGETS) + "\n")
    _draw(tmp_path / "results-seed32.csv", [{"pipeline_bubble_fraction_adjusted": 0.06}])
    _draw(tmp_path / "results-dense-1024-seed33.csv", [{tpot: 0.07, "mean_tpot_ms_adjusted": 0.01}])
    _draw(tmp_path / "results-dense-1024-seed29.csv", [{tpot: 0.5}])  # before --since
    found = tally.draws(tmp_path, 30)
    assert [(d.model, d.seed) for d in found] == [("dense-1024", 31), ("dense-1024", 33), ("tiny", 32)]
    assert [d.missed for d in found] == [[], ["mean_tpot_ms"], []]
    assert [d.replay_missed for d in found] == [[], [], ["pipeline_bubble_fraction"]]
    assert tally.summary(found) == tally.Tally(
        draws=3, met={"dense-1024": [31], "tiny": [32]}, missed=1, missed_tpot=1, tpot_range=(0.07, 0.07), replay_met=2
    )
    pol = tally.per_policy(found)
    assert sorted(pol) == [("dense-1024", "p"), ("tiny", "p")]
    assert pol[("dense-1024", "p")]["n"] == 4 and pol[("dense-1024", "p")]["mean_tpot_ms"] == pytest.approx(0.055)


def test_the_probe_conditioned_prediction_is_counted_on_the_draws_that_read_it(tmp_path, capsys):
    """A draw whose results carry ``*_probed`` (part 37) counts there: TPOT 12% plain, 4% probe-conditioned (met);
    another misses TPOT at 6% with it; a draw from before it is not counted."""
    probed = {f"{m}_probed": 0.0 for m in TARGETS}
    _draw(tmp_path / "results-seed70.csv", [{"mean_tpot_ms_error": 0.12, **probed, "mean_tpot_ms_probed": 0.04}])
    _draw(tmp_path / "results-seed71.csv", [{"mean_tpot_ms_error": 0.12, **probed, "mean_tpot_ms_probed": -0.06}])
    _draw(tmp_path / "results-seed69.csv", [{"mean_tpot_ms_error": 0.12}])
    found = tally.draws(tmp_path, 30)
    assert [d.probed_missed for d in found] == [None, [], ["mean_tpot_ms"]]
    t = tally.summary(found)
    assert (t.probed_draws, t.probed_met, t.missed) == (2, 1, 3)
    assert tally.main(["--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny seed 70: mean_tpot_ms 12.0%; replay: met every target; probe-conditioned: met every target" in out
    assert "tiny seed 71: mean_tpot_ms 12.0%; replay: met every target; probe-conditioned: mean_tpot_ms" in out
    assert "the probe-conditioned prediction 1 of the 2 that read it" in out
    # per policy over the scenarios that read it (70, 71): TPOT |4%|, |-6%| -> 5%; the other relative metrics 0 and
    # seed 69's scenario left out of it, the plain prediction's 12% TPOT on the same two scenarios beside it
    cell = tally.per_policy(found)[("tiny", "p")]
    assert (cell["n"], cell["n_probed"]) == (3, 2)
    assert cell["mean_tpot_ms_probed"] == pytest.approx(0.05) and cell["all_probed"] == 0.0
    assert tally.probed_cell(cell) == "0.0% (TPOT 5.0%; plain 0.0%)"
    assert "| tiny | p | 2 | 0.0% (TPOT 5.0%; plain 0.0%) |" in out
    _draw(tmp_path / "results-seed72.csv", [{"policy": "q"}])
    assert tally.probed_cell(tally.per_policy(tally.draws(tmp_path, 72))[("tiny", "q")]) == "-"


def test_the_report_and_its_refusals(tmp_path, capsys):
    _draw(tmp_path / "results-seed40.csv", [{"mean_tpot_ms_error": 0.3}])
    assert tally.main(["--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny seed 40: mean_tpot_ms 30.0%; replay: met every target" in out
    assert "the other 1 of the 1 draws of seeds 30-40 missed a target, 1 of them TPOT (TPOT 30.0%-30.0%)" in out
    assert "| tiny | p | 1 | 0.0% (±0.0%) / 0.0% | 30.0% (±0.0%) / 0.0% | 0.0% / 0.0% |" in out
    for argv, fragment in [
        (["--dir", str(tmp_path / "missing")], "is not a directory"),
        (["--dir", str(tmp_path), "--since", "41"], "no results-*seedN.csv with N >= 41"),
        (["--dir", str(tmp_path), "--since", "30", "--until", "39"], "no results-*seedN.csv with N >= 30 and <= 39"),
    ]:
        assert tally.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --dir: ") and err.count("\n") == 1 and fragment in err
    (tmp_path / "results-seed40.csv").write_text("set,policy,mean_tpot_ms_error\nheld-out,p,x\n")
    assert tally.main(["--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no number in column" in err
    for argv, fragment in [(["--since", "-1"], "--since: -1 must be"), (["--since", "40", "--until", "39"], "below")]:
        with pytest.raises(SystemExit) as stop:
            tally.main(argv)
        assert stop.value.code == 2 and fragment in capsys.readouterr().err


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def test_the_readme_states_the_tally_of_the_committed_draws():
    """The front page's held-out sentence is what tally.py computes from the committed results: the draws since
    seed 30 that met every target, how many others there are, how many of them missed TPOT and their TPOT range, and the
    replay's count. A new draw committed without the README brought up to date fails here."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    m = re.search(
        r"`dense-1024` met every target on held-out seeds ([\d, -]+) \(TPOT [^)]*\), `tiny` on ([\d, -]+); "
        r"the other (\d+) of the (\d+) draws since seed 30 missed a target, (\d+) of them TPOT "
        r"\(([\d.]+)-([\d.]+)%\)[^.]*\. "
        r"With the runs' speed \(replay\) (\d+) of (\d+) meet every target.*?"
        r"every target on (\d+) of the (\d+) held-out draws that read it",
        readme,
    )
    assert m, "the README's held-out tally sentence has changed form; update this test with it"
    t = tally.summary(tally.draws(ROOT / "experiments" / "validation", 30))
    assert [x for x in _seeds(m[1]) if x >= 30] == t.met["dense-1024"]
    assert _seeds(m[2]) == t.met["tiny"]
    assert (int(m[3]), int(m[4]), int(m[5])) == (t.missed, t.draws, t.missed_tpot)
    assert t.tpot_range is not None
    lo, hi = t.tpot_range
    assert (m[6], m[7]) == (f"{lo:.1%}"[:-1], f"{hi:.0%}"[:-1])
    assert (int(m[8]), int(m[9])) == (t.replay_met, t.draws)
    assert (int(m[10]), int(m[11])) == (t.probed_met, t.probed_draws)


def test_the_readmes_per_policy_column_is_the_tally_of_those_draws():
    """The per-policy table's column over many `dense-1024` draws ("seeds A-B") is tally.py's median |error| (engine
    spread) / replay of each policy over every held-out scenario of those draws."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith("| ")]
    head = next(ln for ln in lines if ln.startswith("| policy |") and "held-out, seeds" in ln)
    cols = [c.strip() for c in head.strip("|").split("|")]
    col = next(i for i, c in enumerate(cols) if "held-out, seeds" in c)
    lo, hi = map(int, re.search(r"seeds (\d+)-(\d+)", cols[col]).groups())
    cells = tally.per_policy(tally.draws(ROOT / "experiments" / "validation", lo, hi))
    rows = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines) if len(c) == len(cols)}
    policies = [p for (model, p) in cells if model == "dense-1024"]
    assert len(policies) == 7
    for p in policies:
        assert rows[p][col] == tally.policy_cell(cells[("dense-1024", p)]), p


def test_the_readmes_probe_conditioned_column_is_the_tally_of_the_draws_that_read_it():
    """The per-policy table's probe-conditioned column ("probe-conditioned, dense-1024 seeds A-B / tiny C-D") is
    tally.py's median |error| of each model's scenarios that read the probe, the plain prediction's beside it."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith("| ")]
    head = next(ln for ln in lines if ln.startswith("| policy |") and "probe-conditioned" in ln)
    cols = [c.strip() for c in head.strip("|").split("|")]
    col = next(i for i, c in enumerate(cols) if "probe-conditioned" in c)
    found = tally.draws(ROOT / "experiments" / "validation", 30)
    m = re.search(r"dense-1024 seeds (\d+)-(\d+) / tiny (\d+)-(\d+)", cols[col])
    assert m, cols[col]
    assert (int(m[1]), int(m[2])) == tally.probed_seeds(found, "dense-1024")
    assert (int(m[3]), int(m[4])) == tally.probed_seeds(found, "tiny")
    cells = tally.per_policy(found)
    rows = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines) if len(c) == len(cols)}
    policies = [p for (model, p) in cells if model == "dense-1024"]
    assert len(policies) == 7
    for p in policies:
        assert rows[p][col] == tally.probed_pair(cells[("dense-1024", p)], cells[("tiny", p)]), p


def test_the_probed_pair_and_seeds(tmp_path):
    probed = {f"{m}_probed": 0.0 for m in TARGETS}
    _draw(tmp_path / "results-seed70.csv", [{**probed, "mean_tpot_ms_probed": 0.5, "mean_tpot_ms_error": 0.9}] * 2)
    _draw(tmp_path / "results-dense-1024-seed91.csv", [{**probed}])
    _draw(tmp_path / "results-dense-1024-seed60.csv", [{}])
    found = tally.draws(tmp_path, 30)
    assert tally.probed_seeds(found, "dense-1024") == (91, 91) and tally.probed_seeds(found, "tiny") == (70, 70)
    cells = tally.per_policy(found)
    # tiny: one metric of six at 50% on each scenario: the median over the twelve values is 0
    assert tally.probed_pair(cells[("dense-1024", "p")], cells[("tiny", "p")]) == "0.0% / 0.0% (0.0% / 0.0%)"
    # three more tiny scenarios at 2% on every metric: 18 of the 30 values, the median 2%
    _draw(tmp_path / "results-seed71.csv", [{**probed, **{f"{m}_probed": 0.02 for m in TARGETS}}] * 3)
    cells = tally.per_policy(tally.draws(tmp_path, 30))
    assert cells[("tiny", "p")]["n_probed"] == 5
    assert tally.probed_pair(cells[("dense-1024", "p")], cells[("tiny", "p")]) == "0.0% / 2.0% (0.0% / 0.0%)"
    assert tally.probed_seeds(tally.draws(tmp_path, 30, 69), "tiny") is None
    lone = tally.per_policy(tally.draws(tmp_path, 60, 60))[("dense-1024", "p")]
    assert tally.probed_pair(lone, cells[("tiny", "p")]) == "-"
