"""The host guard: readings are injected (fake probe and load average), so nothing here depends on
how fast or how busy the machine running the tests is."""

from __future__ import annotations

import json

import pytest

from ppsim.errors import PPSimError
from ppsim.validate.host import HostGuard, cpu_probe, host_line
from tests.conftest import ROOT


def fake(probes):
    """A probe returning the given (wall seconds, core share) readings in turn."""
    it = iter(probes)
    return lambda: next(it)


def guard(probes, mode="flag", **kw):
    return HostGuard(mode, probe=fake(probes), loadavg=lambda: (0.2, 0.1, 0.1), **kw)


def at_price(g, profile):
    """The whole-model probe injected at exactly what ``profile`` charges for its step: read, judged, within bounds
    whatever the host (the test's own readings decide)."""
    from engine.probe import model_price
    from ppsim.models.shape import load_model

    price = model_price(str(profile), load_model("tiny"))
    g.model_probe = lambda: price
    return g


def test_quiet_host_is_ok():
    g = guard([(0.030, 0.99), (0.031, 0.98), (0.030, 1.0), (0.0305, 0.97)])
    for i in range(2):
        g.read(f"before {i}")
        g.read(f"after {i}")
    d = g.to_dict()
    assert d["ok"] and d["problem"] is None and len(d["readings"]) == 4
    assert d["probe_drift"] == pytest.approx(0.031 / 0.030 - 1)
    assert host_line(d).startswith("host guard: ok")


def test_drift_is_flagged_in_one_line():
    g = guard([(0.030, 0.99), (0.030, 0.99), (0.040, 0.99)])  # the host got 33% slower mid-run
    for when in ("before 0", "after 0", "before 1"):
        g.read(when)
    d = g.to_dict()
    assert not d["ok"] and "drifted 33%" in d["problem"]
    line = host_line(d)
    assert line.startswith("host guard: FLAGGED") and "\n" not in line


def test_shared_cores_are_flagged_even_without_drift():
    g = guard([(0.045, 0.66), (0.045, 0.66)])  # a neighbour all along: steady, but a third of a core gone
    g.read("before 0")
    g.read("after 0")
    assert g.drift() == 0.0 and "66% of a core at 'before 0'" in g.problem()


def test_refuse_stops_at_the_first_bad_reading():
    g = guard([(0.030, 0.99), (0.030, 0.50)], mode="refuse")
    g.read("before 0")
    with pytest.raises(PPSimError, match="host guard: .*50% of a core at 'after 0'.*refused"):
        g.read("after 0")


def test_off_takes_no_readings_and_bounds_are_checked():
    g = HostGuard("off", probe=lambda: pytest.fail("probed"))
    g.read("before 0")
    assert g.to_dict()["readings"] == [] and "off" in host_line(g.to_dict())
    with pytest.raises(PPSimError, match="--host-max-drift"):
        HostGuard("flag", max_drift=0)
    with pytest.raises(PPSimError, match="--host-min-core-share"):
        HostGuard("flag", min_core_share=1.5)


def test_real_probe_reads_something():
    wall, share = cpu_probe(processes=1)
    assert wall > 0 and 0 < share <= 1.0


def test_validate_records_and_flags_an_injected_drift(tmp_path):
    """A real (tiny) engine run between readings: the drift lands in validation.json and the report;
    in refuse mode the validation stops before it writes anything of its own."""
    pytest.importorskip("torch")
    from ppsim.config import build_scenario
    from ppsim.validate.run import format_report, validate

    s = build_scenario(
        None,
        {
            "model": "tiny",
            "cluster": {"pipeline_parallel_size": 1},
            "cost": {"kind": "profile", "profile_dir": str(ROOT / "profiles" / "tiny-cpu")},
            "workload": {
                "num_prompts": 2,
                "request_rate": float("inf"),
                "random_input_len": 16,
                "random_output_len": 3,
            },
        },
    )
    g = at_price(guard([(0.030, 0.99), (0.045, 0.98)]), ROOT / "profiles" / "tiny-cpu")
    payload = validate(s, tmp_path / "flag", 1, log=lambda m: None, host=g)
    h = payload["host"]
    assert [r["when"] for r in h["readings"]] == ["before 0", "after 0"] and not h["ok"]
    assert "drifted 50%" in format_report(payload).splitlines()[-1] and h["model_vs_price"] == 0.0
    assert payload["step_cost"]["steps"] >= 3  # 2 prompts x 3 tokens on one stage: every micro-batch timed
    with pytest.raises(PPSimError, match="refused"):
        g = at_price(guard([(0.03, 0.99), (0.03, 0.4)], "refuse"), ROOT / "profiles" / "tiny-cpu")
        validate(s, tmp_path / "refuse", 2, log=lambda m: None, host=g)
    assert not (tmp_path / "refuse" / "validation.json").exists()


