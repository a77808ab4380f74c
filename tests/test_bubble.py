import json

import pytest

from ppsim.bubble import analytic_bubble, bubble_rows, simulate_microbatches
from ppsim.metrics.summary import busy_fractions


def test_bubble_closed_form_all_rows():
    rows = bubble_rows()
    assert len(rows) == 15
    for r in rows:
        assert r["simulated"] == pytest.approx(r["analytic"], abs=1e-9)


def test_bubble_one_microbatch_is_one_minus_one_over_p():
    for p in (2, 4, 8):
        _, b, _ = busy_fractions(simulate_microbatches(p, 1), p)
        assert b == pytest.approx(1 - 1 / p)
        assert analytic_bubble(p, 1) == pytest.approx(1 - 1 / p)


def test_bubble_cli_json(ppsim_cli):
    r = ppsim_cli("bubble", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {tuple(sorted(x)) for x in rows} == {("analytic", "microbatches", "pp", "simulated")}
    assert {(x["pp"], x["microbatches"]) for x in rows} == {(p, m) for p in (2, 4, 8) for m in (4, 8, 16, 32, 64)}
