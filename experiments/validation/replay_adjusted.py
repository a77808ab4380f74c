"""The speed-adjusted replay of finished ``ppsim validate`` runs, from their output dirs.

``ppsim validate`` reports, beside the prediction's error, a replay of the simulator with the host's
compute speed during the engine runs (:func:`ppsim.validate.run.speed_adjusted`): the engine's stage
time over the profile's prediction for the same plans, summed over every micro-batch. What is left
is the scheduling, pipeline and control-path error. This script recomputes it for validation dirs
written before the replay existed (or with another profile of the same host) and prints, per
scenario and as medians over them, the prediction's error beside the replay's. Not a prediction:
``factor`` comes from the runs it is compared with.

``--jitter-draws K`` adds K replays whose stage computes are drawn from the engine's own measured /
predicted ratios (:class:`ppsim.cost.scaled.JitteredCompute`): the host's step-time spread on top of
its mean speed, which with two or more micro-batches in flight costs latency that a mean cannot show.

``--by-class`` adds a replay with the runs' speed apart for prefill / mixed and for decode computes
(:class:`ppsim.cost.scaled.ClassScaledCompute`): this VM's speed states scale the two classes differently
(docs/validation.md, part 13).

``--with-path`` adds the replay with the engine core's control path at the runs' speed too: the launch,
return, schedule and update spans (and a stage's turnaround) times ``path factor``, the engine's own
control-path gaps over the simulator's (:func:`path_factor`, the gaps where the far side was waiting,
``calibration.core_path.step_paths``), on top of the stage computes at ``factor``; none for the
policies that schedule ahead (vllm-async, vllm-mrv2), whose launch gaps hold waits. The plain replay
scales the computes only, and on this VM the engine core's path moves with the host too (not in step
with the computes).

``--without-idle`` adds the prediction again with the profile's ``stage_idle`` charge removed (the step
after an idle gap costs what a back-to-back one does): what that calibration term is worth on these runs.
A prediction like the first, not a replay. ``--without-spread`` adds the prediction and the replay
again with the profile's ``stage_spread`` not drawn (every compute its mean, as before calibration
measured the live engine's step-to-step spread): what that term is worth on the same runs;
``--without-turnaround`` the same for the profile's ``turnaround`` (a stage past the first restarting
at once after a compute).
``--with-live`` predicts with the profile's whole ``live_stage``
factor at the run's depth charged as measured (the live engine's stage compute over the same steps alone,
``live_fits.fit_live``; the simulator charges its level live_stage(1) and its depth ratio live_stage(2) over the
level as charged at PP > 1, each held at 1 or more);
``--without-depth`` predicts and replays without that ratio. ``--without-level`` predicts with the level at 1 (as
before it was charged, 2026-12-03); ``--depth-over-measured-level`` with the depth ratio over the one-stage level as
measured, ``max(live_stage(2) / live_stage(1), 1)``, the rule before 2026-12-04 (now over the level as charged,
``max(live_stage(1), 1)``, so that PP=2 charges ``max(live_stage(1), live_stage(2), 1)``; they differ only where the
one-stage level is under 1, docs/validation.md, part 16); ``--depth-over-charged-level`` with ``live_stage``'s ratio
over the level as charged, the rule until a profile has ``live_depth``; ``--depth-over-model`` with the depth ratio
from the same live runs over the stage model instead of over the steps timed alone (``live_fits.fit_depth``,
``plan_class.py live``): charged since 2026-12-04 as a profile's ``live_depth``, and for profiles made before it
computed from their ``samples.csv``. ``--level-over-model`` charges those live runs over the stage model as
measured, unheld: the one-stage runs over the model as the level (the simulator charges them over the steps
timed alone, held at 1), ``live_depth`` unheld at PP=2; written when the engine's stages got cores of their own
and its live runs came in under the model (docs/moe.md, seventeenth round).
``--with-stage-layers`` predicts from the run's profile fitted again with its ``stage_layers`` charged
(``calibration/stage_layers.py``: a stage's layers at that ratio of the profiler stack's per-layer cost, the glue and
the live ratios over that model; recorded only from part 17, charged by calibration since docs/validation.md part 19,
so for a profile made since it is the plain prediction refitted with today's code).
``--without-corun`` predicts without the profile's ``stage_corun`` (stages computing at once on the host, charged to
a micro-batch that starts while an earlier one is in the pipeline). Runs recorded with another depth ratio, co-run
factor or live level (none before they were charged: no ``depth_factor`` / ``corun_factor`` / ``level_factor`` in
``validation.json``) get a "predicted now" row: the current model on the same runs.

The last column is the pipeline bubble's error in fraction points.

Run: python experiments/validation/replay_adjusted.py [--jitter-draws K] [--with-path] [--without-idle]
     [--without-spread] [--without-turnaround] [--with-live] [--without-depth] [--without-corun]
     [--without-level] [--depth-over-measured-level] [--depth-over-charged-level] [--depth-over-model]
     [--level-over-model] [--with-stage-layers] DIR [...]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from calibration.core_path import step_paths
from experiments.validation.control_path import read_ops
from experiments.validation.runfiles import reading_run
from experiments.validation.tables import RELATIVE as METRICS  # the latency metrics, bubble apart
from ppsim.cli import Parser, run_main
from ppsim.config import build_scenario
from ppsim.cost.profiled import ProfiledCost, corun_ratio, depth_ratio
from ppsim.cost.scaled import ClassScaledCompute, ScaledCompute
from ppsim.deployment import prepare
from ppsim.errors import PPSimError
from ppsim.metrics.records import OpRecord
from ppsim.validate.run import (
    depth_factor_of,
    jittered,
    level_factor_of,
    model_factor,
    replay_with,
    speed_adjusted,
)
from ppsim.validate.steps import corun_factor_of

BUBBLE = "pipeline_bubble_fraction"
COLUMNS = (*METRICS, BUBBLE)
MAX_DRAWS = 100  # jittered replays per dir


class WithoutIdle(ScaledCompute):
    """The profile's cost model with no idle-gap penalty (``stage_idle`` of zero at every gap)."""

    has_idle = False

    def __init__(self, inner: object) -> None:
        super().__init__(inner, 1.0)

    def idle_time(self, stage: object, gap_s: float) -> float:
        return 0.0