def test_a_host_slower_than_at_calibration_is_flagged():
    """Steady readings, but 25% slower than the probe the profile recorded: the cost model is of a faster host."""
    g = guard([(0.0025, 0.99), (0.0025, 0.99)])
    g.reference_s = 0.002
    g.read("before 0")
    g.read("after 0")
    d = g.to_dict()
    assert g.drift() == 0.0 and d["vs_reference"] == pytest.approx(0.25)
    assert not d["ok"] and "25% slower than when the profile was calibrated" in d["problem"]
    ok = guard([(0.00205, 0.99), (0.00195, 0.99)])
    ok.reference_s = 0.002
    ok.read("before 0")
    ok.read("after 0")
    assert ok.problem() is None and "+0% vs calibration" in host_line(ok.to_dict())


def test_calibration_probe_is_read_from_the_profile(tmp_path):
    import json

    from ppsim.validate.run import calibration_probe

    (tmp_path / "meta.json").write_text(json.dumps({"host_probe_s": 0.0021}))
    assert calibration_probe(str(tmp_path)) == 0.0021
    (tmp_path / "meta.json").write_text(json.dumps({"host_probe_s": 0.0021, "host_stage_probe_s": 0.006}))
    assert calibration_probe(str(tmp_path), "host_stage_probe_s") == 0.006
    (tmp_path / "meta.json").write_text(json.dumps({}))  # a profile from before the probe was recorded
    assert calibration_probe(str(tmp_path)) is None and calibration_probe(None) is None


def test_the_engine_step_probe_is_judged_against_calibration():
    """The engine's own step (engine/probe.py) 30% slower than at calibration is flagged even when the
    pure-Python probe holds; within the limit it is shown in the ok line."""
    steps = iter([0.0065, 0.0065])
    g = guard([(0.002, 0.99), (0.002, 0.99)], stage_probe=lambda: next(steps), stage_reference_s=0.005)
    g.reference_s = 0.002
    g.read("before 0")
    g.read("after 0")
    d = g.to_dict()
    assert d["vs_reference"] == 0.0 and d["stage_vs_reference"] == pytest.approx(0.30)
    assert [r["stage_probe_s"] for r in d["readings"]] == [0.0065, 0.0065]
    assert not d["ok"] and "engine's own step runs 30% slower than when the profile was calibrated" in d["problem"]
    ok = guard([(0.002, 0.99)], stage_probe=lambda: 0.0052, stage_reference_s=0.005)
    ok.read("before 0")
    assert ok.problem() is None and "engine step +4% vs calibration" in host_line(ok.to_dict())
    plain = guard([(0.002, 0.99)])  # no engine-step probe: readings without it, nothing judged on it
    plain.read("before 0")
    assert plain.to_dict()["readings"][0]["stage_probe_s"] is None and plain.stage_vs_reference() is None


def test_the_engine_step_probe_reads_something():
    pytest.importorskip("torch")
    from engine.probe import stage_probe

    assert stage_probe(0.05) > 0


def test_the_whole_model_probe_is_judged_against_its_profile_price_first():
    """Against the profile's price of the probe's step where there is one (no calibration reading between):
    22% over it flags even when the probe matches its calibration reading."""
    g = guard([(0.002, 0.99)], model_probe=lambda: 0.0061, model_reference_s=0.0061, model_price_s=0.005)
    g.read("before 0")
    d = g.to_dict()
    assert d["model_vs_reference"] == 0.0 and d["model_vs_price"] == pytest.approx(0.22)
    assert "model's whole step runs 22% slower than its profile charges" in d["problem"]
    ok = guard([(0.002, 0.99)], model_probe=lambda: 0.0053, model_reference_s=0.010, model_price_s=0.005)
    ok.read("before 0")  # 47% under its calibration reading, but within the limit of its price: that is judged
    assert ok.problem() is None and "whole model +6% vs its profile's price" in host_line(ok.to_dict())


