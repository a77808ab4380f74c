"""Expected distinct experts under an unbalanced router load (pure; no torch)."""

from __future__ import annotations

import numpy as np
import pytest

from ppsim.models.moe import expected_experts_touched, expected_experts_touched_load


@pytest.mark.parametrize("E, k", [(8, 2), (64, 6), (256, 8)])
@pytest.mark.parametrize("skew", [1.0, 2.5])
def test_uniform_load_is_the_uniform_formula(E, k, skew):
    for T in (1, 3, 8, 64, 1000):
        got = expected_experts_touched_load([k / E] * E, T, skew)
        assert got == pytest.approx(expected_experts_touched(E, k, T, skew), rel=1e-9)


def test_unbalanced_load_matches_monte_carlo_and_touches_fewer():
    """Independent tokens each picking expert e with probability load[e] (one expert per token: k = 1)."""
    load = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02])
    rng = np.random.default_rng(0)
    for T in (1, 4, 16, 64):
        picks = rng.choice(len(load), size=(20000, T), p=load)
        mc = np.mean([len(np.unique(row)) for row in picks])
        assert expected_experts_touched_load(list(load), T) == pytest.approx(mc, rel=0.01)
        assert expected_experts_touched_load(list(load), T) <= expected_experts_touched(len(load), 1, T) + 1e-12
    assert expected_experts_touched_load(list(load), 0) == 0.0
    assert expected_experts_touched_load(list(load), 1) == pytest.approx(1.0)