class WithoutSpread(ScaledCompute):
    """The profile's cost model (times ``factor``) with no step-to-step spread: every compute its mean."""

    spread = None

    def __init__(self, inner: object, factor: float = 1.0) -> None:
        super().__init__(inner, factor)


class WithoutTurnaround(ScaledCompute):
    """The profile's cost model (times ``factor``) with no turnaround: a stage restarts at once."""

    turnaround_s = 0.0
    turnaround_per_req_s = 0.0

    def __init__(self, inner: object, factor: float = 1.0) -> None:
        super().__init__(inner, factor)


PATH_KINDS = ("launch", "return", "schedule", "update")
# they schedule the next step before the last one's tokens are back, so a launch gap there holds waits
# (the simulator's up to 40 ms on vllm-mrv2), not the path: no control-path factor for them
SCHEDULES_AHEAD = ("vllm-async", "vllm-mrv2")


class WithPath(ScaledCompute):
    """The profile's cost model with its stage computes (and idle charge) times ``factor`` and the engine
    core's control path times ``path``: launch, return, the core's CPU per step, a ring's relay and a
    stage's turnaround."""

    def __init__(self, inner: object, factor: float, path: float) -> None:
        super().__init__(inner, factor)
        if not path > 0:
            raise ValueError(f"control-path factor {path} must be > 0")
        self.path = path
        if getattr(inner, "relay_time", None) is not None:
            self.relay_time = lambda n: path * inner.relay_time(n)

    @property
    def turnaround_s(self) -> float:
        return self.path * float(getattr(self.inner, "turnaround_s", 0.0) or 0.0)

    @property
    def turnaround_per_req_s(self) -> float:
        return self.path * float(getattr(self.inner, "turnaround_per_req_s", 0.0) or 0.0)

    def launch_time(self, n: int) -> float:
        return self.path * self.inner.launch_time(n)

    def return_time(self, n: int) -> float:
        return self.path * self.inner.return_time(n)

    def cpu_time(self, kind: str, n: int) -> float:
        return self.path * self.inner.cpu_time(kind, n)


