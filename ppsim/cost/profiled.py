"""The profiled cost model: per-operator fits read from a calibration artifact, summed per stage.

An artifact is a directory written once by ``ppsim calibrate`` (``calibration/``) or
``ppsim import-vidur``; this module only reads it, so the simulator never fits at start-up and never
imports torch. Layout::

    meta.json     schema_version, source, device, torch version, dtype, threads, tp, model shape, date;
                  hardware: the preset an import was measured on (a scenario on another is refused)
    fits.json     {op: {"form": ..., "x": feature, "coef": {...}, "cv_median_abs_rel_err": ...}}
    samples.csv   the raw timings the fits came from (op, features, median/p10/p90 seconds)

Operator names follow Vidur's ``time_stats.<op>`` columns where they exist. Per decoder layer:
``input_layernorm``, ``attn_qkv``, ``attn_rope``, ``attn_prefill`` (per prefill item, chunk ``c``
over prefix ``p``), ``attn_decode`` (per step, over its decodes), ``attn_o_proj``,
``post_attention_layernorm``, ``mlp_gate_up``, ``mlp_act``, ``mlp_down``, ``add`` (twice: two
residual adds), ``layer_glue`` (the engine's per-layer time minus the sum of the operators, fitted
from whole engine stage steps: ``nn.Module`` calls, views, KV writes, Python between kernels; the grid's
middle stages and, since 2026-12-05, calibration's live engine steps timed alone) and
``all_reduce`` (twice when tp > 1; a profile without it, e.g. a Vidur import at a TP size its
network data lacks, times the two all-reduces as the roofline's ring all-reduce over the scenario's
``cluster.tp_link``). The first stage adds ``embedding``, the last ``final_norm``, ``lm_head`` and
``sampling`` over one row per request (logits only at sampled positions, as vLLM's
``compute_logits`` and the live engine), or over all tokens where the fit's feature is ``tokens``
(Vidur's RMSNorm table). ``first_glue`` and ``last_glue`` (form ``tok_req``, from ``ppsim
calibrate``'s engine stage steps) add what a first or last engine stage runs beyond those operators.
Every stage pays ``prepare_inputs`` per step. ``send_recv`` times a stage-to-stage send;
``schedule`` and ``update`` are the engine core's CPU per step; ``turnaround`` is a stage's loop between
two computes where its next input was already there (charged at PP > 1 to every stage but the first).
``stage_spread`` (``ppsim calibrate``'s
live engine runs at two stages) is the live engine's step-to-step spread of stage computes about their
mean, a mean-one table: at PP > 1 the pipelines multiply each compute by one of its ratios, drawn by
(scenario seed, stage, step id) (:attr:`ProfiledCost.spread`); ``stage_time`` stays the mean. A profile fitted
``spread_by_gap`` (docs/validation.md part 29) has a second table, ``ys_idle``, for computes after a gap longer
than its ``gap_s`` (the gap the idle charge reads).
``live_stage`` (the same runs, at one and two stages: the live engine's stage compute over the same
steps timed alone) is charged twice over: its level, ``max(live_stage(1), 1)`` at every depth
(:attr:`ProfiledCost.level_factor`: what the live engine's stage loop costs a step beyond the same step
timed alone; since 2026-12-03, docs/validation.md part 16), and its depth ratio at PP > 1, ``max(live_stage(2)
/ live_stage(1), 1)`` (:attr:`ProfiledCost.depth_factor`), what co-running stages cost each other on the
calibrated host. Where the profile has ``live_depth`` (the same live runs at two stages over one, each over the stage
model rather than over the same steps timed alone; since 2026-12-04), the simulator's model charges that as the depth
ratio instead (:func:`depth_charged`). Both are held at 1 or more: a live engine does not run a step faster than the
same step timed alone, and a ratio under 1 is the host's drift. Only the simulator's model
(:func:`load_profiled_cost`) charges the level; a ``ProfiledCost`` built directly (calibration, the checks of steps
timed alone) is the stages-alone model. ``stage_corun`` (``calibration/corun.py``: a stage's step with a second stage
process computing on the host over the same step alone, paired) is :attr:`ProfiledCost.corun_factor` at PP > 1: the
pipelines multiply every compute of a micro-batch that starts while an earlier one is still in the pipeline by it
(:mod:`ppsim.sim.fast`); ``stage_time`` never includes it, as it depends on the pipeline's state. The simulator's
model charges these three (level, depth ratio, co-run) only where the profile's ``meta.json`` marks them
``live_charges: "charged"`` or has no mark (every calibration before docs/validation.md part 25 (b));
``ppsim calibrate`` fits and reports them and marks them ``"recorded"`` since that verdict: the stages-alone model.

``stage_layers`` (:mod:`calibration.stage_layers`: a middle stage of ``n`` layers timed against one of the
profiler's stack, per layer), where a profile's fits have it, multiplies a stage's layers by its ratio at the
stage's layer count (:func:`stage_layers_ratio`): the operators and the glue are timed over the stack's layers
in turn, and a stage of fewer layers finds more of its weights in the core's caches. ``ppsim calibrate``
puts it in the fits since 2026-12-05 (docs/validation.md part 19; recorded only before).

Mixture-of-experts layers (``engine/moe.py``) replace the three ``mlp_*`` operators with
``moe_router`` (gate GEMM, softmax, top-k; over tokens), ``moe_experts`` (the grouped routed experts,
form ``tok_exp`` over the step's ``T x k`` (token, expert) pairs and the distinct experts touched) and
``moe_shared`` (the shared experts; over tokens). The distinct experts a step of ``T`` tokens touches
is the expectation :func:`ppsim.models.moe.expected_experts_touched_load` over the router's expert
load measured at calibration (``meta.json`` ``moe.expert_load``, per-expert selection probabilities
summing to k), with ``cost.moe_routing_skew``. Dense layers of a MoE model keep the ``mlp_*`` operators.

Fitted forms (seconds): ``linear`` c0 + c1 x; ``linear_floor`` max(floor, c0 + c1 x) (GEMMs: a
launch/weight-read floor, then linear in tokens); ``prefill_attn`` per item
call + tok c + cp c p + cc c^2 (with ``ctx``, plus ctx (c + p): the item's K/V gathered, docs/validation.md part
30); ``decode_attn`` call + req B + ctx sum(context);
``interp`` piecewise-linear through measured points (Vidur tables: exact at profiled points);
``tok_req`` c0 + tok T + req R (``layer_glue``: per-step and per-request work between kernels; with
``sq``, plus sq x the sum of each prefill item's tokens squared; with ``dreq``, plus dreq x the decode requests,
docs/validation.md part 22; with ``pstep``, plus pstep on a step holding a prefill item, part 31, and with ``plog``
plus plog x log2 of its largest prefill item's tokens, part 32);
``tok_exp`` c0 + pair P + exp N (``moe_experts``: P (token, expert) pairs over N distinct experts).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ppsim.cost.analytic import AnalyticCost
from ppsim.cost.base import StageSpec
from ppsim.cost.profile_check import REFIT, fit_problem, live_charged, meta_problem
from ppsim.cost.scaled import draw
from ppsim.errors import PPSimError
from ppsim.hardware.presets import LinkSpec, resolve_link
from ppsim.models.moe import expected_experts_touched_load
from ppsim.models.shape import ModelShape
from ppsim.policy.plan import StepPlan

SCHEMA_VERSION = 1
# Per-layer operators that scale with the step's tokens (``add`` counts twice per layer).
TOKEN_OPS = (
    "input_layernorm",
    "attn_qkv",
    "attn_rope",
    "attn_o_proj",
    "post_attention_layernorm",
    "mlp_gate_up",
    "mlp_act",
    "mlp_down",
    "add",
)
# Operators that scale with the step's requests (the engine norms only the sampled rows).
REQ_OPS = ("final_norm", "lm_head", "sampling", "prepare_inputs")
MLP_OPS = ("mlp_gate_up", "mlp_act", "mlp_down")
MOE_OPS = ("moe_router", "moe_experts", "moe_shared")  # required for a MoE model (moe_shared: with shared experts)
REQUIRED_OPS = (*TOKEN_OPS, "attn_prefill", "attn_decode", "embedding", "final_norm", "lm_head", "sampling")
# ModelShape fields an operator's time depends on; a profile of another value is another model.
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "dtype",
    "attention_bias",
    "attention",
    "qk_norm",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "weight_dtype",
    "kv_cache_dtype",
)
# Storage dtypes a profile written before they were recorded has: its activation dtype.
_DTYPE_DEFAULTS = ("weight_dtype", "kv_cache_dtype")


@dataclass(frozen=True)
class OpFit:
    """One operator's fitted time model; ``x`` names the feature of 1-D forms."""

    name: str
    form: str
    x: str
    coef: dict[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_cache", {})  # x -> at(x): steps repeat a few thousand token counts

    def at(self, x: float) -> float:
        """Seconds at feature value ``x`` (1-D forms); memoised, as the fit is a pure function of ``x``."""
        v = self._cache.get(x)  # type: ignore[attr-defined]
        if v is None:
            v = self._cache[x] = self._at(x)  # type: ignore[attr-defined]
        return v

    def _at(self, x: float) -> float:
        c = self.coef
        if self.form == "linear":
            return c["c0"] + c["c1"] * x
        if self.form == "linear_floor":
            return max(c["floor"], c["c0"] + c["c1"] * x)
        if self.form == "interp":
            return _interp(c["xs"], c["ys"], x)
        raise ValueError(f"{self.name}: form {self.form} is not one-dimensional")

    def prefill(self, chunk: int, prefix: int) -> float:
        """Seconds of prefill attention for one chunk of ``chunk`` tokens over ``prefix`` cached ones."""
        c = self.coef
        t = c["call"] + c["tok"] * chunk + c["cp"] * chunk * prefix + c["cc"] * chunk * chunk
        return t + c["ctx"] * (chunk + prefix) if "ctx" in c else t

    def tok_req(self, tokens: int, reqs: int) -> float:
        """Seconds for a step of ``tokens`` tokens over ``reqs`` requests (``layer_glue``)."""
        c = self.coef
        return c["c0"] + c["tok"] * tokens + c["req"] * reqs

    def tok_exp(self, pairs: float, experts: float) -> float:
        """Seconds of the grouped routed experts: ``pairs`` (token, expert) rows over ``experts`` experts."""
        c = self.coef
        return c["c0"] + c["pair"] * pairs + c["exp"] * experts

    def decode(self, batch: int, ctx_tokens: int) -> float:
        """Seconds of decode attention for ``batch`` requests whose contexts sum to ``ctx_tokens``."""
        c = self.coef
        return c["call"] + c["req"] * batch + c["ctx"] * ctx_tokens


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear through (xs, ys); flat below the first point, extended by the last slope above."""
    if x <= xs[0]:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i >= len(xs):
        i = len(xs) - 1
        if i == 0:
            return ys[0]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def depth_ratio(live: OpFit, over_charged_level: bool = False) -> float:
    """``live_stage`` at two stages over one (the level, common to both, cancels), held at 1 or more: a
    stage does not speed up for sharing the host, a ratio under 1 is the host's drift between the two
    depths' runs. 1 without a one-stage measurement. ``over_charged_level`` (the simulator's model, where
    the level is charged held at 1): over the level as charged, ``max(live_stage(1), 1)``. A one-stage
    level under 1 is the drift of that depth's own runs against their alone timing, which the two-stage
    runs, timed against their own, did not share; so PP=2 charges ``max(live_stage(1), live_stage(2), 1)``
    (docs/validation.md, part 16)."""
    xs = live.coef["xs"]
    level = live.at(1.0) if 1.0 in xs else 0.0
    if over_charged_level and level > 0.0:
        level = max(level, 1.0)
    return max(live.at(2.0) / level, 1.0) if level > 0.0 else 1.0


def depth_charged(fits: dict[str, OpFit], charge_level: bool) -> float:
    """The depth ratio a stage compute pays at PP > 1, held at 1 or more. The simulator's model
    (``charge_level``) charges ``live_depth`` where the profile has it: calibration's live runs at two
    stages over one, each over the stage model (``live_fits.fit_depth``). A ratio over the same steps
    timed alone, charged on the model, counts the model's own error on the two-stage live steps' stages
    a second time (docs/validation.md, part 16). Otherwise, and in calibration's own model of steps
    timed alone, ``live_stage``'s ratio (:func:`depth_ratio`); 1 without either."""
    model = fits.get("live_depth") if charge_level else None
    if model is not None:
        return max(float(model.coef["c0"]), 1.0)
    live = fits.get("live_stage")
    return depth_ratio(live, charge_level) if live is not None else 1.0


