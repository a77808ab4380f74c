"""The analytic model against real GPU measurements (Vidur's A100 / H100 / A40 profiles).

The data is found at $PPSIM_VIDUR_ROOT, else ../shared/data/vidur-profiling beside the repository.
"""

import numpy as np
import pytest

from experiments.analytic_vs_vidur.data import VIDUR_ROOT
from experiments.analytic_vs_vidur.run import CASES, DATA, TOKENS, analytic_ms, measured_ms
from experiments.analytic_vs_vidur.steps import all_cases, compare_case

pytestmark = pytest.mark.skipif(
    not (VIDUR_ROOT / "compute").is_dir(), reason=f"Vidur profiling data not at {VIDUR_ROOT}; set PPSIM_VIDUR_ROOT"
)


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
    assert np.median(errs) < 0.05  # measured: 3.6% (6.3% before the per-kernel model)
    assert np.max(errs) < 0.20  # worst 16.2%: H100 GEMMs at 512 tokens, a step in cuBLAS's kernel choice


def test_stage_step_times_match_the_imported_profile():
    """Whole-model stage step times, decode and prefill over the grid, every device / model / TP in the data.

    Measured (run_steps.py, steps.md): 2.9% (train) / 2.8% (held-out) median over all points, 9.6% /
    10.1% p90, worst 20.2%; 131 of 136 (device, model, TP, kind) medians within 10% (the 5 misses: the
    all-reduce table's noise), 135 of 136 cases with every point within 20%; 2 points beyond 20%, both
    inside the all-reduce table's own scatter. Before this model: 16.2% / 14.7% median, 51% worst.
    """
    cases = all_cases()
    assert len(cases) >= 40 and {c[0] for c in cases} == {"a100", "h100", "a40"}
    by_case, worst, errs, beyond = {}, {}, {"train": [], "held-out": []}, []
    for case in cases:
        rows, _ = compare_case(*case)
        for kind in ("decode", "prefill"):
            e = np.abs([r["error"] for r in rows if r["kind"] == kind])
            by_case[(*case[:2], case[3], case[4], kind)] = np.median(e)
            worst[(*case[:2], case[3], case[4], kind)] = e.max()
        for r in rows:
            errs[r["split"]].append(abs(r["error"]))
            beyond.append(abs(r["error_beyond_ar_scatter"]))
    med, wst, beyond = np.array(list(by_case.values())), np.array(list(worst.values())), np.array(beyond)
    assert np.median(errs["train"]) < 0.035 and np.median(errs["held-out"]) < 0.035
    assert np.percentile(errs["train"], 90) < 0.11 and np.percentile(errs["held-out"], 90) < 0.11
    assert max(max(errs["train"]), max(errs["held-out"])) < 0.21
    assert np.mean(med <= 0.10) >= 0.95, sorted(k for k, v in by_case.items() if v > 0.10)
    assert med.max() < 0.15, max(by_case, key=by_case.get)  # the misses: A100 TP4, all-reduce table noise
    assert np.mean(wst <= 0.20) >= 0.99, sorted(k for k, v in worst.items() if v > 0.20)
    n_all = sum(len(v) for v in errs.values())
    assert beyond.max() <= 0.20 and n_all >= 4000  # every point within 20% of a reference in its scatter