def path_factor(engine_runs: list[list[OpRecord]], sim: list[OpRecord]) -> float | None:
    """The engine's control path over the simulator's on the same scenario: per kind (launch, return,
    schedule, update) and request count ``n`` the median gap of each side
    (:func:`calibration.core_path.step_paths`: only gaps where the far side was waiting), summed over the
    engine's gaps with the engine's median against the simulator's. None where they share no (kind, n)."""

    def medians(runs: list[list[OpRecord]]) -> dict[tuple[str, int], tuple[int, float]]:
        pooled: dict[tuple[str, int], list[float]] = {}
        for ops in runs:
            for kind, pairs in step_paths(ops).items():
                if kind in PATH_KINDS:
                    for n, t in pairs:
                        pooled.setdefault((kind, n), []).append(t)
        return {k: (len(v), statistics.median(v)) for k, v in pooled.items()}

    eng, model = medians(engine_runs), medians([sim])
    shared = [k for k in eng if k in model]
    measured = sum(eng[k][0] * eng[k][1] for k in shared)
    predicted = sum(eng[k][0] * model[k][1] for k in shared)
    return measured / predicted if shared and measured > 0 and predicted > 0 else None


def run_path_factor(d: Path, policy: str) -> float | None:
    """:func:`path_factor` of a run dir (its ``engine-*/stage_ops.csv`` and ``sim/stage_ops.csv``); None
    without them, or for a ``policy`` that schedules ahead (:data:`SCHEDULES_AHEAD`)."""
    engines = sorted(d.glob("engine-*/stage_ops.csv"))
    if policy in SCHEDULES_AHEAD or not engines or not (d / "sim" / "stage_ops.csv").is_file():
        return None
    return path_factor([read_ops(p) for p in engines], read_ops(d / "sim" / "stage_ops.csv"))


def live_factor_of(cost: object) -> float:
    """The profiled model's ``live_factor`` under any wrappers (a ring policy's return path, ...)."""
    return model_factor(cost, "live_factor")


class WithoutDepth(ScaledCompute):
    """The profile's cost model (times ``factor``) with its depth ratio taken off the stage computes (a
    stage at PP > 1 as fast as the stages-alone model says, as before the ratio was charged), or replaced
    by ``depth``; the idle charge times ``factor``, as :class:`ScaledCompute` does."""

    def __init__(self, inner: object, factor: float = 1.0, depth: float = 1.0) -> None:
        super().__init__(inner, factor)
        self.ratio = depth / depth_factor_of(inner)

    def stage_time(self, stage: object, plan: object) -> float:
        return self.factor * self.ratio * self.inner.stage_time(stage, plan)


def depth_over_level(cost: object, pp: int, charged: bool = False) -> float:
    """``live_stage``'s depth ratio (over the same steps timed alone, :func:`ppsim.cost.profiled.depth_ratio`):
    over the one-stage level as measured, ``max(live_stage(2) / live_stage(1), 1)``, the rule before 2026-12-04
    (above the later ones where that level is under 1); with ``charged`` over the level as charged, the rule
    until a profile has ``live_depth``. 1 at one stage (``pp``)."""
    while not hasattr(cost, "p") and hasattr(cost, "inner"):
        cost = cost.inner
    live = cost.p.fits.get("live_stage") if hasattr(cost, "p") else None
    return depth_ratio(live, charged) if live is not None and pp > 1 else 1.0