def stage_layers_ratio(fit: OpFit | None, num_layers: int) -> float:
    """``stage_layers`` at a stage of ``num_layers`` layers: what a layer costs there over one in the
    profiler's stack (:mod:`calibration.stage_layers`), flat outside the measured sizes (beyond the stack
    the caches hold no layer's weights either way). 1 without the fit."""
    if fit is None:
        return 1.0
    xs, ys = fit.coef["xs"], fit.coef["ys"]
    n = min(max(float(num_layers), xs[0]), xs[-1])
    return _interp(xs, ys, n)


def live_level(live: OpFit) -> float:
    """``live_stage`` at one stage, held at 1 or more: the live engine's stage loop does not run a step
    faster than the same step timed alone, a level under 1 is the host's drift between a run and its alone
    timing. 1 without a one-stage measurement."""
    return max(live.at(1.0), 1.0) if 1.0 in live.coef["xs"] else 1.0


def corun_ratio(corun: OpFit) -> float:
    """``stage_corun`` (a stage's step while another stage computes on the host over the same step alone,
    :mod:`calibration.corun`), held at 1 or more: another stage computing does not make one faster, and a
    paired measurement below 1 is the host's noise."""
    return max(float(corun.coef["c0"]), 1.0)


def fit_from_json(name: str, d: Any, where: str = "profile fits.json") -> OpFit:
    """One operator of fits.json, checked: a form that can time it, the coefficients that form reads,
    finite numbers, no negative time. ``where`` opens the error message."""
    problem = fit_problem(name, d)
    if problem:
        shown = name if name.isprintable() else repr(name)
        raise PPSimError(f"{where}: operator {shown}: {problem}; {REFIT}")
    return OpFit(name, d["form"], str(d.get("x", "")), dict(d["coef"]))


