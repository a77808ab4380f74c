"""``ppsim validate`` checks every option before its work: without ``--profile`` that work starts with a
calibration of minutes, so a bad option must be refused before it (calibration is replaced here by a
function that fails the test), and a good one must reach it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppsim.errors import PPSimError
from ppsim.validate.host import MAX_DRIFT, HostGuard
from ppsim.validate.preflight import MAX_REPEATS, check_repeats
from tests.bad_inputs import TINY, Case, _dir, run_case

VALIDATE = ["validate", *TINY, "--repeats", "1", "--output-dir", "{d}/out"]  # no --profile: it would calibrate

BEFORE_CALIBRATING = [
    Case("checkpoint-empty-dir", [*VALIDATE, "--checkpoint", "{d}/ck"], "--checkpoint: ", _dir("ck")),
    Case("max-kv-gib-tiny", [*VALIDATE, "--max-kv-gib", "0.001", "--kv-blocks", "100"], "above --max-kv-gib 0.001"),
    Case("kv-blocks-hold-no-request", [*VALIDATE, "--kv-blocks", "1"], "4 of 4 requests rejected: 4 need up to 2"),
    Case("requests-past-max-model-len", [*VALIDATE, "--random-input-len", "5000"], "longer than max_model_len"),
    Case("replay-past-an-hour", [*VALIDATE, "--request-rate", "0.0001"], "--request-rate: 0.0001 req/s"),
    Case("inject-fault-bad", [*VALIDATE, "--inject-fault", "kill:9:1"], "inject"),
    Case("host-max-drift-inf", [*VALIDATE, "--host-max-drift", "inf"], "--host-max-drift: inf must be in (0, 10]"),
    Case("host-max-drift-huge", [*VALIDATE, "--host-max-drift", "1e9"], "--host-max-drift: 1e+09"),
    Case("repeats-huge", [*VALIDATE, "--repeats", "1000000"], "--repeats: 1000000 must be in [1, 100]"),
    Case(
        "host-limit-with-guard-off",
        [*VALIDATE, "--host-guard", "off", "--host-min-core-share", "0.5"],
        "--host-min-core-share: the host guard is off",
    ),
]


def _no_calibration(monkeypatch: pytest.MonkeyPatch, calls: list | None = None) -> None:
    def calibrate(args, s):  # noqa: ANN001, ANN202
        if calls is None:
            pytest.fail("validate started calibrating before refusing a bad option")
        calls.append(s.model)
        return None  # as a failed calibration

    monkeypatch.setattr("ppsim.validate.cli.calibrate_here", calibrate)


@pytest.mark.parametrize("case", BEFORE_CALIBRATING, ids=[c.id for c in BEFORE_CALIBRATING])
def test_a_bad_option_is_refused_before_calibrating(case, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    _no_calibration(monkeypatch)
    end = run_case(case, tmp_path)
    assert end.kind == "refused", f"{end.kind} (exit {end.code}): {end.stderr}"
    assert case.fragment in end.stderr, end.stderr
    assert not (tmp_path / "out").exists()


def test_good_options_reach_the_calibration(tmp_path, monkeypatch, capsys):
    """The checks refuse nothing a run could serve: a tiny validation gets to its calibration."""
    pytest.importorskip("torch")
    from ppsim.cli import main

    calls: list = []
    _no_calibration(monkeypatch, calls)
    argv = [a.replace("{d}", str(tmp_path)) for a in VALIDATE]
    assert main([*argv, "--host-guard", "off", "--kv-blocks", "2"]) == 1
    assert calls == ["tiny"] and "calibration failed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_host_limits_are_bounded_and_need_the_guard_on():
    for drift in (float("inf"), float("nan"), 0.0, -1.0, MAX_DRIFT * 1.01, 1e9):
        with pytest.raises(PPSimError, match="--host-max-drift: .* must be in"):
            HostGuard("flag", max_drift=drift)
    assert HostGuard("refuse", max_drift=MAX_DRIFT).max_drift == MAX_DRIFT
    with pytest.raises(PPSimError, match="--host-max-drift: the host guard is off"):
        HostGuard("off", max_drift=0.5)
    assert HostGuard("off").mode == "off"  # the defaults are no limit given


def test_repeats_are_bounded():
    for n in (0, -1, MAX_REPEATS + 1, 10**6):
        with pytest.raises(PPSimError, match=r"--repeats: .* must be in \[1, 100\]"):
            check_repeats(n)
    check_repeats(1)
    check_repeats(MAX_REPEATS)


def test_a_config_naming_a_profile_is_that_profile_not_a_new_calibration(tmp_path, monkeypatch):
    """``--config`` with ``[cost] profile_dir`` validates against that profile, as ``--profile DIR`` does (until
    2026-12-07 validate calibrated this host over it); ``--calibrate`` still makes a new one."""
    pytest.importorskip("torch")
    from ppsim.cli import main
    from tests.bad_inputs_profiles import SHIPPED

    calls: list = []
    _no_calibration(monkeypatch, calls)
    seen: list = []

    class Ran(Exception):
        pass

    def validate(s, out, repeats, host):  # noqa: ANN001, ANN202
        seen.append(s.cost.profile_dir)
        raise Ran

    monkeypatch.setattr("ppsim.validate.run.validate", validate)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cost]\nprofile_dir = "{SHIPPED}"\n')
    argv = [a.replace("{d}", str(tmp_path)) for a in VALIDATE]
    with pytest.raises(Ran):
        main([*argv, "--config", str(cfg), "--host-guard", "off"])
    assert calls == [] and [Path(p).resolve() for p in seen] == [SHIPPED.resolve()]
    assert main([*argv, "--config", str(cfg), "--host-guard", "off", "--calibrate"]) == 1  # calibration "fails"
    assert calls == ["tiny"] and len(seen) == 1