def live_inputs(v: dict, cost: object, flag: str) -> tuple[ProfiledCost, list[dict], float] | None:
    """What calibration fits its live ratios from, for the run's profile: the bare stage model, the rows of
    its ``samples.csv`` and its co-run charge (:func:`calibration.live_fits.live_ratios`); ``flag`` names
    the option in the one-line refusal for a profile without them. None off a profiled model."""
    from calibration.artifact import read_samples

    while not hasattr(cost, "p") and hasattr(cost, "inner"):
        cost = cost.inner
    if not hasattr(cost, "p"):
        return None
    corun = corun_ratio(cost.p.fits["stage_corun"]) if "stage_corun" in cost.p.fits else 1.0
    profile = Path(v["scenario"]["cost"]["profile_dir"])
    if not (profile / "samples.csv").is_file():
        raise PPSimError(f"{flag}: {profile} has no samples.csv (the live runs); give runs of a full profile")
    return ProfiledCost(cost.p, cost.shape, None, 1), read_samples(profile), corun


def depth_over_model(v: dict, cost: object, pp: int) -> float:
    """The depth ratio from calibration's live runs over the stage model rather than over the same steps timed
    alone (:func:`calibration.live_fits.fit_depth`, from the run's profile's ``samples.csv``; charged since
    2026-12-04 where a profile has it): two stages over one, both over the model, held at 1 or more; 1 at one
    stage or without live runs at both depths."""
    from calibration.live_fits import fit_depth

    inputs = live_inputs(v, cost, "--depth-over-model") if pp > 1 else None
    fit = fit_depth(*inputs) if inputs is not None else None
    return max(float(fit.coef["c0"]), 1.0) if fit is not None else 1.0


def level_over_model(v: dict, cost: object, pp: int) -> tuple[float, float]:
    """(level, depth ratio) charging calibration's live runs over the stage model as measured, unheld: the
    level the live runs at one stage over the model (not over the steps alone, held at 1), the depth ratio
    those at two stages over those at one (``live_depth``, not held at 1); their product at PP=2 is the
    two-stage live runs over the model. 1 for what the profile has no live runs for (nothing measured,
    nothing charged, as the simulator does)."""
    from calibration.live_fits import fit_depth, live_ratios

    inputs = live_inputs(v, cost, "--level-over-model")
    ratios = live_ratios(*inputs) if inputs is not None else {}
    fit = fit_depth(*inputs) if inputs is not None and pp > 1 else None
    return ratios[1][1] if 1 in ratios else 1.0, float(fit.coef["c0"]) if fit is not None else 1.0


class CorunAs(ScaledCompute):
    """The profile's cost model (times ``factor``) with ``corun`` as its charge for stages computing at once
    (1: none, as before calibration measured ``stage_corun``)."""

    def __init__(self, inner: object, corun: float, factor: float = 1.0) -> None:
        super().__init__(inner, factor)
        self.corun_factor = corun


class LevelAs(ScaledCompute):
    """The profile's cost model with ``level`` as its charged live level (1: none, as before the level was
    charged, 2026-12-03); idle unscaled."""

    def __init__(self, inner: object, level: float) -> None:
        super().__init__(inner, 1.0)
        self.ratio = level / level_factor_of(inner)
        self.level_factor = level

    def stage_time(self, stage: object, plan: object) -> float:
        return self.ratio * self.inner.stage_time(stage, plan)


class WithLive(ScaledCompute):
    """The profile's cost model with its whole ``live_stage`` factor at this depth charged on every stage
    compute, as measured (the simulator charges the level held at 1 or more and the depth ratio held at 1
    or more); idle unscaled."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner, live_factor_of(inner) / depth_factor_of(inner) / level_factor_of(inner))

    def idle_time(self, stage: object, gap_s: float) -> float:
        return self.inner.idle_time(stage, gap_s)


def prepared(d: Path, profile: str | None = None) -> tuple[dict, object]:
    """A finished run's ``validation.json`` and its scenario prepared as the simulator ran it (the
    engine's KV pool), with ``profile`` in place of the run's own profile if given."""
    v = json.loads((d / "validation.json").read_text())
    sc = dict(v["scenario"])
    if profile is not None:
        sc["cost"] = {**sc["cost"], "profile_dir": profile}
    blocks = int(v["engine_summaries"][0]["kv_num_blocks"])
    return v, dataclasses.replace(prepare(build_scenario(None, sc)), num_blocks=blocks)


def pick(rows: list[dict]) -> dict[str, float]:
    """A report's rows as {metric: error}, the columns this script prints."""
    return {r["metric"]: r["error"] for r in rows if r["metric"] in COLUMNS}


