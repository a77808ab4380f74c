"""Every profile this repository holds still reads, with the negative fits calibration can write
(the bad inputs of tests/bad_inputs_profiles.py are run by tests/test_bad_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.cost.profiled import fit_from_json, read_profile
from ppsim.errors import PPSimError

ROOT = Path(__file__).resolve().parents[1]
PROFILES = sorted(p.parent for p in (*ROOT.glob("profiles/*/fits.json"), *ROOT.glob("experiments/**/fits.json")))


@pytest.mark.parametrize("profile", PROFILES, ids=[str(p.relative_to(ROOT)) for p in PROFILES])
def test_every_profile_in_the_repository_reads(profile):
    assert read_profile(profile).has("attn_decode")


def test_differences_may_be_negative_times_may_not():
    """Glue and handoff are least squares of a difference (calibration/glue_fits.py, calibration/path_fits.py):
    negative terms are
    real fits. An operator's own time is a non-negative least squares of measured times."""
    glue = {"form": "tok_req", "x": "", "coef": {"c0": 1e-4, "tok": -1e-7, "req": -2e-6}}
    assert fit_from_json("layer_glue", glue).tok_req(8, 2) == pytest.approx(1e-4 - 8e-7 - 4e-6)
    assert fit_from_json("handoff", {"form": "linear", "x": "bytes", "coef": {"c0": -1e-5, "c1": 0.0}})
    with pytest.raises(PPSimError, match="operator schedule: coef c0 = -1e-05 is negative"):
        fit_from_json("schedule", {"form": "linear", "x": "n", "coef": {"c0": -1e-5, "c1": 0.0}})
