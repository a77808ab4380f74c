"""The analytic roofline against real GPU measurements (Vidur's A100/H100 operator profiles)."""

import numpy as np
import pytest

from experiments.analytic_vs_vidur.run import CASES, DATA, TOKENS, analytic_ms, measured_ms

pytestmark = pytest.mark.skipif(not DATA.exists(), reason="shared/data/vidur-profiling not present")


def test_analytic_layer_time_within_measured_band():
    errs = []
    for dev, preset_dev, vidur_model, preset in CASES:
        path = DATA / dev / vidur_model / "mlp.csv"
        for n in TOKENS:
            m = measured_ms(path, n)
            if m is not None:
                errs.append((analytic_ms(preset, preset_dev, n) - m) / m)
    errs = np.abs(errs)
    assert len(errs) >= 40
    assert np.median(errs) < 0.10  # measured: 6.3%
    assert np.max(errs) < 0.35  # worst: small-batch GEMMs below the roofline's efficiency