def test_the_probe_factor_reads_the_probe_before_each_repeat_only():
    """What a prediction may use: the readings before the runs, over the profile's price (after-readings
    are judged by the guard, never scaled into a prediction)."""
    whole = iter([0.0055, 0.0090, 0.0065, 0.0090])
    g = guard([(0.002, 0.99)] * 4, model_probe=lambda: next(whole), model_price_s=0.005)
    for i in range(2):
        g.read(f"before {i}")
        g.read(f"after {i}")
    assert g.probe_factor() == pytest.approx(1.2) and g.to_dict()["probe_factor"] == pytest.approx(1.2)
    assert guard([(0.002, 0.99)], model_probe=lambda: 0.005).probe_factor() is None  # not priced


def test_the_whole_model_probe_is_judged_against_calibration():
    """The validated model's whole step 25% slower than at calibration is flagged, named as that probe,
    even when the pure-Python probe and the fixed stage hold; within the limit it is in the ok line."""
    whole = iter([0.0125, 0.0125])
    g = guard(
        [(0.002, 0.99), (0.002, 0.99)],
        stage_probe=lambda: 0.005,
        stage_reference_s=0.005,
        model_probe=lambda: next(whole),
        model_reference_s=0.010,
    )
    g.reference_s = 0.002
    g.read("before 0")
    g.read("after 0")
    d = g.to_dict()
    assert d["stage_vs_reference"] == 0.0 and d["model_vs_reference"] == pytest.approx(0.25)
    assert [r["model_probe_s"] for r in d["readings"]] == [0.0125, 0.0125]
    assert not d["ok"] and "model's whole step runs 25% slower than when the profile was calibrated" in d["problem"]
    ok = guard([(0.002, 0.99)], model_probe=lambda: 0.0092, model_reference_s=0.010)
    ok.read("before 0")
    assert ok.problem() is None and "whole model -8% vs calibration" in host_line(ok.to_dict())
    unref = guard([(0.002, 0.99)], model_probe=lambda: 0.02)  # a profile without it: read, not judged
    unref.read("before 0")
    assert unref.to_dict()["readings"][0]["model_probe_s"] == 0.02 and unref.model_vs_reference() is None


def test_the_whole_model_probe_reads_the_model_and_names_its_kind():
    pytest.importorskip("torch")
    from engine.probe import MODEL_PROBE_MAX_BYTES, model_probe, model_probe_fits, model_probe_kind
    from ppsim.models.shape import load_model

    tiny = load_model("tiny")
    assert model_probe_fits(tiny) and model_probe(tiny, 0.05) > 0
    assert model_probe_kind(tiny) == "tiny:whole:D4@134" != model_probe_kind(load_model("tiny-moe"))
    big = load_model("llama-3-8b")
    assert big.total_weight_bytes() > MODEL_PROBE_MAX_BYTES and not model_probe_fits(big)  # never built


def test_validate_reads_the_model_probe_reference_of_the_same_model_only(tmp_path):
    """prepare_validation takes ``host_model_probe_s`` as the reference only where ``host_model_probe``
    names the validated model's probe: another model's reading (or none) judges nothing."""
    pytest.importorskip("torch")
    import shutil

    from engine.probe import model_price
    from ppsim.config import build_scenario
    from ppsim.models.shape import load_model
    from ppsim.validate.run import prepare_validation

    prof = tmp_path / "p"
    shutil.copytree(ROOT / "profiles" / "tiny-cpu", prof)
    meta = json.loads((prof / "meta.json").read_text())

    def reference(kind):
        (prof / "meta.json").write_text(json.dumps({**meta, "host_model_probe_s": 0.004, "host_model_probe": kind}))
        s = build_scenario(None, {"model": "tiny", "cost": {"kind": "profile", "profile_dir": str(prof)}})
        g = guard([(0.002, 0.99)])
        g.stage_probe, g.sampler = (lambda: 0.005), None
        prepare_validation(s, tmp_path / f"out-{kind}", 1, host=g)
        assert g.model_probe is not None  # read on every CPU validation of a model that fits
        assert g.model_price_s == model_price(str(prof), load_model("tiny")) > 0  # priced by this profile
        return g.model_reference_s

    assert reference("tiny:whole:D4@134") == 0.004
    assert reference("tiny-moe:whole:D4@134") is None


