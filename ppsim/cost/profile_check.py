"""Checks of a profile's files as :func:`ppsim.cost.profiled.read_profile` reads them: every operator's
form can time it, its coefficients are the ones that form reads, finite numbers, no negative time, none
above :data:`MAX_COEF` (nor an ``interp`` table's slope past its last point); the meta.json fields the
cost model reads have their types. A corrupt or hand-edited profile is refused in one line instead of
failing mid-simulation (with 1e300 s, the clock overflowed; with a negative time, it ran 10x fast)."""

from __future__ import annotations

import math
from typing import Any

FORMS = ("linear", "linear_floor", "prefill_attn", "decode_attn", "interp", "tok_req", "tok_exp")
ONE_D_FORMS = ("linear", "linear_floor", "interp")  # OpFit.at
# The coefficients each form reads (OpFit's methods); ``interp``'s are the lists xs and ys.
COEF_KEYS = {
    "linear": ("c0", "c1"),
    "linear_floor": ("floor", "c0", "c1"),
    "interp": ("xs", "ys"),
    "prefill_attn": ("call", "tok", "cp", "cc"),
    "decode_attn": ("call", "req", "ctx"),
    "tok_req": ("c0", "tok", "req"),
    "tok_exp": ("c0", "pair", "exp"),
}
# Coefficients a form reads where present: ``layer_glue``'s cost per squared prefill-item token and per decode
# request (docs/validation.md, part 22), per step holding a prefill item and per log2 of its largest (parts 31, 32);
# ``prefill_attn``'s per context token (part 30); the turnaround line's most
# requests charged (``n_max``, part 25 (c)).
OPTIONAL_KEYS = {"tok_req": ("sq", "dreq", "pstep", "plog"), "linear": ("n_max",), "prefill_attn": ("ctx",)}
# Operators the cost model times through a form of their own; every other one is one-dimensional.
OP_FORMS = {
    "attn_prefill": ("prefill_attn",),
    "attn_decode": ("decode_attn",),
    "moe_experts": ("tok_exp",),
    "first_glue": ("tok_req",),
    "last_glue": ("tok_req",),
    "layer_glue": ("tok_req", *ONE_D_FORMS),
    "stage_idle": ("interp",),
    "stage_spread": ("interp",),
    "live_depth": ("linear",),
    "stage_layers": ("interp",),
}
# Fits of a difference, whose terms may be negative: the glue (least squares of stage steps minus the
# operators), ``handoff`` (live transfer minus ``send_recv``; charged as max(c0, 0)) and ``stage_idle``
# (step after a gap minus back to back). Every other fit is a non-negative least squares of measured
# times (calibration/fit.py), a table of them or a ratio of them: a negative coefficient is a corrupt file.
SIGNED_OPS = ("layer_glue", "first_glue", "last_glue", "handoff", "stage_idle")
REFIT = "re-run ppsim calibrate (or ppsim import-vidur)"
# meta.json ``live_charges``: whether the simulator charges the live fits (level, depth ratio, co-run) or a
# calibration only recorded them (docs/validation.md part 25); a profile without the key charges them, as it did
LIVE_CHARGED, LIVE_RECORDED = "charged", "recorded"
LIVE_CHARGES_KINDS = (LIVE_CHARGED, LIVE_RECORDED)


def live_charged(meta: dict[str, Any]) -> bool:
    """Whether the simulator charges a profile's live fits (meta ``live_charges``; a profile without it: yes)."""
    return meta.get("live_charges", LIVE_CHARGED) == LIVE_CHARGED


# The largest coefficient in magnitude: seconds (a call, a floor, a table's time), seconds per unit (token,
# request, byte, context token) or a ratio. Measured ones are below 0.2 s (Vidur's slowest kernel, 0.14 s);
# 1e3 keeps every step time of a bounded scenario finite (a few 1e21 s at most: 1e4 layers, 16 Mi tokens).
MAX_COEF = 1e3


def fit_problem(name: str, d: Any) -> str | None:
    """What is wrong with operator ``name``'s entry ``d`` of fits.json, or None."""
    if not isinstance(d, dict):
        return f"is {_json_kind(d)}, not an object with form and coef"
    form, coef = d.get("form"), d.get("coef")
    allowed = OP_FORMS.get(name, ONE_D_FORMS)
    if form not in FORMS:
        return f"unknown form {form!r} (one of {', '.join(allowed)})"
    if form not in allowed:
        return f"form {form!r} cannot time it (it needs {' or '.join(allowed)})"
    if not isinstance(coef, dict):
        return "has no coef" if coef is None else f"coef is {_json_kind(coef)}, not an object"
    missing = [k for k in COEF_KEYS[form] if k not in coef]
    if missing:
        return f"form {form} needs coef {', '.join(missing)}, missing"
    signed = name in SIGNED_OPS
    if form == "interp":
        return _table_problem(coef["xs"], coef["ys"], signed) or _second_table_problem(coef, signed)
    for k in (*COEF_KEYS[form], *(k for k in OPTIONAL_KEYS.get(form, ()) if k in coef)):
        bad = _number_problem(coef[k], signed) or _size_problem(coef[k])
        if bad:
            return f"coef {k} = {coef[k]!r} {bad}"
    return None