_CHARGED: dict[Path, tempfile.TemporaryDirectory] = {}  # profile -> its copy with stage_layers charged


def charged_profile(profile: Path) -> Path | None:
    """``profile`` fitted again with its ``stage_layers`` charged, into a temporary copy made once per profile
    (a draw's runs share one; removed at exit); None without ``stage_layers`` samples."""
    from calibration.artifact import read_samples
    from calibration.calibrate import analyse_and_write
    from calibration.stage_layers import OP
    from ppsim.models.shape import ModelShape

    if profile not in _CHARGED:
        rows = read_samples(profile)
        if not any(r["op"] == OP for r in rows):
            return None
        meta = json.loads((profile / "meta.json").read_text())
        tmp = tempfile.TemporaryDirectory()
        analyse_and_write(rows, ModelShape(**meta["model"]), meta, tmp.name, charge_stage_layers=True)
        _CHARGED[profile] = tmp
    return Path(_CHARGED[profile].name)


def with_stage_layers(d: Path, v: dict) -> dict[str, float]:
    """The prediction from the run's profile fitted again with its ``stage_layers`` charged (a stage's layers
    at that ratio of the stack's per-layer cost, the glue and the live ratios over that model; charged since
    docs/validation.md part 19). The plain prediction's errors where the profile has no such samples."""
    charged = charged_profile(Path(v["scenario"]["cost"]["profile_dir"]))
    if charged is None:
        return pick(v["rows"])
    _, prep = prepared(d, str(charged))
    return pick(replay_with(prep, prep.cost, v["engine_summaries"])["rows"])


def class_adjusted(cost: object, steps: list[dict], factor: float) -> ClassScaledCompute:
    """``cost`` with the runs' speed apart for prefill / mixed and decode computes (measured over predicted,
    summed per class; a class the runs did not have takes ``factor``, the whole runs')."""

    def of(prefill: bool) -> float:
        m = sum(r["measured_s"] for r in steps if r["prefill"] == prefill)
        p = sum(r["predicted_s"] for r in steps if r["prefill"] == prefill)
        return m / p if m > 0 and p > 0 else factor

    return ClassScaledCompute(cost, factor, of(True), of(False))


def recorded_steps(d: Path) -> list[dict]:
    """A finished run's ``step_costs.csv``: each engine stage compute's measured and predicted seconds, and whether
    it was a prefill (the speed factor's inputs, :func:`ppsim.validate.run.speed_adjusted`)."""
    with (d / "step_costs.csv").open(newline="") as f:
        return [
            {
                "measured_s": float(r["measured_s"]),
                "predicted_s": float(r["predicted_s"]),
                "prefill": int(r["num_prefill_tokens"]) > 0,
            }
            for r in csv.DictReader(f)
        ]


