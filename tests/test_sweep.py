"""ppsim sweep: space parsing, bisection, resume, memory-infeasible reporting, CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from ppsim.errors import PPSimError, Terminated
from ppsim.sweep.progress import Progress
from ppsim.sweep.results import pareto_front
from ppsim.sweep.runner import make_tasks, run_sweep
from ppsim.sweep.search import Probe, bisect_rate
from ppsim.sweep.space import load_space, parse_space

TINY = {
    "base": {
        "model": "tiny",
        "hardware": "h100-sxm",
        "workload": {"num_prompts": 24, "random_input_len": 64, "random_output_len": 8},
    },
    "space": {"pp": [1, 2], "max_num_seqs": [8]},
    "slo": {"p99_ttft_ms": 8, "p99_tpot_ms": 5},  # H100 steps of the tiny model: ~1.6 ms at PP=1
    "search": {"rel_tolerance": 0.1, "max_steps": 4},
}


def _space(**over):
    d = json.loads(json.dumps(TINY))
    for k, v in over.items():
        d[k] = v
    return parse_space(d)


# --- space parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "over, field",
    [
        ({"bogus": {}}, "bogus: unknown section"),
        ({"space": {"pipeline": [1]}}, "space.pipeline: unknown axis"),
        ({"space": {"pp": []}}, "space.pp: must be a non-empty list"),
        ({"space": {"pp": 2}}, "space.pp: must be a non-empty list"),
        (
            {"space": {"chunk_size": [64], "max_num_batched_tokens": [64]}},
            "space.max_num_batched_tokens: sets the same",
        ),
        ({"space": {"num_gpus": [0]}}, "space.num_gpus: must be a list of positive integers"),
        ({"space": {"pp": [1, 2], "num_gpus": [7]}}, "space.num_gpus: no configuration"),
        ({"space": {"policy": ["vllm-nope"]}}, "space: engine.policy"),
        ({"space": {"pp": [0]}}, "space: cluster.pipeline_parallel_size"),
        ({"slo": {}}, "slo: give at least one objective"),
        ({"slo": {"p95_ttft_ms": 1}}, "slo.p95_ttft_ms: unknown objective"),
        ({"slo": {"p99_ttft_ms": -1}}, "slo.p99_ttft_ms: must be a positive number"),
        ({"search": {"rel_tolerance": 2}}, "search.rel_tolerance"),
        ({"search": {"max_steps": 0}}, "search.max_steps"),
        ({"search": {"steps": 3}}, "search.steps: unknown setting"),
        ({"base": {"workload": {"request_rate": 3}}}, "base.workload.request_rate"),
        (
            {"space": {"pp": list(range(1, 101)), "tp": list(range(1, 102)), "num_gpus": [1]}},
            "space: the space file has 10,100 configurations (pp 100 x tp 101 values), more than the 10,000",
        ),
    ],
)
def test_space_errors_name_the_field(over, field):
    with pytest.raises(PPSimError) as e:
        _space(**over)
    assert field in str(e.value)
    assert "\n" not in str(e.value)


def test_space_expands_product_with_aliases_tables_and_gpu_filter():
    sp = _space(
        space={
            "tp": [1, 2],
            "pp": [1, 2, 4],
            "num_gpus": [2, 4],
            "chunk_size": [128],
            "scheduler": [{"policy": "vllm-sync"}, {"policy": "vllm-batch-queue", "pp_throttle": False}],
            "engine.gpu_memory_utilization": [0.8],
        }
    )
    # (tp, pp) with tp*pp in {2, 4}: (1,2) (1,4) (2,1) (2,2) -> 4 x 2 schedulers
    assert len(sp.configs) == 8 and sp.filtered == 4
    s = sp.configs[-1].scenario
    assert s.engine.policy.max_num_batched_tokens == 128 and s.engine.gpu_memory_utilization == 0.8
    assert not hasattr(s.engine.policy, "chunked_prefill_size")  # SGLang's chunk is not a vLLM policy's knob
    ring = _space(space={"chunk_size": [128], "policy": ["sglang-ring"]}).configs[0].scenario.engine.policy
    assert ring.chunked_prefill_size == 128 and not hasattr(ring, "max_num_batched_tokens")
    assert s.engine.policy == "vllm-batch-queue" and s.engine.policy.pp_throttle is False
    assert sp.configs[0].labels["scheduler"] == "policy=vllm-sync"


def test_space_file_toml_yaml_and_bad_files(tmp_path: Path, ppsim_cli):
    (tmp_path / "s.yaml").write_text("base: {model: tiny}\nspace: {pp: [1, 2]}\nslo: {p99_ttft_ms: 100}\n")
    assert len(load_space(tmp_path / "s.yaml").configs) == 2
    (tmp_path / "bad.toml").write_text("[space\npp = [1]\n")
    with pytest.raises(PPSimError, match="--space: cannot parse"):
        load_space(tmp_path / "bad.toml")
    with pytest.raises(PPSimError, match="--space: cannot read"):
        load_space(tmp_path / "missing.toml")
    (tmp_path / "unk.toml").write_text("[space]\npp = [1]\nwidgets = [3]\n[slo]\np99_ttft_ms = 5\n")
    r = ppsim_cli("sweep", "--space", str(tmp_path / "unk.toml"), "--output-dir", str(tmp_path / "o"))
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: space.widgets: unknown axis") and r.stderr.count("\n") == 1


def test_example_spaces_parse():
    root = Path(__file__).resolve().parents[1] / "experiments" / "spaces"
    files = sorted(root.glob("*.toml"))
    assert files
    for f in files:
        assert load_space(f).configs


# --- bisection ----------------------------------------------------------------------------------


def _toy(threshold: float, capacity: float, calls: list[float]):
    def probe(rate: float) -> Probe:
        calls.append(rate)
        ok = rate <= threshold
        return Probe(rate, ok, None if ok else "p99_ttft_ms", {"request_throughput": capacity})

    return probe


@pytest.mark.parametrize("threshold", [0.7, 3.3, 9.99, 5.0])
def test_bisection_on_monotone_toy(threshold):
    calls: list[float] = []
    out = bisect_rate(_toy(threshold, 10.0, calls), rel_tolerance=0.01, max_steps=20)
    assert math.isinf(calls[0])
    assert out["max_rate_rps"] <= threshold < out["max_rate_rps"] + 0.1 + 1e-12
    assert out["limit"] == "p99_ttft_ms" and out["best"].ok
    assert len(out["probes"]) == len(calls) <= 1 + math.ceil(math.log2(100)) + 1


def test_bisection_saturation_ok_and_never_ok():
    out = bisect_rate(_toy(math.inf, 4.0, []), 0.05, 8)
    assert out["max_rate_rps"] == 4.0 and out["limit"] == "throughput" and len(out["probes"]) == 1
    calls: list[float] = []
    out = bisect_rate(_toy(-1.0, 8.0, calls), 0.05, 3)
    assert out["max_rate_rps"] == 0.0 and out["best"] is None and len(calls) == 4
    assert calls[1:] == [4.0, 2.0, 1.0]


# --- end to end -----------------------------------------------------------------------------------


def _strip(results):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in results]


def test_sweep_resume_skips_done_configs(tmp_path: Path):
    sp = _space()
    rep = run_sweep(sp, tmp_path, workers=1, progress=False)
    assert rep.evaluated == 2 and rep.reused == 0 and rep.simulated_runs > 2
    assert all(r["status"] == "ok" and r["max_rate_rps"] > 0 for r in rep.results)
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    rep2 = run_sweep(sp, tmp_path, workers=1, progress=False)
    assert rep2.evaluated == 0 and rep2.reused == 2 and rep2.simulated_runs == 0
    assert _strip(rep2.results) == _strip(rep.results)
    # remove one result: only that configuration runs again, with the same answer
    key = make_tasks(sp)[1].key
    (tmp_path / "results" / f"{key}.json").unlink()
    rep3 = run_sweep(sp, tmp_path, workers=1, progress=False)
    assert rep3.evaluated == 1 and rep3.reused == 1
    assert _strip(rep3.results) == _strip(rep.results)
    # a changed SLO is a different key: nothing reused
    rep4 = run_sweep(_space(slo={"p99_ttft_ms": 9}), tmp_path, workers=1, progress=False)
    assert rep4.reused == 0


DAMAGE = [
    ("[]", "a JSON list, not an object"),
    ('"x"', "a JSON str, not an object"),
    ("5", "a JSON int, not an object"),
    ("{", "unreadable (JSONDecodeError)"),
    (lambda r: r.pop("num_gpus"), "num_gpus: Field required"),
    (lambda r: r.update(labels=["pp"]), "labels: Input should be a valid dictionary"),
    (lambda r: r.update(max_rate_rps="abc"), "max_rate_rps: Input should be a valid number"),
    (lambda r: r.pop("at_max_rate"), "status ok without at_max_rate"),
    (lambda r: r.update(key="0" * 16), "holds the result of '0000000000000000'"),
    ("{}", "version: Field required"),
]


def test_damaged_results_are_redone_and_named(tmp_path: Path, capsys):
    """A result file that is not what evaluate() writes is evaluated again, with one line on stderr
    naming it; it was a traceback (``[]``, no num_gpus, labels a list) or reused (a rate of "abc")."""
    sp = _space()
    first = run_sweep(sp, tmp_path, workers=1, progress=False)
    key = make_tasks(sp)[0].key
    path = tmp_path / "results" / f"{key}.json"
    good = path.read_text()
    for damage, why in DAMAGE:
        if callable(damage):
            r = json.loads(good)
            damage(r)
            damage = json.dumps(r)
        path.write_text(damage)
        capsys.readouterr()
        rep = run_sweep(sp, tmp_path, workers=1, progress=False)
        err = capsys.readouterr().err
        assert rep.evaluated == 1 and rep.reused == 1, why
        assert err.count("\n") == 1 and f"{key}.json: {why}" in err, err
        assert _strip(rep.results) == _strip(first.results)
    capsys.readouterr()
    rep = run_sweep(sp, tmp_path, workers=1, progress=False)  # the file was rewritten whole
    assert rep.reused == 2 and capsys.readouterr().err == ""


def test_memory_infeasible_reported_not_dropped(tmp_path: Path):
    sp = _space(
        base={"model": "llama-2-70b", "workload": {"num_prompts": 8, "random_input_len": 64, "random_output_len": 4}},
        space={"tp": [1, 8], "pp": [1], "max_num_seqs": [8]},
        search={"max_steps": 2, "rel_tolerance": 0.2},
        slo={"p99_ttft_ms": 5000},
    )
    rep = run_sweep(sp, tmp_path, workers=1, progress=False)
    by_tp = {r["labels"]["tp"]: r for r in rep.results}
    assert by_tp["1"]["status"] == "no-fit" and by_tp["1"]["message"].startswith("memory:")
    assert by_tp["1"]["runs"] == 0
    assert by_tp["8"]["status"] == "ok"
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "no-fit"] and rows[1]["tp"] == "1"


def test_local_pool_matches_serial(tmp_path: Path):
    sp = _space(space={"pp": [1, 2], "max_num_seqs": [4, 8]})
    a = run_sweep(sp, tmp_path / "a", workers=1, progress=False)
    b = run_sweep(sp, tmp_path / "b", workers=2, progress=False)
    assert _strip(a.results) == _strip(b.results)
    assert (tmp_path / "a" / "sweep.csv").read_text() == (tmp_path / "b" / "sweep.csv").read_text()


def test_local_and_ray_identical(tmp_path: Path):
    pytest.importorskip("ray")
    sp = _space()
    a = run_sweep(sp, tmp_path / "a", executor="local", workers=2, progress=False)
    b = run_sweep(sp, tmp_path / "b", executor="ray", workers=2, progress=False)
    assert _strip(a.results) == _strip(b.results)
    assert (tmp_path / "a" / "sweep.csv").read_text() == (tmp_path / "b" / "sweep.csv").read_text()


def test_cli_sweep_prints_table_and_writes_files(tmp_path: Path, ppsim_cli):
    f = tmp_path / "s.toml"
    f.write_text(
        '[base]\nmodel = "tiny"\n[base.workload]\nnum_prompts = 16\nrandom_input_len = 32\n'
        "random_output_len = 4\n[space]\npp = [1, 2]\n[slo]\np99_ttft_ms = 50\n[search]\nmax_steps = 3\n"
    )
    r = ppsim_cli("sweep", "--space", str(f), "--output-dir", str(tmp_path / "o"), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "rate/s/GPU" in r.stdout and "2 evaluated" in r.stdout
    assert "2/2 configs" in r.stderr and "ETA" in r.stderr
    assert len(list((tmp_path / "o" / "results").glob("*.json"))) == 2


# --- helpers ------------------------------------------------------------------------------------


def test_pareto_front_and_progress_line():
    pts = [(1.0, 1.0), (2.0, 3.0), (1.5, 0.5), (3.0, 2.0), (4.0, 5.0)]
    assert pareto_front(pts) == [0, 1, 4]
    p = Progress(4, enabled=False)
    p.t0 -= 10
    p.update(1)
    line = p.line(p.t0 + 10)
    assert "1/4 configs" in line and "25.0%" in line and "ETA 0:30" in line


# --- failures, interrupts, flags, keys (review fixes) ----------------------------------------------


def test_unexpected_exception_is_one_error_row_not_a_dead_sweep(tmp_path: Path, monkeypatch):
    import ppsim.sweep.evaluate as ev

    real = ev.bisect_rate

    def flaky(probe, tol, steps):
        if flaky.calls == 0:
            flaky.calls += 1
            raise ZeroDivisionError("float division by zero\nsecond line")
        return real(probe, tol, steps)

    flaky.calls = 0
    monkeypatch.setattr(ev, "bisect_rate", flaky)
    rep = run_sweep(_space(), tmp_path, workers=1, progress=False)
    statuses = sorted(r["status"] for r in rep.results)
    assert statuses == ["error", "ok"]
    err = next(r for r in rep.results if r["status"] == "error")
    assert err["message"] == "ZeroDivisionError: float division by zero" and err["runs"] == 0
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert rows[-1]["status"] == "error" and rows[-1]["message"].startswith("ZeroDivisionError")
    # an error is retried on resume (the bug may be fixed); the ok result is reused
    rep2 = run_sweep(_space(), tmp_path, workers=1, progress=False)
    assert rep2.reused == 1 and rep2.evaluated == 1 and all(r["status"] == "ok" for r in rep2.results)


def test_pool_failure_outside_evaluate_is_an_error_row():
    import dataclasses

    from ppsim.sweep.executors import run_local

    tasks = make_tasks(_space())
    bad = dataclasses.replace(tasks[0], labels={"pp": lambda: 0})  # cannot be pickled to the worker
    out = {r["key"]: r for r in run_local([bad, tasks[1]], workers=2)}
    assert out[bad.key]["status"] == "error" and "\n" not in out[bad.key]["message"]
    assert out[tasks[1].key]["status"] == "ok"


def test_keyboard_interrupt_cancels_pool_and_keeps_finished(tmp_path: Path, monkeypatch):
    import ppsim.sweep.executors as ex

    aborted = []
    real_abort = ex._abort_pool

    def spy(pool):
        aborted.append((pool, list(pool._processes.values())))
        real_abort(pool)

    monkeypatch.setattr(ex, "_abort_pool", spy)
    tasks = make_tasks(_space(space={"pp": [1, 2], "max_num_seqs": [4, 8, 16]}))
    gen = ex.run_local(tasks, workers=2)
    first = next(gen)
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)
    assert first["status"] == "ok" and len(aborted) == 1
    pool, procs = aborted[0]
    assert pool._shutdown_thread and procs
    for proc in procs:  # the configurations in flight are stopped, not waited for
        proc.join(timeout=10)
        assert not proc.is_alive()
    with pytest.raises(RuntimeError):
        pool.submit(len, [])  # shut down


@pytest.mark.parametrize("signal, rc, said", [(KeyboardInterrupt, 130, "interrupted"), (Terminated, 143, "SIGTERM")])
def test_cli_interrupt_exits_130_with_finished_results_saved(tmp_path: Path, monkeypatch, capsys, signal, rc, said):
    """Ctrl-C: 130; SIGTERM (``main`` raises Terminated from its handler): 143, as every command."""
    import ppsim.sweep.runner as runner
    from ppsim.cli import main

    def one_then_interrupt(tasks, *a, **k):
        from ppsim.sweep.evaluate import evaluate

        yield evaluate(tasks[0])
        raise signal

    monkeypatch.setattr(runner, "run_tasks", one_then_interrupt)
    f = tmp_path / "s.toml"
    f.write_text(
        '[base]\nmodel = "tiny"\n[base.workload]\nnum_prompts = 16\nrandom_input_len = 32\n'
        "random_output_len = 4\n[space]\npp = [1, 2]\n[slo]\np99_ttft_ms = 50\n[search]\nmax_steps = 3\n"
    )
    assert main(["sweep", "--space", str(f), "--output-dir", str(tmp_path / "o"), "--no-progress"]) == rc
    err = capsys.readouterr().err
    assert "1 configurations evaluated" in err and said in err
    assert len(list((tmp_path / "o" / "results").glob("*.json"))) == 1


@pytest.mark.parametrize(
    "flags, msg",
    [
        (["--ray-address", "10.0.0.1:6379"], "--ray-address: only used with --executor ray"),
        (["--executor", "ray", "--ray-address", "auto", "--workers", "4"], "--workers: ignored when connecting"),
        (["--workers", "0"], "--workers: must be >= 1"),
        (["--executor", "ray", "--ray-address", ""], "--ray-address: empty; give the cluster's HOST:PORT"),
        (["--executor", "ray", "--ray-address", " "], "--ray-address: empty"),
    ],
)
def test_contradictory_executor_flags_rejected(tmp_path: Path, flags, msg, capsys):
    from ppsim.cli import main

    rc = main(["sweep", "--space", str(tmp_path / "never-read.toml"), "--output-dir", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and err.count("\n") == 1
    with pytest.raises(PPSimError, match="--ray-address"):
        run_sweep(_space(), tmp_path, executor="local", ray_address="auto", progress=False)


def test_profile_key_follows_contents_not_path(tmp_path: Path):
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "meta.json").write_text('{"schema_version": 1}')
    (prof / "fits.json").write_text('{"attn_qkv": 1}')
    sp = lambda: _space(base={**TINY["base"], "cost": {"kind": "profile", "profile_dir": str(prof)}})  # noqa: E731
    k1 = [t.key for t in make_tasks(sp())]
    assert [t.key for t in make_tasks(sp())] == k1  # same contents, same keys
    (prof / "fits.json").write_text('{"attn_qkv": 2}')  # re-calibrated into the same directory
    k2 = [t.key for t in make_tasks(sp())]
    assert set(k1).isdisjoint(k2)
    (prof / "meta.json").write_text('{"schema_version": 1, "date": "later"}')
    assert set(k2).isdisjoint(t.key for t in make_tasks(sp()))
    # the analytic cost model's keys do not look at any profile
    assert [t.key for t in make_tasks(_space())] == [t.key for t in make_tasks(_space())]


def test_small_example_throttle_axis_can_bind():
    """pp_throttle caps admissions per step at max_num_seqs // pp; the axis matters only if a step's
    token budget holds more prefills than that for some configuration with pp > 1."""
    sp = load_space(Path(__file__).resolve().parents[1] / "experiments" / "spaces" / "llama2-70b-small.toml")
    assert {c.labels["scheduler"] for c in sp.configs} >= {
        "policy=vllm-batch-queue,pp_throttle=true",
        "policy=vllm-batch-queue,pp_throttle=false",
    }
    binds = [
        c
        for c in sp.configs
        if c.scenario.cluster.pipeline_parallel_size > 1
        and c.scenario.engine.step_token_budget // c.scenario.workload.random_input_len
        > c.scenario.engine.max_num_seqs // c.scenario.cluster.pipeline_parallel_size
    ]
    assert binds


def test_atomic_write_removes_tmp_on_failure(tmp_path: Path, monkeypatch):
    import ppsim.metrics.io as io_mod

    target = tmp_path / "r.json"
    io_mod.atomic_write(target, "old\n")
    with pytest.raises(UnicodeEncodeError):
        io_mod.atomic_write(target, "bad \ud800")  # fails inside the write
    monkeypatch.setattr(io_mod.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        io_mod.atomic_write(target, "new\n")  # fails at the rename
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