def _table_problem(xs: Any, ys: Any, signed: bool, name: str = "ys") -> str | None:
    """What is wrong with an ``interp`` table, or None: non-empty lists of equal length, numbers, xs
    strictly ascending (``_interp`` bisects them), ys times; ``name`` the ys' key in the coef."""
    if not isinstance(xs, list) or not isinstance(ys, list) or not xs or len(xs) != len(ys):
        got = f"{_json_kind(xs)} and {_json_kind(ys)}"
        return f"interp needs coef xs and {name} as non-empty lists of equal length, got {got}"
    for key, vals, sign_ok in (("xs", xs, True), (name, ys, signed)):
        for i, v in enumerate(vals):
            bad = _number_problem(v, sign_ok) or (_size_problem(v) if key == name else None)
            if bad:
                return f"coef {key}[{i}] = {v!r} {bad}"
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        return "coef xs is not strictly ascending"
    if len(xs) > 1:  # ``_interp`` extends the table past its last point by the last slope
        slope = (float(ys[-1]) - float(ys[-2])) / (float(xs[-1]) - float(xs[-2]))
        if abs(slope) > MAX_COEF:
            table = "table" if name == "ys" else f"{name} table"
            return f"the {table}'s last slope, {slope:g} per unit of x past xs[-1], {_size_problem(slope)}"
    return None


def _second_table_problem(coef: dict[str, Any], signed: bool) -> str | None:
    """What is wrong with a ``stage_spread`` table's second half (``ys_idle`` and its split ``gap_s``, part 29), or
    None (also where there is none)."""
    if "ys_idle" not in coef and "gap_s" not in coef:
        return None
    if "ys_idle" not in coef or "gap_s" not in coef:
        return "coef ys_idle and gap_s come together (the table after longer gaps and its split), one is missing"
    bad = _table_problem(coef["xs"], coef["ys_idle"], signed, "ys_idle")
    if bad:
        return bad
    gap = _number_problem(coef["gap_s"], False)
    return f"coef gap_s = {coef['gap_s']!r} {gap}" if gap else None


def _size_problem(v: float) -> str | None:
    """Why ``v`` (a finite number) is too large for a coefficient (:data:`MAX_COEF`), or None."""
    if abs(float(v)) > MAX_COEF:
        return f"is beyond {MAX_COEF:g} in magnitude (seconds, or seconds per unit: no operator takes that long)"
    return None


def _number_problem(v: Any, signed: bool) -> str | None:
    """Why ``v`` is not a usable coefficient (a finite number; not negative unless ``signed``), or None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return "is not a number"
    try:
        f = float(v)
    except OverflowError:
        return "is too large"
    if not math.isfinite(f):
        return "is not finite"
    if f < 0 and not signed:
        return "is negative"
    return None


def _json_kind(v: Any) -> str:
    """``v``'s JSON type, for messages: "a string", "a list of 3", "null"."""
    if v is None:
        return "null"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    kinds = {bool: "a boolean", str: "a string", int: "a number", float: "a number", dict: "an object"}
    return kinds.get(type(v), type(v).__name__)


def meta_problem(meta: dict[str, Any]) -> str | None:
    """What is wrong with the meta.json fields the cost model reads, or None."""
    tp = meta.get("tp", 1)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return f"tp = {tp!r} is not a tensor parallel size (an integer >= 1)"
    for key in ("model", "moe"):
        if key in meta and not isinstance(meta[key], dict):
            return f"{key} is {_json_kind(meta[key])}, not an object"
    if meta.get("live_charges", LIVE_CHARGED) not in LIVE_CHARGES_KINDS:
        return f"live_charges = {meta['live_charges']!r} is not one of {', '.join(LIVE_CHARGES_KINDS)}"
    if not isinstance(meta.get("hardware", ""), str):
        return f"hardware is {_json_kind(meta['hardware'])}, not the name of a hardware preset"
    moe = meta.get("moe", {})
    zipf = moe.get("router_zipf", 0.0)
    bad = _number_problem(zipf, False)
    if bad:
        return f"moe.router_zipf = {zipf!r} {bad}"
    load = moe.get("expert_load")
    if load is not None and not isinstance(load, list):
        return f"moe.expert_load is {_json_kind(load)}, not a list of per-expert probabilities"
    for i, p in enumerate(load or []):
        bad = _number_problem(p, False)
        if bad:
            return f"moe.expert_load[{i}] = {p!r} {bad}"
    return None