class FakeSampler:
    """A context manager like engine.host_sampler.HostSampler, with a fixed mean."""

    def __init__(self, mean_s):
        self.mean_s, self.entered = mean_s, False

    def __enter__(self):
        self.entered = True
        return self

    def __exit__(self, *exc):
        return False

    def stats(self):
        return {"n": 10, "mean_s": self.mean_s, "median_s": self.mean_s}


def test_the_in_run_sampler_is_kept_per_repeat_and_compared_with_calibration():
    means = iter([0.0042, 0.0046])
    g = guard([(0.002, 0.99)] * 4, sampler=lambda: FakeSampler(next(means)), sampler_reference_s=0.004)
    for i in range(2):
        g.read(f"before {i}")
        with g.during():
            pass
        g.read(f"after {i}")
    d = g.to_dict()
    assert d["sampler_s"] == [0.0042, 0.0046] and d["sampler_ratio"] == pytest.approx(1.1)
    assert d["ok"] and "in-run sampler x1.100 its calibration time" in host_line(d)
    # without a reference (a profile calibrated before it): kept, no ratio, nothing in the line
    g2 = guard([(0.002, 0.99)], sampler=lambda: FakeSampler(0.004))
    with g2.during():
        pass
    assert g2.to_dict()["sampler_s"] == [0.004] and g2.sampler_ratio() is None
    assert "sampler" not in host_line({**g2.to_dict(), "readings": [{"load1": 0.1, "core_share": 1.0}]})


def test_the_sampler_is_not_run_with_the_guard_off_and_an_engine_failure_passes_through():
    made = []
    g = HostGuard("off", sampler=lambda: made.append(FakeSampler(0.004)) or made[-1])
    with g.during():
        pass
    assert made == [] and g.sampled_s == []
    on = guard([], sampler=lambda: made.append(FakeSampler(0.004)) or made[-1])
    with pytest.raises(RuntimeError, match="engine"), on.during():
        raise RuntimeError("engine failed")
    assert made[0].entered and on.sampled_s == []  # stopped, and no reading of a run that did not finish


def test_a_real_sampler_reads_a_matmul_beside_a_sleep(tmp_path):
    import time

    from engine.host_sampler import HostSampler, sample_stats

    with HostSampler(64, 128, tmp_path / "s.txt", period_s=0.02) as s:
        time.sleep(0.5)
    st = s.stats()
    assert st["n"] >= 3 and 0 < st["median_s"] <= st["mean_s"] * 10
    assert sample_stats((tmp_path / "s.txt").read_text()) == st  # the samples kept where asked