@dataclass(frozen=True)
class Profile:
    meta: dict[str, Any]
    fits: dict[str, OpFit]

    def has(self, op: str) -> bool:
        return op in self.fits


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PPSimError(f"--profile: {path} is missing; point --profile at a ppsim calibrate output dir") from None
    except UnicodeDecodeError as err:
        raise PPSimError(f"--profile: {path} is not UTF-8 text (byte {err.start}); {REFIT}") from None
    except (OSError, json.JSONDecodeError) as err:
        raise PPSimError(f"--profile: cannot read {path}: {err}") from None
    except RecursionError:
        raise PPSimError(f"--profile: cannot read {path}: JSON nested too deeply; {REFIT}") from None
    if not isinstance(data, dict):
        raise PPSimError(f"--profile: {path} is not a JSON object")
    return data


def read_profile(profile_dir: str | Path) -> Profile:
    """Read and check an artifact: schema version, the meta.json fields read, every operator's fit
    (:func:`fit_from_json`) and the operator set (not its model shape)."""
    d = Path(profile_dir)
    if not d.is_dir():
        raise PPSimError(f"--profile: {d} is not a directory; run `ppsim calibrate --output-dir {d}` first")
    meta = _read_json(d / "meta.json")
    ver = meta.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise PPSimError(
            f"--profile: {d} has schema version {ver}, this ppsim reads version {SCHEMA_VERSION}; "
            "re-run ppsim calibrate (or import-vidur) to regenerate it"
        )
    problem = meta_problem(meta)
    if problem:
        raise PPSimError(f"--profile: {d / 'meta.json'}: {problem}; {REFIT}")
    raw = _read_json(d / "fits.json")
    fits = {k: fit_from_json(k, v, f"--profile: {d / 'fits.json'}") for k, v in raw.items()}
    missing = [op for op in REQUIRED_OPS if op not in fits]
    if missing:
        raise PPSimError(f"--profile: {d}/fits.json lacks operators {', '.join(missing)}; re-run ppsim calibrate")
    return Profile(meta, fits)