def replay(
    d: Path,
    draws: int = 0,
    without_idle: bool = False,
    with_live: bool = False,
    without_spread: bool = False,
    without_turnaround: bool = False,
    without_depth: bool = False,
    without_corun: bool = False,
    by_class: bool = False,
    with_path: bool = False,
    without_level: bool = False,
    over_measured_level: bool = False,
    over_model: bool = False,
    over_charged_level: bool = False,
    level_model: bool = False,
    with_layers: bool = False,
) -> dict[str, dict[str, float]]:
    """``{"predicted": {metric: error}, "adjusted": {metric: error}, "jittered k": {...}, "factor": ...}``
    for one dir (``draws`` jittered replays; with ``without_idle`` also ``"without idle"``)."""
    v, prep = prepared(d)
    # the model that made the runs' step_costs.csv predictions: the depth ratio they were recorded with
    # (none before it was charged: no ``depth_factor`` in validation.json), so the speed factor scales it
    then = float(v.get("depth_factor", 1.0))
    recorded = prep.cost if then == depth_factor_of(prep.cost) else WithoutDepth(prep.cost, 1.0, then)
    co_then, co_now = float(v.get("corun_factor", 1.0)), corun_factor_of(prep.cost)
    if co_then != co_now:  # recorded with another co-run charge (or none)
        recorded = CorunAs(recorded, co_then)
    if float(v.get("level_factor", 1.0)) != level_factor_of(prep.cost):  # before the level was charged
        recorded = LevelAs(recorded, float(v.get("level_factor", 1.0)))
    steps = recorded_steps(d)
    rec = dataclasses.replace(prep, cost=recorded)
    adj = speed_adjusted(rec, steps, v["engine_summaries"])
    out = {"predicted": pick(v["rows"]), "adjusted": pick(adj["rows"]), "factor": adj["factor"]}
    out["predicted now"] = out["predicted"]  # the current model on the same runs: a model of another depth ratio
    if recorded is not prep.cost:  # (recorded before it was charged, or before it was held at 1 or more) again
        out["predicted now"] = pick(replay_with(prep, prep.cost, v["engine_summaries"])["rows"])
    for k in range(draws):
        out[f"jittered {k}"] = pick(jittered(rec, steps, v["engine_summaries"], seed=k)["rows"])
    if by_class:
        cls = class_adjusted(recorded, steps, adj["factor"])
        out["adjusted by class"] = pick(replay_with(prep, cls, v["engine_summaries"])["rows"])
    if with_path:
        pf = run_path_factor(d, v["scenario"]["engine"]["policy"]["kind"])
        out["path factor"] = pf
        out["adjusted with path"] = out["adjusted"]  # no factor: the plain replay
        if pf is not None:
            both = WithPath(recorded, adj["factor"], pf)
            out["adjusted with path"] = pick(replay_with(prep, both, v["engine_summaries"])["rows"])
    if without_idle:
        out["without idle"] = pick(replay_with(prep, WithoutIdle(prep.cost), v["engine_summaries"])["rows"])
    if with_live:
        out["with live"] = pick(replay_with(prep, WithLive(prep.cost), v["engine_summaries"])["rows"])
    if without_depth:
        out["without depth"] = pick(replay_with(prep, WithoutDepth(prep.cost), v["engine_summaries"])["rows"])
        bare = WithoutDepth(prep.cost, adj["factor"] * then)  # the factor against the model without it
        out["adjusted without depth"] = pick(replay_with(prep, bare, v["engine_summaries"])["rows"])
    if without_corun:
        out["without corun"] = pick(replay_with(prep, CorunAs(prep.cost, 1.0), v["engine_summaries"])["rows"])
    if without_level:
        out["without level"] = pick(replay_with(prep, LevelAs(prep.cost, 1.0), v["engine_summaries"])["rows"])
    if over_model:
        held = WithoutDepth(prep.cost, 1.0, depth_over_model(v, prep.cost, len(prep.topology.stages)))
        out["depth over model"] = pick(replay_with(prep, held, v["engine_summaries"])["rows"])
    if level_model:
        level, depth = level_over_model(v, prep.cost, len(prep.topology.stages))
        model = WithoutDepth(LevelAs(prep.cost, level), 1.0, depth)
        out["level over model"] = pick(replay_with(prep, model, v["engine_summaries"])["rows"])
    for flag, charged, kind in ((over_measured_level, False, "measured"), (over_charged_level, True, "charged")):
        if flag:
            ratio = depth_over_level(prep.cost, len(prep.topology.stages), charged)
            held = WithoutDepth(prep.cost, 1.0, ratio)
            out[f"depth over {kind} level"] = pick(replay_with(prep, held, v["engine_summaries"])["rows"])
    if with_layers:
        out["with stage layers"] = with_stage_layers(d, v)
    if without_spread:
        out["without spread"] = pick(replay_with(prep, WithoutSpread(prep.cost), v["engine_summaries"])["rows"])
        bare = WithoutSpread(recorded, adj["factor"])
        out["adjusted without spread"] = pick(replay_with(prep, bare, v["engine_summaries"])["rows"])
    if without_turnaround:
        out["without turnaround"] = pick(replay_with(prep, WithoutTurnaround(prep.cost), v["engine_summaries"])["rows"])
        bare = WithoutTurnaround(recorded, adj["factor"])
        out["adjusted without turnaround"] = pick(replay_with(prep, bare, v["engine_summaries"])["rows"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="experiments/validation/replay_adjusted.py", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", help="ppsim validate output dirs")
    ap.add_argument(
        "--jitter-draws",
        type=int,
        default=0,
        help="also replay with every stage compute drawn from the engine's own measured/predicted ratios, "
        "this many draws (the host's step-time spread on top of its mean speed)",
    )
    ap.add_argument(
        "--without-idle",
        action="store_true",
        help="also predict with the profile's stage_idle charge removed (what that term is worth on these runs)",
    )
    ap.add_argument(
        "--without-spread",
        action="store_true",
        help="also predict and replay with the profile's stage_spread not drawn (every compute its mean)",
    )
    ap.add_argument(
        "--without-turnaround",
        action="store_true",
        help="also predict and replay with the profile's turnaround not charged (a stage restarts at once)",
    )
    ap.add_argument(
        "--with-live",
        action="store_true",
        help="also predict with the profile's live_stage factor charged on every stage compute",
    )
    ap.add_argument(
        "--without-depth",
        action="store_true",
        help="also predict and replay without the profile's depth ratio (live_stage at PP=2 over PP=1)",
    )
    ap.add_argument(
        "--without-level",
        action="store_true",
        help="also predict with the live level at 1 (as before it was charged)",
    )
    ap.add_argument(
        "--depth-over-measured-level",
        action="store_true",
        help="also predict with the depth ratio over the one-stage level as measured (the rule before 2026-12-04; "
        "PP=2: max(live_stage(1), 1) x max(live_stage(2) / live_stage(1), 1))",
    )
    ap.add_argument(
        "--depth-over-charged-level",
        action="store_true",
        help="also predict with live_stage's depth ratio over the level as charged (the rule 2026-12-04 until a "
        "profile has live_depth; PP=2: max(live_stage(1), live_stage(2), 1))",
    )
    ap.add_argument(
        "--depth-over-model",
        action="store_true",
        help="also predict with the depth ratio from calibration's live runs over the stage model "
        "(live_depth, charged where a profile has it; for profiles made before it, from their samples.csv)",
    )
    ap.add_argument(
        "--level-over-model",
        action="store_true",
        help="also predict with calibration's live runs over the stage model charged as measured, unheld: the "
        "level the one-stage runs over the model (not over the steps alone held at 1), the depth ratio live_depth "
        "(not held at 1)",
    )
    ap.add_argument(
        "--without-corun",
        action="store_true",
        help="also predict without the profile's stage_corun (stages computing at once on the host)",
    )
    ap.add_argument(
        "--with-stage-layers",
        action="store_true",
        help="also predict from the run's profile fitted again with its stage_layers charged (a stage's layers at "
        "that ratio of the profiler stack's per-layer cost; the live ratios over that model)",
    )
    ap.add_argument(
        "--by-class",
        action="store_true",
        help="also replay with the runs' speed apart for prefill / mixed and decode computes",
    )
    ap.add_argument(
        "--with-path",
        action="store_true",
        help="also replay with the engine core's control path at the runs' speed (the engine's gaps over the "
        "simulator's), on top of the stage computes",
    )
    args = ap.parse_args(argv)
    if not 0 <= args.jitter_draws <= MAX_DRAWS:
        ap.error(f"--jitter-draws: {args.jitter_draws} is not within [0, {MAX_DRAWS}]; each draw is a replay")
    return run_main(lambda: report(args))


def check_dirs(dirs: list[str]) -> None:
    """Every dir holds the runs' validation.json and a step_costs.csv with engine steps (before any replay)."""
    for d in dirs:
        missing = [f for f in ("validation.json", "step_costs.csv") if not (Path(d) / f).is_file()]
        if missing:
            raise PPSimError(
                f"dirs: {d}: no {' or '.join(missing)}; give a `ppsim validate` output dir (one with engine runs)"
            )
        if len((Path(d) / "step_costs.csv").read_text().strip().splitlines()) < 2:
            raise PPSimError(f"dirs: {d}: step_costs.csv has no engine steps; nothing to scale the replay by")


def report(args: argparse.Namespace) -> int:
    check_dirs(args.dirs)
    res = {}
    for d in args.dirs:
        with reading_run(d):
            res[Path(d).name] = replay(
                Path(d),
                args.jitter_draws,
                args.without_idle,
                args.with_live,
                args.without_spread,
                args.without_turnaround,
                args.without_depth,
                args.without_corun,
                args.by_class,
                args.with_path,
                args.without_level,
                args.depth_over_measured_level,
                args.depth_over_model,
                args.depth_over_charged_level,
                args.level_over_model,
                args.with_stage_layers,
            )
    kinds = ["predicted", "adjusted"] + [f"jittered {k}" for k in range(args.jitter_draws)]
    kinds += ["adjusted by class"] if args.by_class else []
    kinds += ["adjusted with path"] if args.with_path else []
    kinds += ["predicted now"] if any(r["predicted now"] is not r["predicted"] for r in res.values()) else []
    kinds += ["without idle"] if args.without_idle else []
    kinds += ["with live"] if args.with_live else []
    kinds += ["without depth", "adjusted without depth"] if args.without_depth else []
    kinds += ["without corun"] if args.without_corun else []
    kinds += ["without level"] if args.without_level else []
    kinds += ["depth over measured level"] if args.depth_over_measured_level else []
    kinds += ["depth over charged level"] if args.depth_over_charged_level else []
    kinds += ["depth over model"] if args.depth_over_model else []
    kinds += ["level over model"] if args.level_over_model else []
    kinds += ["with stage layers"] if args.with_stage_layers else []
    kinds += ["without spread", "adjusted without spread"] if args.without_spread else []
    kinds += ["without turnaround", "adjusted without turnaround"] if args.without_turnaround else []
    head = "".join(f"{m[:14]:>16s}" for m in METRICS) + f"{'bubble (pts)':>14s}"
    print(f"{'scenario':40s} {'factor':>7s} {head}")
    for name, r in res.items():
        print(f"{name:40s} {r['factor']:7.3f} " + _cells(r["predicted"]))
        if args.with_path:
            pf = r["path factor"]
            print(f"{'  control-path factor':40s} " + (f"{pf:7.3f}" if pf is not None else f"{'-':>7s}"))
        for kind in kinds[1:]:
            label = "  speed-adjusted" if kind == "adjusted" else f"  {kind}"
            print(f"{label:40s} {'':7s} " + _cells(r[kind]))
    for kind in kinds:
        med = "".join(f"{statistics.median(abs(r[kind][m]) for r in res.values()):16.1%}" for m in METRICS)
        bub = [abs(r[kind][BUBBLE]) for r in res.values() if BUBBLE in r[kind]]
        med += f"{statistics.median(bub):14.3f}" if bub else ""
        print(f"{'median |error| ' + kind:40s} {'':>7s} {med}")
    return 0


def _cells(errors: dict[str, float]) -> str:
    """One row's latency errors (relative) and the bubble's (fraction points, where present)."""
    bubble = f"{errors[BUBBLE]:+14.3f}" if BUBBLE in errors else ""
    return "".join(f"{errors[m]:+16.1%}" for m in METRICS) + bubble


if __name__ == "__main__":
    sys.exit(main())