def test_the_sampler_never_outlives_its_parent():
    """Its parent gone (its stdin at EOF), the sampler writes what it has and exits."""
    import subprocess
    import sys

    p = subprocess.Popen(
        [sys.executable, "-m", "engine.host_sampler", "16", "32", "--period-s", "0.01"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline().strip() == "ready"
    p.stdin.close()  # what the kernel does when the parent dies
    assert p.wait(timeout=30) == 0


def test_a_sampler_reference_is_read_only_for_the_same_work(tmp_path):
    """A profile whose sampler timed other work (a torch matmul, before numpy's) gives no reference."""
    from engine.host_sampler import SAMPLER_KIND
    from ppsim.validate.run import sampler_reference

    (tmp_path / "meta.json").write_text(json.dumps({"host_sampler_s": 0.0035, "host_sampler": SAMPLER_KIND}))
    assert sampler_reference(str(tmp_path)) == 0.0035
    (tmp_path / "meta.json").write_text(json.dumps({"host_sampler_s": 0.0035}))  # kind not named
    assert sampler_reference(str(tmp_path)) is None
    assert sampler_reference(str(tmp_path / "none")) is None


def test_a_repeat_the_in_run_sampler_never_sampled_adds_no_mean():
    """A short repeat on a loaded host can end before the in-run sampler's first sample (its stats: n 0, mean NaN):
    it adds nothing to ``sampler_s``, so the host-conditioned ratio is over the repeats that were sampled and
    ``validation.json`` (strict JSON, no NaN) is written."""
    import contextlib
    import json

    class Sampler:
        def __init__(self, n: int) -> None:
            self.n = n

        def stats(self) -> dict[str, float]:
            return {"n": self.n, "mean_s": 2e-4 if self.n else float("nan"), "median_s": 2e-4}

    counts = iter([0, 3])
    g = guard([(0.03, 0.99)] * 4, sampler=lambda: contextlib.nullcontext(Sampler(next(counts))))
    g.sampler_reference_s = 1e-4
    for _ in range(2):
        with g.during():
            pass
    assert g.sampled_s == [2e-4] and g.sampler_ratio() == pytest.approx(2.0)
    json.dumps(g.to_dict(), allow_nan=False)


def _sysfs(root, caches):
    """A cpu0 cache tree as Linux writes it: one index dir per (level, type, size)."""
    for i, (level, kind, size) in enumerate(caches):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_cpu_identity_reads_the_model_name_and_the_unified_l2_and_l3(tmp_path):
    import os

    from ppsim.validate.host import cpu_identity, cpu_text

    _sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")])
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu\n")
    got = cpu_identity(str(tmp_path), str(info))
    assert got == {"model": "AMD EPYC", "vcpus": os.cpu_count(), "l2_bytes": 1 << 20, "l3_bytes": 32 << 20}
    assert cpu_text(got) == f"AMD EPYC, {os.cpu_count()} vCPUs, L2 1 MiB, L3 32 MiB"
    bare = cpu_identity(str(tmp_path / "none"), str(tmp_path / "none"))  # no sysfs, no cpuinfo: unknown, not wrong
    assert bare == {"model": None, "vcpus": os.cpu_count(), "l2_bytes": None, "l3_bytes": None}


def test_a_profile_calibrated_on_another_cpu_is_flagged_first_and_refused_before_any_run():
    """The L3 differs (480 against 32 MiB): flagged even on steady readings, in one line naming both hosts and the
    fix, without the contention phrase; refused at the first reading; a field either side lacks is not judged."""
    here = {"model": "AMD EPYC", "vcpus": 2, "l2_bytes": 1 << 20, "l3_bytes": 32 << 20}
    there = {"model": "AMD EPYC", "vcpus": 2, "l2_bytes": 1 << 20, "l3_bytes": 480 << 20}
    g = guard([(0.002, 0.99), (0.002, 0.99)], cpu=here, cpu_reference=there)
    g.read("before 0")
    g.read("after 0")
    d = g.to_dict()
    assert not d["ok"] and d["cpu_differs"] == ["l3_bytes"]
    assert "calibrated on another CPU (AMD EPYC, 2 vCPUs, L2 1 MiB, L3 480 MiB; this host: AMD EPYC" in d["problem"]
    line = host_line(d)
    assert line.startswith("host guard: FLAGGED") and line.endswith("calibrate on this one") and "\n" not in line
    with pytest.raises(PPSimError, match="another CPU .* validation refused"):
        guard([(0.002, 0.99)], "refuse", cpu=here, cpu_reference=there).read("before 0")
    same = guard([(0.002, 0.99)], cpu=here, cpu_reference=dict(there, l3_bytes=None))
    same.read("before 0")
    assert same.problem() is None and same.to_dict()["cpu_differs"] == []
    off = HostGuard("off", cpu=here, cpu_reference=there)
    assert off.problem() is None and host_line(off.to_dict()).startswith("host guard: off")


def test_validate_reads_the_cpu_of_the_profile_and_refuses_another_before_the_engine_runs(tmp_path):
    """``ppsim validate`` compares this host's CPU with the profile's ``host_cpu`` (here a vCPU count no host of
    this test has): refused before any engine run, nothing written."""
    pytest.importorskip("torch")
    import os
    import shutil

    from ppsim.config import build_scenario
    from ppsim.validate.host import cpu_identity
    from ppsim.validate.run import validate

    prof = tmp_path / "profile"
    shutil.copytree(ROOT / "profiles" / "tiny-cpu", prof)
    meta = json.loads((prof / "meta.json").read_text())
    (prof / "meta.json").write_text(json.dumps({**meta, "host_cpu": {**cpu_identity(), "vcpus": os.cpu_count() + 1}}))
    s = build_scenario(
        None,
        {
            "model": "tiny",
            "cost": {"kind": "profile", "profile_dir": str(prof)},
            "workload": {
                "num_prompts": 2,
                "request_rate": float("inf"),
                "random_input_len": 16,
                "random_output_len": 3,
            },
        },
    )
    g = guard([(0.03, 0.99)], "refuse")
    g.stage_probe, g.model_probe, g.sampler = (lambda: 0.005), (lambda: 0.006), None  # injected; the CPU read for real
    with pytest.raises(PPSimError, match=r"another CPU .* this host: .*calibrate on this one; validation refused"):
        validate(s, tmp_path / "out", 1, log=lambda m: None, host=g)
    assert g.cpu == cpu_identity() and g.cpu_reference["vcpus"] == os.cpu_count() + 1
    assert not (tmp_path / "out" / "validation.json").exists()


def test_the_shaped_factor_reads_the_shaped_probe_before_each_repeat_over_its_own_price():
    """Part 44: the whole model on the predicted run's decode step, read beside the fixed probe; its factor is
    its before-readings over the profile's price of that step, the fixed probe's factor untouched."""
    whole, shaped = iter([0.0055, 0.0090, 0.0065, 0.0090]), iter([0.022, 0.030, 0.022, 0.030])
    g = guard(
        [(0.002, 0.99)] * 4,
        model_probe=lambda: next(whole),
        model_price_s=0.005,
        shaped_probe=lambda: next(shaped),
        shaped_step=(16, 300),
        shaped_price_s=0.020,
    )
    for i in range(2):
        g.read(f"before {i}")
        g.read(f"after {i}")
    d = g.to_dict()
    assert g.shaped_factor() == pytest.approx(1.1) and d["shaped_factor"] == pytest.approx(1.1)
    assert g.probe_factor() == pytest.approx(1.2) and d["shaped_step"] == [16, 300]
    assert [r["shaped_probe_s"] for r in d["readings"]] == [0.022, 0.030, 0.022, 0.030]
    assert guard([(0.002, 0.99)], model_probe=lambda: 0.005).to_dict()["shaped_factor"] is None  # not read


def test_the_shaped_step_is_the_plain_prediction_s_median_decode_and_mean_context():
    """Four requests at t = 0, 40 prompt and 8 output tokens each, all served together: every decode of the
    first stage holds 4 requests, and a decode's mean context is 40 + 8 / 2 tokens."""
    from ppsim.config import build_scenario
    from ppsim.validate.run import shaped_step

    s = build_scenario(
        None,
        {
            "model": "tiny",
            "hardware": "h100-sxm",
            "engine": {"policy": "vllm-sync", "max_num_seqs": 4},
            "workload": {
                "num_prompts": 4,
                "request_rate": float("inf"),
                "random_input_len": 40,
                "random_output_len": 8,
                "random_range_ratio": 0.0,
            },
        },
    )
    assert shaped_step(s) == (4, 44)
    one = s.model_copy(update={"workload": s.workload.model_copy(update={"random_output_len": 1})})
    assert shaped_step(one) is None  # one output token: the prefill makes it, nothing decodes


def test_the_probe_builds_and_prices_any_decode_step():
    pytest.importorskip("torch")
    from engine.probe import model_probe
    from ppsim.models.shape import load_model

    tiny = load_model("tiny")
    assert model_probe(tiny, 0.02, batch=9, ctx=40) > 0 and model_probe(tiny, 0.02, batch=1, ctx=300) > 0


def test_the_probe_keeps_one_stage_per_model_and_one_shaped_step_s_kv_at_a_time():
    pytest.importorskip("torch")
    from engine import probe
    from ppsim.models.shape import load_model

    tiny = load_model("tiny")
    fixed = probe._stage(tiny, tiny.num_layers, True)
    a = probe._stage(tiny, tiny.num_layers, True, 9, 40)
    b = probe._stage(tiny, tiny.num_layers, True, 2, 70)
    assert a["model"] is b["model"] is fixed["model"] and len(b["items"]) == 2 and b["tokens"] == (1, 2)
    kept = {k[3:] for k in probe._steps if k[:3] == ("tiny", tiny.num_layers, True)}
    assert kept == {(probe.PROBE_BATCH, probe.PROBE_CTX), (2, 70)}