def check_shape(profile: Profile, shape: ModelShape, where: str) -> None:
    """Raise unless the artifact was measured for ``shape`` (layer count may differ: times are per layer)."""
    got = dict(profile.meta.get("model", {}))
    for f in _DTYPE_DEFAULTS:
        if got.get(f) is None:
            got[f] = got.get("dtype")
    diff = [
        f"{f}={got.get(f)!r} (model has {getattr(shape, f, None)!r})"
        for f in SHAPE_FIELDS
        if got.get(f) != getattr(shape, f, None)
    ]
    if diff:
        raise PPSimError(
            f"--profile: {where} (measured for {got.get('name')!r}) does not match model {shape.name!r}: "
            f"{'; '.join(diff)}; calibrate this model (and dtype, weight and KV cache dtype) or pick its profile"
        )


def largest_prefill_log2(plan: StepPlan) -> float:
    """log2 of ``plan``'s largest prefill item's tokens, 0 without one (``layer_glue``'s ``plog``, part 32)."""
    largest = max((it.num_tokens for it in plan.items if it.is_prefill), default=0)
    return math.log2(largest) if largest else 0.0


class ProfiledCost:
    """CostModel over a :class:`Profile`: stage time = sum of per-operator predictions.

    ``tp_link`` times the TP all-reduces when the profile has no ``all_reduce`` fit.
    """

    # The roofline's ring all-reduce (reads ``self.tp`` and ``self.tp_link``): one formula for both models.
    allreduce_time = AnalyticCost.allreduce_time

    def __init__(
        self,
        profile: Profile,
        shape: ModelShape,
        link: LinkSpec | None,
        tp: int,
        launch_latency_s: float = 0.0,
        tp_link: LinkSpec | None = None,
        moe_skew: float = 1.0,
        pp: int = 1,
        seed: int = 0,
        charge_level: bool = False,
        charge_live: bool = True,
    ) -> None:
        self.p, self.shape, self.link, self.tp, self.tp_link = profile, shape, link, tp, tp_link
        # at PP > 1 the engine core puts a step message on every stage's queue (``launch_multi``)
        self._launch = self.p.fits.get("launch_multi") if pp > 1 else None
        self._launch = self._launch or self.p.fits.get("launch")
        # and the rest of its control path as measured at two stages, where the profile fitted it (docs/validation.md
        # part 40, not calibrate's default): the return and the core's schedule and update spans
        multi = {k: self.p.fits.get(f"{k}_multi") if pp > 1 else None for k in ("return", "schedule", "update")}
        self._path = {k: f or self.p.fits.get(k) for k, f in multi.items()}
        # the engine's own stage-to-stage transfer beyond the link ping-pong (calibration/core_path.py)
        self.handoff_s = max(self.p.fits["handoff"].coef["c0"], 0.0) if "handoff" in self.p.fits else 0.0
        # a stage's loop between two computes where its input waited (calibration/core_path.py), at PP > 1:
        # the pipelines start a stage past the first no sooner than this after its previous compute
        # plus ``turnaround_per_req_s`` per request of the step (a fit by requests; since 2026-12-05)
        turn = self.p.fits.get("turnaround") if pp > 1 else None
        self.turnaround_s = max(turn.coef["c0"], 0.0) if turn is not None else 0.0
        by_reqs = turn is not None and turn.x == "reqs"
        self.turnaround_per_req_s = max(float(turn.coef.get("c1", 0.0)), 0.0) if by_reqs else 0.0
        # charged at no more requests than calibration's restarts had, where the fit says so (n_max; part 25 (c))
        self.turnaround_max_reqs = float(turn.coef.get("n_max", math.inf)) if by_reqs else math.inf
        # the live engine's stage compute over the same steps alone, at this depth (live_fits.fit_live).
        # Its level, held at 1 or more, is charged at every depth where ``charge_level`` (the simulator's
        # model, load_profiled_cost; docs/validation.md part 16): what the live stage loop costs a step
        # beyond the same step alone. Its depth ratio is charged at PP > 1: every stage compute times
        # live_stage here over live_stage at one stage (over the level as charged, where it is: depth_ratio),
        # or the profile's live_depth in the simulator's model (depth_charged), what co-running stages
        # cost each other. ``charge_live`` False (a profile that only records them, meta ``live_charges``;
        # docs/validation.md part 25): level, depth ratio and co-run all 1
        live = self.p.fits.get("live_stage")
        self.live_factor = live.at(float(min(pp, 2))) if live is not None else 1.0
        self.level_factor = live_level(live) if live is not None and charge_level and charge_live else 1.0
        self.depth_factor = depth_charged(self.p.fits, charge_level) if pp > 1 and charge_live else 1.0
        # the live engine's step-to-step spread of stage computes (mean one, live_fits.fit_spread): at PP > 1
        # the pipelines multiply each compute by one ratio drawn by (seed, stage, step id), as in-flight
        # micro-batches pay for a slow step that a mean cannot show; at one stage it would move no mean
        # (part 29: a second table for computes after a longer gap than ``gap_s``, where the profile has one)
        spread = self.p.fits.get("stage_spread") if pp > 1 else None
        self.spread_ratios = [float(y) for y in spread.coef["ys"]] if spread is not None else []
        idle = spread.coef.get("ys_idle") if spread is not None else None
        self.spread_idle = [float(y) for y in idle] if idle else self.spread_ratios
        self.spread_gap_s = float(spread.coef.get("gap_s", math.inf)) if idle else math.inf
        self.seed = seed
        self.spread = self._spread if self.spread_ratios else None
        # stages computing at once on the host's cores slow each other (calibration/corun.py): at PP > 1 the
        # pipelines multiply every compute of a micro-batch that starts while an earlier one is still in the
        # pipeline by this (ppsim/sim/fast.py); 1 without a measurement (a GPU's stages have their own devices)
        corun = self.p.fits.get("stage_corun") if pp > 1 and charge_live else None
        self.corun_factor = corun_ratio(corun) if corun is not None else 1.0
        if tp > 1 and "all_reduce" not in profile.fits and tp_link is None:
            raise PPSimError("profile: no all_reduce operator and no tp_link preset; set cluster.tp_link")
        self.launch_latency_s = launch_latency_s  # when the profile has no measured control path
        self.f = profile.fits
        self._tok = [self.f[op] for op in TOKEN_OPS if op not in MLP_OPS] + [self.f["add"]]  # second residual add
        self._mlp = [self.f[op] for op in MLP_OPS]
        glue = self.f.get("layer_glue")  # seconds per squared token of each prefill item (0: none; part 22)
        tok_req = glue is not None and glue.form == "tok_req"
        self._glue_sq = glue.coef.get("sq", 0.0) if tok_req else 0.0
        self._glue_dreq = glue.coef.get("dreq", 0.0) if tok_req else 0.0  # seconds per decode request (part 22)
        self._glue_pstep = glue.coef.get("pstep", 0.0) if tok_req else 0.0  # seconds per prefill step (part 31)
        self._glue_plog = glue.coef.get("plog", 0.0) if tok_req else 0.0  # x log2 largest prefill item (part 32)
        # a decode-only stage compute of R requests times the live decodes' measured over priced at R, where the
        # profile charges it (``decode_batch``, live_fits.fit_decode_batch; docs/validation.md part 45)
        batch = self.f.get("decode_batch")
        self._decode_batch = (list(batch.coef["xs"]), list(batch.coef["ys"])) if batch is not None else None
        self.moe_skew = moe_skew
        self.expert_load: list[float] = []
        self._touched: dict[int, float] = {}
        self._base: tuple[StepPlan | None, float] = (None, 0.0)  # the last plan's layer_base_time
        self._mlp_memo: dict[tuple[int, bool], float] = {}  # (tokens, moe) -> mlp_time
        self._n_moe: dict[tuple[int, int], int] = {}  # a stage's (start, end) layers -> its MoE layers
        self._base_parts: dict[tuple[int, int], tuple] = {}  # (tokens, requests) -> _base_terms
        self._stage_terms: dict[tuple, tuple] = {}  # (stage layers, first, last, tokens, requests) -> _stage_parts
        if shape.is_moe:
            need = MOE_OPS if shape.shared_expert_intermediate_size else MOE_OPS[:2]
            missing = [op for op in need if op not in self.f]
            if missing:
                raise PPSimError(
                    f"profile: model {shape.name} is MoE but the profile lacks {', '.join(missing)}; "
                    "re-run ppsim calibrate for it"
                )
            k, E = shape.num_experts_per_tok, shape.n_routed_experts
            self.expert_load = list(profile.meta.get("moe", {}).get("expert_load") or [k / E] * E)
            if len(self.expert_load) != E:
                raise PPSimError(
                    f"profile: meta.json moe.expert_load has {len(self.expert_load)} experts, model {shape.name} "
                    f"has {E}; {REFIT}"
                )

    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct routed experts a step of ``num_tokens`` tokens runs, per MoE layer."""
        t = self._touched.get(num_tokens)
        if t is None:
            t = self._touched[num_tokens] = expected_experts_touched_load(self.expert_load, num_tokens, self.moe_skew)
        return t

    def mlp_time(self, T: int, moe: bool) -> float:
        """Seconds of one layer's MLP over ``T`` tokens: dense, or router + routed + shared experts
        (memoised: a pure function of the token count)."""
        t = self._mlp_memo.get((T, moe))
        if t is None:
            t = self._mlp_memo[(T, moe)] = self._mlp_time(T, moe)
        return t

    def _mlp_time(self, T: int, moe: bool) -> float:
        if not moe:
            return sum(op.at(T) for op in self._mlp)
        f = self.f
        t = f["moe_router"].at(T) + f["moe_experts"].tok_exp(
            T * self.shape.num_experts_per_tok, self.experts_touched(T)
        )
        return t + f["moe_shared"].at(T) if "moe_shared" in f else t

    def layer_time(self, plan: StepPlan, moe: bool | None = None) -> float:
        """Seconds for one decoder layer on one GPU of the stage's TP group (``moe`` None: the model's
        heaviest layer kind, MoE for a MoE model)."""
        moe = self.shape.is_moe if moe is None else moe
        return max(self.layer_base_time(plan) + self.mlp_time(plan.num_tokens, moe), 0.0)

    def layer_base_time(self, plan: StepPlan) -> float:
        """One layer without its MLP: norms, attention, adds, glue, TP all-reduces. The last plan's is
        kept, as every stage times the same plan in turn."""
        last, t = self._base
        if last is not plan:
            t = self._layer_base_time(plan)
            self._base = (plan, t)
        return t

    def _layer_base_time(self, plan: StepPlan) -> float:
        T, R = plan.num_tokens, plan.num_reqs
        parts = self._base_parts.get((T, R))
        if parts is None:
            parts = self._base_parts[(T, R)] = self._base_terms(T, R)
        tok, glue, ar = parts
        t = tok
        if plan.num_prefill_tokens:
            pre = self.f["attn_prefill"]
            n_dec = 0
            sq = 0
            for it in plan.items:
                if it.is_prefill:
                    t += pre.prefill(it.num_tokens, it.start)
                    sq += it.num_tokens * it.num_tokens
                else:
                    n_dec += 1
            if self._glue_sq:
                t += self._glue_sq * sq
            if self._glue_pstep or self._glue_plog:
                t += self._glue_pstep + self._glue_plog * largest_prefill_log2(plan)
        else:  # no prefill item (a prefill item has at least one token)
            n_dec = R
        if n_dec:
            t += self.f["attn_decode"].decode(n_dec, plan.decode_ctx_tokens)
            if self._glue_dreq:
                t += self._glue_dreq * n_dec
        if glue is not None:
            t += glue
        if ar is not None:
            t += ar
        return t

    def _base_terms(self, T: int, R: int) -> tuple[float, float | None, float | None]:
        """The terms of a layer's base time that depend only on the token and request counts (memoised:
        each is computed as the unmemoised sum computed it, so the result is the same to the bit)."""
        tok = sum(op.at(T) for op in self._tok)
        glue_fit = self.f.get("layer_glue")
        glue = None
        if glue_fit is not None:
            glue = glue_fit.tok_req(T, R) if glue_fit.form == "tok_req" else glue_fit.at(T)
        ar = None
        if self.tp > 1:
            nbytes = T * self.shape.hidden_size * self.shape.dtype_bytes
            ar_fit = self.f.get("all_reduce")
            ar = 2 * (ar_fit.at(nbytes) if ar_fit is not None else self.allreduce_time(nbytes))
        return tok, glue, ar

    def stage_time(self, stage: StageSpec, plan: StepPlan) -> float:
        return self.stage_times((stage,), plan)[0]

    def stage_times(self, stages: tuple[StageSpec, ...], plan: StepPlan) -> list[float]:
        """:meth:`stage_time` of each of ``stages`` for ``plan``, computed together (the fast pipeline
        times every stage of a plan at its launch)."""
        if plan.is_empty:
            return [0.0] * len(stages)
        T, R = plan.num_tokens, len(plan.items)
        base = self.layer_base_time(plan)
        memo = self._stage_terms
        depth = self.depth_factor * self.level_factor
        if self._decode_batch is not None and not plan.num_prefill_tokens:
            depth *= self.decode_batch_ratio(R)
        out = []
        for stage in stages:
            key = (stage.start_layer, stage.end_layer, stage.is_first, stage.is_last, T, R)
            terms = memo.get(key)
            if terms is None:
                terms = memo[key] = self._stage_parts(stage, T, R)
            num_layers, dense, moe, prep, emb, last, per_layer, live_shift = terms
            t = num_layers * base
            if dense is not None:
                t += dense
            if moe is not None:
                t += moe
            if per_layer != 1.0:
                t *= per_layer
            if t < 0.0:  # max(t, 0.0)
                t = 0.0
            if prep is not None:
                t += prep
            if emb is not None:
                t += emb
            if last is not None:
                t += last
            if live_shift:
                t += live_shift
            out.append(t * depth)
        return out

    def decode_batch_ratio(self, reqs: int) -> float:
        """What a decode-only stage compute of ``reqs`` requests costs over its stage model (``decode_batch``:
        calibration's live decodes timed alone over the model, by requests; interpolated, held beyond the ends;
        1 where the profile does not charge it)."""
        if self._decode_batch is None:
            return 1.0
        xs, ys = self._decode_batch
        return _interp(xs, ys, min(max(float(reqs), xs[0]), xs[-1]))

    def _stage_parts(self, stage: StageSpec, T: int, R: int) -> tuple:
        """The terms of ``stage_time`` that depend only on the stage and the token and request counts, in
        the order they are added: layers, dense MLPs, MoE MLPs, prepare_inputs, embedding, the last stage's
        final norm + lm_head + sampling (None: absent), the layers' ``stage_layers`` ratio, and the stage's share of
        ``last_live`` (docs/validation.md, part 42: ``X`` seconds the live last stage costs over its priced ends,
        measured against its first stage; a layer glue fitted on the whole model spread ``X`` over every layer, so a
        stage holding ``n`` of the model's ``L`` layers is charged ``X`` (if last) ``- X n / L``: 0 at PP = 1, and
        the stages' shares sum to 0 at every depth)."""
        f = self.f
        key = (stage.start_layer, stage.end_layer)
        n_moe = self._n_moe.get(key)
        if n_moe is None:  # the stage's layer range does not change: count its MoE layers once
            n_moe = self._n_moe[key] = self.shape.num_moe_layers(*key)
        nl = stage.num_layers
        dense = (nl - n_moe) * self.mlp_time(T, False) if n_moe < nl else None
        moe = n_moe * self.mlp_time(T, True) if n_moe else None
        prep = f["prepare_inputs"].at(R) if "prepare_inputs" in f else None
        emb = f["embedding"].at(T) if stage.is_first else None
        if emb is not None and "first_glue" in f:
            emb += f["first_glue"].tok_req(T, R)
        last = None
        if stage.is_last:
            last = sum(f[op].at(T if f[op].x == "tokens" else R) for op in ("final_norm", "lm_head", "sampling"))
            if "last_glue" in f:
                last += f["last_glue"].tok_req(T, R)
        shift = 0.0
        if "last_live" in f:
            x = f["last_live"].coef["c0"]
            shift = x * ((1.0 if stage.is_last else 0.0) - nl / self.shape.num_layers)
        return nl, dense, moe, prep, emb, last, stage_layers_ratio(f.get("stage_layers"), nl), shift

    def _spread(self, stage: int, step_id: int, gap_s: float = 0.0) -> float:
        """The spread ratio the pipelines multiply stage ``stage``'s compute of step ``step_id`` by, ``gap_s`` after
        the stage's previous compute ended: from the table of steps after longer gaps than the profile's ``gap_s``
        where it has one (part 29)."""
        ratios = self.spread_ratios if gap_s <= self.spread_gap_s else self.spread_idle
        return draw(ratios, self.seed, stage, step_id)

    @property
    def has_idle(self) -> bool:
        """Whether the profile measured ``stage_idle`` (the pipelines then charge :meth:`idle_time`)."""
        return "stage_idle" in self.f

    def idle_time(self, stage: StageSpec, gap_s: float) -> float:
        """Extra seconds of a ``stage`` step that starts ``gap_s`` after the stage's previous one ended:
        caches lost while it waited (``calibration/stage_step.py``), held beyond the longest measured
        gap; per step (``coef["per"] == "step"``, paired samples) or, in older profiles, per layer."""
        f = self.f.get("stage_idle")
        if f is None or gap_s <= 0.0:
            return 0.0
        c = f.coef
        xs = c["xs"]  # not memoised (OpFit.at): gaps are continuous, the memo would only grow
        extra = _interp(xs, c["ys"], gap_s if gap_s < xs[-1] else xs[-1])
        return extra if c.get("per") == "step" else stage.num_layers * extra

    def link_time(self, nbytes: float) -> float:
        """A stage-to-stage transfer of ``nbytes``: the wire, plus the live engine's handoff (the sender's
        isends, the waiting receiver woken) where the profile measured it."""
        return self.wire_time(nbytes) + self.handoff_s

    def wire_time(self, nbytes: float) -> float:
        """``nbytes`` over the link alone: the ping-pong's ``send_recv``, else the link preset."""
        if "send_recv" in self.f:
            return max(self.f["send_recv"].at(nbytes), 0.0)
        if self.link is None:
            raise PPSimError("profile: no send_recv operator and no link preset; pass --link")
        return self.link.latency_us * 1e-6 + nbytes / (self.link.bandwidth_gbps * 1e9)

    def ring_launch_time(self, n: int) -> float | None:
        """A step's launch with the sampled-token ring at PP > 1 (rank 0 also posts the ring's receive),
        measured on the live engine; None where the profile has no ring run."""
        f = self.f.get("ring_launch")
        return None if f is None else max(f.at(n), 0.0)

    def ring_return_time(self, n: int) -> float | None:
        """``n`` requests' sampled tokens from the last rank over the ring to rank 0 and on to the engine
        core, measured on the live engine; None where the profile has no ring run."""
        f = self.f.get("ring_return")
        return None if f is None else max(f.at(n), 0.0)

    def cpu_time(self, kind: str, n: int) -> float:
        if kind not in ("schedule", "update"):
            raise ValueError(f"unknown cpu kind {kind!r}")
        return max((self._path[kind] or self.f[kind]).at(n), 0.0)

    def launch_time(self, n: int) -> float:
        """The engine's control message for a step of ``n`` requests reaching the first stage."""
        if self._launch is not None:
            return max(self._launch.at(n), 0.0)
        return self.launch_latency_s

    def return_time(self, n: int) -> float:
        """Sampled token ids of ``n`` requests reaching the engine core: the measured control path,
        else int64 ids over the stage link."""
        f = self._path["return"]
        if f is not None:
            return max(f.at(n), 0.0)
        return self.link_time(8 * max(n, 1))


def load_profiled_cost(profile_dir: str, shape: ModelShape, scenario: Any, link: LinkSpec) -> ProfiledCost:
    """The profiled model for ``scenario``; raises PPSimError on schema, shape, TP or operator mismatch.

    CPU operators missing from the artifact (``schedule``, ``update``) come from the scenario's
    ``engine.cpu`` overheads, so a GPU import without CPU data still runs; a missing ``all_reduce``
    is the ring all-reduce over ``scenario.cluster.tp_link``.
    """
    prof = read_profile(profile_dir)
    check_shape(prof, shape, profile_dir)
    tp = scenario.cluster.tensor_parallel_size
    if int(prof.meta.get("tp", 1)) != tp:
        raise PPSimError(
            f"--profile: {profile_dir} was measured at tensor parallel size {prof.meta.get('tp', 1)}, "
            f"the scenario uses {tp}; import or calibrate a profile for -tp {tp}"
        )
    fits = dict(prof.fits)
    cpu = scenario.engine.cpu
    for kind, fixed, per in (
        ("schedule", cpu.schedule_us, cpu.schedule_per_req_us),
        ("update", cpu.update_us, cpu.update_per_req_us),
    ):
        fits.setdefault(kind, OpFit(kind, "linear", "n", {"c0": fixed * 1e-6, "c1": per * 1e-6}))
    tp_link = resolve_link(scenario.cluster.tp_link, "cluster.tp_link")
    check_router(prof, shape, getattr(scenario, "moe_router_zipf", 0.0), profile_dir)
    check_hardware(prof, scenario.hardware, profile_dir)
    return ProfiledCost(
        Profile(prof.meta, fits),
        shape,
        link,
        tp,
        cpu.launch_latency_us * 1e-6,
        tp_link,
        moe_skew=scenario.cost.moe_routing_skew,
        pp=scenario.cluster.pipeline_parallel_size,
        seed=scenario.seed,
        charge_level=True,
        charge_live=live_charged(prof.meta),
    )


def check_router(profile: Profile, shape: ModelShape, zipf: float, where: str) -> None:
    """A MoE profile's expert load was measured under one router skew; the scenario must use the same."""
    got = float(profile.meta.get("moe", {}).get("router_zipf", 0.0))
    if shape.is_moe and abs(got - zipf) > 1e-9:
        raise PPSimError(
            f"--moe-router-zipf: {zipf:g}, but {where} measured the router's expert load at {got:g}; "
            f"pass --moe-router-zipf {got:g} or calibrate with --moe-router-zipf {zipf:g}"
        )


def check_hardware(profile: Profile, hardware: Any, where: str) -> None:
    """A profile that records the hardware preset it was measured on (``ppsim import-vidur``: GPU times)
    times only a scenario on that preset. Profiles without one (``ppsim calibrate``'s, of this host's CPU or
    GPU, which no preset names) and scenarios on custom hardware (a table, not a preset name) are not compared.
    """
    got = profile.meta.get("hardware")
    if got and isinstance(hardware, str) and hardware != got:
        raise PPSimError(
            f"--profile: {where} holds times measured on {got} ({profile.meta.get('device')}), the scenario "
            f"runs on {hardware}; pass --hardware {got}, or import a profile of {hardware} (import-vidur --device)"
        )
