"""experiments/validation/plan_class.py: step-level errors split by plan class, and its refusals."""

from __future__ import annotations

import csv

import pytest

from experiments.validation import plan_class as pc

FIELDS = ["run", "stage", "step_id", "num_tokens", "num_reqs", "num_prefill_tokens", "cpu_error"]


def _write(d, rows):
    d.mkdir(parents=True)
    with open(d / "step_costs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for i, (tokens, prefill, err) in enumerate(rows):
            w.writerow([0, 0, i, tokens, 1, prefill, err])


def test_classes_and_difference():
    rows = [
        {"num_tokens": "64", "num_prefill_tokens": "64", "cpu_error": "-0.10"},
        {"num_tokens": "65", "num_prefill_tokens": "64", "cpu_error": "-0.20"},
        {"num_tokens": "1", "num_prefill_tokens": "0", "cpu_error": "0.05"},
        {"num_tokens": "2", "num_prefill_tokens": "0", "cpu_error": "0.01"},
    ]
    errs = pc.class_errors(rows)
    assert errs == {"prefill": [-0.10], "mixed": [-0.20], "decode": [0.05, 0.01]}
    assert pc.prefill_minus_decode(errs) == pytest.approx(-0.15 - 0.03)
    assert pc.prefill_minus_decode({"prefill": [], "mixed": [], "decode": [0.1]}) is None


def test_runs_report_searches_one_level(tmp_path, capsys):
    _write(tmp_path / "set" / "a", [(64, 64, -0.1), (1, 0, 0.0), (1, 0, 0.02)])
    _write(tmp_path / "set" / "b", [(1, 0, 0.0)])  # no prefill: no difference
    assert pc.main(["runs", str(tmp_path / "set")]) == 0
    out = capsys.readouterr().out
    assert "a " in out and "b " in out
    assert "median prefill - decode: -0.110 over 1 scenarios, 1 below zero" in out


@pytest.mark.parametrize(
    "argv, fragment", [(["runs", "/nonexistent-ppsim"], "does not exist"), (["runs", "."], "no step_costs.csv")]
)
def test_runs_refuses_in_one_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pc.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1 and fragment in captured.err
    assert captured.out == ""


def test_runs_names_a_damaged_csv(tmp_path, capsys):
    d = tmp_path / "a"
    d.mkdir()
    (d / "step_costs.csv").write_text("num_tokens,num_prefill_tokens,cpu_error\n64,64,x\n")
    assert pc.main(["runs", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: dirs: {d} holds a damaged validation.json or CSV") and err.count("\n") == 1


OPS_HEADER = "track,kind,step_id,start_s,end_s,num_tokens,num_reqs,num_prefill_tokens,num_decode_tokens,nbytes\n"


def _gap_run(d, measured_s=0.005, predicted_s=0.005, every_s=0.0102):
    """Two stages, three steps each: stage 0 computes 4 ms, stage 1 right after the link; the next step
    starts ``every_s`` after the last (2 ms after stage 1's end). ``step_costs.csv`` prices every compute at
    ``predicted_s``."""
    d.mkdir(parents=True)
    ops, steps, t = [], [], 0.001
    for k in range(3):
        ops.append(f"stage0,compute,{k},{t},{t + 0.004},1,1,0,1,0")
        ops.append(f"link0->1,send,{k},{t + 0.004},{t + 0.0042},1,1,0,0,2048")
        ops.append(f"stage1,compute,{k},{t + 0.0042},{t + 0.0082},1,1,0,1,0")
        steps += [f"0,{i},{k},1,1,0,{measured_s},{predicted_s}" for i in (0, 1)]
        t += every_s
    (d / "engine-0").mkdir()
    (d / "engine-0" / "stage_ops.csv").write_text(OPS_HEADER + "\n".join(ops) + "\n")
    head = "run,stage,step_id,num_tokens,num_reqs,num_prefill_tokens,measured_s,predicted_s\n"
    (d / "step_costs.csv").write_text(head + "\n".join(steps) + "\n")


def test_idle_gaps_are_each_stages_idle_time_before_a_compute():
    from ppsim.metrics.records import OpRecord
    from ppsim.validate.steps import idle_gaps

    ops = [
        OpRecord("stage0", "compute", 0, 0.001, 0.005, 1, 1),
        OpRecord("link0->1", "send", 0, 0.005, 0.006, 1, 1),
        OpRecord("stage1", "compute", 0, 0.006, 0.010, 1, 1),
        OpRecord("stage0", "compute", 1, 0.012, 0.016, 1, 1),
    ]
    gaps = idle_gaps(list(reversed(ops)))  # in any order: sorted by start
    assert gaps == pytest.approx({(0, 0): 0.001, (1, 0): 0.006, (0, 1): 0.007})
    assert [pc.gap_bin(g) for g in (0.0, 0.001, 0.0015, 0.005, 0.006, 1.0)] == [0.0, 0.0, 1.5, 1.5, 6.0, 6.0]


def test_gap_rows_price_the_idle_charge_apart(tmp_path):
    """Stage 0 idles 1 ms before its first compute and 6.2 ms before the others, stage 1 5.2 ms before its
    first and 6.2 ms after: a 1-ms charge for every gap of 1.5 ms or more, inside 5-ms predictions of 5-ms
    computes, was all borne (4 ms without it)."""
    _gap_run(tmp_path / "r")
    rows = pc.gap_rows(tmp_path / "r", lambda _i, gap: 1e-3 if gap >= 1.5e-3 else 0.0, 2)
    assert len(rows) == 6 and {r[:2] for r in rows} == {(2, "decode")}
    by_bin = sorted((r[2], round(r[4], 6), round(r[5], 6)) for r in rows)
    assert by_bin[0] == (0.0, 0.0, 0.0)  # the first compute: no charge
    assert by_bin[1:] == [(1.5, -0.2, 0.2)] + [(6.0, -0.2, 0.2)] * 4
    assert all(r[3] == pytest.approx(0.0) for r in rows)
    _gap_run(tmp_path / "cheap", measured_s=0.004)  # ran as the prediction without the charge: none borne
    assert {round(r[4], 6) for r in pc.gap_rows(tmp_path / "cheap", lambda _i, gap: 1e-3, 2)} == {0.0}


def test_gaps_report_and_its_refusals(tmp_path, capsys, monkeypatch):
    _gap_run(tmp_path / "set" / "r")
    monkeypatch.setattr(pc, "run_idle", lambda _d: ((lambda _i, gap: 1e-3 if gap >= 1.5e-3 else 0.0), 2))
    assert pc.main(["gaps", str(tmp_path / "set")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["PP", "class", "gap"]
    assert out[-1].split() == ["2", "decode", ">=6", "4", "+0.0%", "-20.0%", "20.0%", "1.00"]
    assert pc.main(["gaps", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: runs: ") and err.count("\n") == 1 and "does not exist" in err
    bad = tmp_path / "set" / "r" / "engine-0" / "stage_ops.csv"
    bad.write_text(bad.read_text().replace("stage0,compute,0,0.001,", "stage0,compute,0,x,"))
    assert pc.main(["gaps", str(tmp_path / "set")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dirs: ") and err.count("\n") == 1 and "holds a damaged" in err


def test_first_rows_charge_a_stages_first_compute_the_held_idle(tmp_path):
    """Stage 0 idles 1 ms before its first compute (no charge below 1.5 ms), stage 1 5.2 ms (charged 1 ms, the
    held value too). Every compute measured and priced 5 ms: as recorded each first is priced as its second (1.0);
    held, stage 0's first is priced 6 ms (5/6). A first measured 6 ms: recorded 1.2, held 1.0 on stage 0."""
    idle = lambda _i, gap: 1e-3 if gap >= 1.5e-3 else 0.0  # noqa: E731
    _gap_run(tmp_path / "r")
    rounded = lambda: [tuple(round(x, 9) for x in r) for r in pc.first_rows(tmp_path / "r", idle)]  # noqa: E731
    assert rounded() == [(0, 1.0, round(5 / 6, 9)), (1, 1.0, 1.0)]
    costs = tmp_path / "r" / "step_costs.csv"
    costs.write_text(costs.read_text().replace("0,0,0,1,1,0,0.005,", "0,0,0,1,1,0,0.006,"))
    assert rounded() == [(0, 1.2, 1.0), (1, 1.0, 1.0)]
    costs.write_text(costs.read_text().replace("0,1,1,1,1,0,", "0,1,1,2,2,0,"))  # stage 1's second: another shape
    assert rounded() == [(0, 1.2, 1.0)]


def test_first_report_and_its_refusals(tmp_path, capsys, monkeypatch):
    _gap_run(tmp_path / "set" / "r")
    seen = []
    monkeypatch.setattr(
        pc, "run_idle", lambda _d, p: (seen.append(p), ((lambda _i, gap: 1e-3 if gap >= 1.5e-3 else 0.0), 2))[1]
    )
    assert pc.main(["first", str(tmp_path / "set"), "--profile", "P"]) == 0 and seen == ["P"]
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["r", "2", "1.000", "0.917"]
    assert out[-1].startswith("first over second, median over 2: recorded 1.000") and out[-1].endswith("in 0")
    costs = tmp_path / "set" / "r" / "step_costs.csv"
    costs.write_text(costs.read_text().replace(",1,1,0,0.005", ",2,2,0,0.005", 1))
    costs.write_text(costs.read_text().replace("0,1,1,1,1,0,", "0,1,1,2,2,0,"))
    assert pc.main(["first", str(tmp_path / "set")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: runs: no repeat whose stages' first two") and err.count("\n") == 1


def test_depth_rows_are_the_engine_over_the_model_net_of_idle_and_live_factors(tmp_path, monkeypatch):
    """5-ms computes priced at 5 ms with a level x depth of 1.25 recorded and a 1-ms idle charge after gaps of
    1.5 ms or more: the model alone would have said 3.2 ms (first compute: 4 ms) against 4 ms (5 ms) net of
    the charge, so the engine ran 1.25x the model, the live factors, everywhere; computes that start beside
    an earlier micro-batch (charged a co-run) are left out, both stages of them."""
    import json

    idle = lambda _i, gap: 1e-3 if gap >= 1.5e-3 else 0.0  # noqa: E731
    _gap_run(tmp_path / "r")
    (tmp_path / "r" / "validation.json").write_text(json.dumps({"level_factor": 1.04, "depth_factor": 1.25 / 1.04}))
    assert pc.depth_rows(tmp_path / "r", idle, 2) == pytest.approx([1.25] * 6)
    _gap_run(tmp_path / "overlap", every_s=0.006)  # step k + 1 starts 2.2 ms before step k's stage 1 ends
    (tmp_path / "overlap" / "validation.json").write_text(json.dumps({}))  # recorded before the live factors
    assert pc.depth_rows(tmp_path / "overlap", idle, 2) == pytest.approx([1.0, 1.0])  # step 0 only
    monkeypatch.setattr(pc, "run_idle", lambda _d: (idle, 2))
    assert pc.main(["depth", str(tmp_path / "r")]) == 0


def test_depth_report(tmp_path, capsys, monkeypatch):
    import json

    for name, level in (("a", 1.1), ("b", 1.0)):
        _gap_run(tmp_path / "set" / name)
        (tmp_path / "set" / name / "validation.json").write_text(json.dumps({"level_factor": level}))
    depths = {"a": 1, "b": 2}  # a's computes as if at one stage (no co-run at either depth here)
    monkeypatch.setattr(pc, "run_idle", lambda d: ((lambda _i, _gap: 0.0), depths[d.name]))
    assert pc.main(["depth", str(tmp_path / "set")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "PP=1: 1.100 over 6 computes",
        "PP=2: 1.000 over 6 computes (charged no co-run)",
        "PP=2 / PP=1: 0.909",
    ]
    assert pc.main(["depth", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: runs: ") and err.count("\n") == 1 and "does not exist" in err


def test_live_ratios_over_the_steps_alone_and_over_the_model():
    """Live steps taking 1.04x (one stage) and 1.13x (two) their time alone, itself 1.1x the model: over the
    steps alone 1.04 / 1.13 (as fit_live charges), over the model 1.1x that; a co-running compute counts
    without the co-run charge."""
    from calibration.live_fits import live_ratios
    from ppsim.cost.profiled import OpFit, Profile, ProfiledCost
    from tests.test_calibration_glue import SHAPE, _live_rows, base_fits

    idle = OpFit("stage_idle", "interp", "gap_s", {"xs": [0.0, 0.01], "ys": [0.0, 0.4e-3], "per": "step"})
    cost = ProfiledCost(Profile({}, {**base_fits(), "stage_idle": idle}), SHAPE, None, 1)
    rows = _live_rows(cost, 1.04, 1, 0.5e-3) + _live_rows(cost, 1.13, 2, 4e-3)
    got = live_ratios(cost, rows)
    assert got[1] == pytest.approx((1.04, 1.04 * 1.1)) and got[2] == pytest.approx((1.13, 1.13 * 1.1))
    co = [{**r, "corun": 1, "median_s": 1.05 * r["median_s"]} if r["split"] == "live2" else r for r in rows]
    assert live_ratios(cost, co, 1.05)[2] == pytest.approx((1.13, 1.13 * 1.1))  # the charge taken off
    left_on = live_ratios(cost, co)[2]  # the 5% counted as live cost (and the idle charge's 5% with it)
    assert left_on[0] > 1.05 * 1.13 and left_on[1] > 1.05 * 1.13 * 1.1
    assert live_ratios(cost, []) == {}


def test_live_by_batch_bins_decode_steps_alone_over_the_model():
    """Decode-only live steps timed alone at f(B) x the model: each bin's median is f of its steps; a step with
    a prefill and one not timed alone are left out, as are empty bins."""
    from calibration.samples import plan_of
    from ppsim.cost.base import StageSpec
    from ppsim.cost.profiled import Profile, ProfiledCost
    from tests.test_calibration_glue import SHAPE, base_fits

    cost = ProfiledCost(Profile({}, base_fits()), SHAPE, None, 1)
    f = {1: 0.85, 2: 0.9, 3: 0.92, 5: 1.1, 16: 0.95}
    rows = []
    for b, ratio in f.items():
        items = ";".join(f"{40 + i}:1" for i in range(b))
        alone = ratio * cost.stage_time(StageSpec(0, 0, 3, True, True), plan_of(items))
        rows.append(
            {"op": "stage_full", "split": "live1", "items": items, "layers": 3, "start_layer": 0, "alone_s": alone}
        )
    rows.append({**rows[0], "items": "0:16;40:1", "alone_s": 1.0})  # a prefill in it
    rows.append({**rows[1], "alone_s": None})  # not timed alone
    got = pc.live_by_batch(cost, rows)
    assert list(got) == [(1, 1), (2, 3), (4, 7), (13, 20)]
    assert got[(1, 1)] == pytest.approx((0.85, 1)) and got[(2, 3)] == pytest.approx((0.91, 2))
    assert got[(4, 7)] == pytest.approx((1.1, 1)) and got[(13, 20)] == pytest.approx((0.95, 1))


def test_live_refuses_a_profile_without_live_runs(capsys):
    assert pc.main(["live", "profiles/tiny-cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: profile: profiles/tiny-cpu has no live runs") and err.count("\n") == 1


def test_items_times_a_first_stage_on_prefills_of_many_items(capsys):
    """``items``: each plan's measured and profile time on the first of two stages, and its shape (profile over
    measured over the one-item prefill's: 1 for that one)."""
    assert pc.main(["items", "--model", "tiny", "--rounds", "1", "profiles/tiny-cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(pc.ITEM_PLANS)
    assert "shape 1.000  glue charged " in lines[0] and all(" ms  profile " in ln for ln in lines)
    assert all("ms a layer, measured beyond the operators " in ln for ln in lines)


def test_items_refuses_a_bad_round_count(capsys):
    with pytest.raises(SystemExit) as e:
        pc.main(["items", "--rounds", "0", "profiles/tiny-cpu"])
    assert e.value.code == 2 and "--rounds: 0 must be in [1, 1000]" in capsys.readouterr().err


def test_attn_in_layer_times_each_operator_in_context(capsys):
    """experiments/validation/attn_in_layer.py: one line per plan, every operator of the layer and the attention
    alone; a plan it cannot read is refused in one line."""
    from experiments.validation import attn_in_layer as ail

    assert ail.main(["--model", "tiny", "--rounds", "1", "2x8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("2x8: per layer in context (us) norm1 ")
    assert all(f" {o} " in out[0] for o in ail.OPS) and "in context / alone" in out[0]
    assert ail.main(["--rounds", "1", "32by16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plan '32by16': give items x chunk tokens") and err.count("\n") == 1
