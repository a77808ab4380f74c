"""Import Vidur's published GPU operator profiles (CSV) into a ppsim profile artifact.

Vidur (microsoft/vidur ``data/profiling``) times each operator of one layer with CUDA kernels at
many token counts. Columns used (times are milliseconds; ppsim stores seconds):

- ``compute/<dev>/<model>/mlp.csv``: ``time_stats.<op>.median`` for ``emb``, ``input_layernorm``,
  ``attn_pre_proj`` (-> ``attn_qkv``), ``attn_rope``, ``attn_post_proj`` (-> ``attn_o_proj``),
  ``post_attention_layernorm``, ``mlp_up_proj`` (-> ``mlp_gate_up``), ``mlp_act``, ``mlp_down_proj``
  (-> ``mlp_down``), ``add``, keyed by ``num_tokens`` at ``num_tensor_parallel_workers`` == tp.
  Imported as ``interp`` tables: the profile predicts exactly the CSV median at each profiled
  token count (the mean of medians where a count repeats) and interpolates between them.
  ``n_head``, ``n_kv_head``, ``n_embd``, ``n_expanded_embd`` are checked against the ppsim preset
  (not ``vocab_size``: Vidur pads it, e.g. 32000 -> 32768; it only enters ``emb``).
- ``compute/<dev>/<model>/attention.csv`` (only A100 Llama-2-70B TP2 is shipped):
  ``attn_prefill`` + ``attn_input_reshape`` + ``attn_output_reshape`` medians over
  (``prefill_chunk_size``, ``kv_cache_size``) rows with ``is_prefill``; ``attn_decode`` + reshapes over
  (``batch_size``, ``kv_cache_size`` per request). Fitted (prefill_attn / decode_attn forms) with
  cross-validated error, since plans have ragged per-request shapes.
- ``network/<dev>_<network>/send_recv.csv`` (``size`` bytes, 2 workers) -> ``send_recv``;
  ``all_reduce.csv`` at ``num_workers`` == tp -> ``all_reduce`` (two per layer when tp > 1); where
  a file also has rows across nodes (``dgx``), only those with ``devices_per_node`` == tp.
- ``cpu_overheads/<dev>.csv`` (A100 / A40 only; H100 uses A100's): ``schedule_median`` ->
  ``schedule``, ``process_model_outputs_median`` -> ``update``, ``prepare_inputs_e2e_median`` ->
  ``prepare_inputs``, ``sampler_e2e_median`` -> ``sampling``, over ``batch_size``. Only CodeLlama-34B
  at TP 2 is measured; these engine overheads are taken as model-independent.

Missing, and modelled instead (each listed in ``meta.json["missing"]``): ``final_norm`` (the
``input_layernorm`` table: the same RMSNorm over all tokens); ``lm_head`` (roofline of the device
preset through ppsim's analytic kernel curves, ``ppsim/cost/kernels.py``); attention for every
model but Llama-2-70B on A100 (the analytic model's attention, whose constants are fitted to that
one measured file: 4 q_dim FLOPs per causal query-key pair; decode reads
2 kv_dim bytes per context token); CPU overheads on H100 (A100's); ``all_reduce`` at a TP size the network
data lacks (e.g. 8: only 2 and 4 workers are shipped; the simulator then times the ring all-reduce
over the scenario's ``cluster.tp_link``, as the roofline does). ``--network`` must name a
``network/<dev>_<network>`` folder (``pairwise_nvlink``, ``dgx``).

Refused, naming the file (and line and column): an empty or header-only file, a column named twice, a
time of 0 or above :data:`MAX_TIME_S`, a table of fewer than two sizes, attention rows too few or too
alike to fit. ``--device`` must be a ``compute/`` folder with a ppsim preset (:data:`DEVICE_PRESET`),
which ``meta.json`` records as ``hardware``: the cost model refuses the profile on other hardware.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from calibration.artifact import base_meta, check_output_dir, write_artifact
from calibration.fit import fit_op, fit_to_json, prefill_features
from ppsim.cost.kernels import FIT, device_fit
from ppsim.errors import PPSimError
from ppsim.hardware.presets import resolve_device
from ppsim.models.shape import ModelShape, load_model

PRESET_TO_VIDUR = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "internlm-20b": "internlm/internlm-20b",
    "qwen-72b": "Qwen/Qwen-72B",
}
MLP_OPS = {
    "emb": "embedding",
    "input_layernorm": "input_layernorm",
    "attn_pre_proj": "attn_qkv",
    "attn_rope": "attn_rope",
    "attn_post_proj": "attn_o_proj",
    "post_attention_layernorm": "post_attention_layernorm",
    "mlp_up_proj": "mlp_gate_up",
    "mlp_act": "mlp_act",
    "mlp_down_proj": "mlp_down",
    "add": "add",
}
DEVICE_PRESET = {"a100": "a100-80gb", "h100": "h100-sxm", "a40": "a40"}
# One kernel, transfer or CPU overhead: Vidur's slowest median is 0.14 s (Llama-3-70B's MLP at 16k tokens on
# A100); a minute is a typo or a corrupt cell, and 1e300 ms overflowed the simulator's clock.
MAX_TIME_S = 60.0
# Coefficients of the fitted attention forms (fit.py): a fit needs one point more than it has coefficients,
# for a leave-one-out error
FIT_COEFS = {"prefill_attn": 4, "decode_attn": 3}
FIT_COLUMNS = {"prefill_attn": "prefill_chunk_size, kv_cache_size", "decode_attn": "batch_size, kv_cache_size"}

FIX = "fix the file or copy it again from a Vidur checkout's data/profiling"


class Row(dict[str, str]):
    """One CSV row by column name, with the file and line it came from (for error messages)."""

    def __init__(self, cells: dict[str, str], path: Path, line: int) -> None:
        super().__init__(cells)
        self.path, self.line = path, line


def checked_rows(path: Path) -> list[Row]:
    """``path``'s rows; refuses a file that is not UTF-8 CSV, or a row wider or narrower than the header."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
        reader = csv.DictReader(io.StringIO(text, newline=""))
        rows = [Row(r, path, reader.line_num) for r in reader]
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise PPSimError(f"--root: {path} line {line} is not UTF-8 text; {FIX}") from None
    except (OSError, csv.Error) as err:
        raise PPSimError(f"--root: cannot read {path}: {err}; {FIX}") from None
    _check_header(path, reader.fieldnames, rows)
    for r in rows:
        if None in r or None in r.values():  # DictReader's restkey / restval
            width = "more" if None in r else "fewer"
            raise PPSimError(f"--root: {path} line {r.line} has {width} cells than the header (truncated?); {FIX}")
    return rows


def _check_header(path: Path, header: list[str] | None, rows: list[Row]) -> None:
    """Refuse a file without rows, or with a column named twice (``DictReader`` keeps the last silently)."""
    if not rows:
        what = "is empty" if not header else "has a header but no rows"
        raise PPSimError(f"--root: {path} {what}; {FIX}")
    cols = header or []
    twice = sorted({c for c in cols if cols.count(c) > 1})
    if twice:
        raise PPSimError(f"--root: {path} line 1 names column {twice[0]} twice; {FIX}")


def num_cell(r: Row, col: str) -> float:
    """Cell ``col`` of ``r``: a finite, non-negative number (every column read is a time, count or size)."""
    if col not in r:
        raise PPSimError(f"--root: {r.path} has no column {col}; {FIX}")
    v = r[col]
    try:
        x = float(v)
    except ValueError:
        raise PPSimError(f"--root: {r.path} line {r.line} column {col}: {v!r} is not a number; {FIX}") from None
    if not math.isfinite(x) or x < 0:
        why = "negative" if x < 0 else "not finite"
        raise PPSimError(f"--root: {r.path} line {r.line} column {col}: {v!r} is {why}; {FIX}")
    return x


def int_cell(r: Row, col: str) -> int:
    x = num_cell(r, col)
    if not x.is_integer():
        raise PPSimError(f"--root: {r.path} line {r.line} column {col}: {r[col]!r} is not a whole number; {FIX}")
    return int(x)


def _ms(r: Row, col: str, positive: bool = False) -> float:
    """Cell ``col`` (milliseconds) in seconds; an empty cell is 0. A time above :data:`MAX_TIME_S`, or
    zero where ``positive`` (a measured operator: no kernel takes no time), is refused."""
    if r.get(col, "") == "":
        return 0.0
    s = num_cell(r, col) * 1e-3
    if s > MAX_TIME_S or (positive and s == 0):
        why = f"above {MAX_TIME_S:g} s" if s else "zero: no measured operator takes no time"
        raise PPSimError(f"--root: {r.path} line {r.line} column {col}: {r[col]!r} ms is {why}; {FIX}")
    return s


def table(rows: list[Row], key: str, col: str) -> dict[str, Any]:
    """``interp`` coefficients: the median seconds of ``col`` at each ``key`` (mean over repeats of a key),
    at two values of ``key`` or more (one would time every size alike)."""
    by: dict[float, list[float]] = {}
    for r in rows:
        if r.get(col, "") != "":
            by.setdefault(num_cell(r, key), []).append(_ms(r, col, positive=True))
    xs = sorted(by)
    if len(xs) < 2:
        where = rows[0].path if rows else "vidur import"
        got = f"only at {key} = {xs[0]:g}" if xs else "no values"
        raise PPSimError(f"--root: {where}: {col} has {got}; a table needs two {key} values or more; {FIX}")
    return {"xs": xs, "ys": [float(np.mean(by[x])) for x in xs]}


def _interp(coef: dict[str, Any], x: str, source: str) -> dict[str, Any]:
    return {"form": "interp", "x": x, "coef": coef, "source": source, "n_samples": len(coef["xs"])}


def check_vidur_shape(row: Row, shape: ModelShape, path: Path) -> None:
    want = {
        "n_head": shape.num_heads,
        "n_kv_head": shape.num_kv_heads,
        "n_embd": shape.hidden_size,
        "n_expanded_embd": shape.intermediate_size,
    }  # vocab_size: Vidur pads it (32000 -> 32768)
    bad = [f"{k}={row[k]} (model has {v})" for k, v in want.items() if k in row and int_cell(row, k) != v]
    if bad:
        raise PPSimError(f"vidur import: {path} is not model {shape.name}: {'; '.join(bad)}; pick the matching --model")


def roofline_fits(shape: ModelShape, device: str, tp: int) -> dict[str, dict[str, Any]]:
    """lm_head, attention and sampling from ppsim's analytic model where Vidur has no measurement.

    The same kernel curves as the analytic model (:mod:`ppsim.cost.kernels`, fitted to Vidur's A100
    data), in the profile's forms: so where the import lacks a measurement, it and the analytic model
    agree, and a comparison of the two measures only what Vidur measured.
    """
    dev = resolve_device(DEVICE_PRESET.get(device, device))
    k, d = FIT, device_fit(dev.name)
    F, PB = dev.peak_tflops * 1e12, dev.hbm_bandwidth_gbps * 1e9
    b, v_gpu = shape.dtype_bytes, shape.vocab_size / tp
    q_gpu = shape.q_dim / tp
    kv_gpu = max(1, -(-shape.num_kv_heads // tp)) * shape.head_dim
    reshape = 2 * b * (2 * q_gpu + 2 * kv_gpu) / (PB * k.reshape_eff)
    src = f"analytic model ({dev.name}, ppsim/cost/kernels.py)"
    w_read = shape.hidden_size * v_gpu * b / (PB * d.memory_eff)
    return {
        "lm_head": {
            "form": "linear_floor",
            "x": "reqs",
            "source": src,
            "coef": {
                "floor": 0.0,
                "c0": w_read + k.gemm_launch_us * 1e-6,
                "c1": 2 * shape.hidden_size * v_gpu / (F * d.compute_eff),
            },
        },
        # per item: causal pairs c p + c^2 / 2 at 4 q_dim FLOPs each (QK^T and PV), KV reshapes per token
        "attn_prefill": {
            "form": "prefill_attn",
            "x": "",
            "source": src,
            "coef": {
                "call": k.attn_call_us * 1e-6,
                "tok": reshape,
                "cp": 4 * q_gpu / (F * k.attn_compute_eff),
                "cc": 2 * q_gpu / (F * k.attn_compute_eff),
            },
        },
        "attn_decode": {
            "form": "decode_attn",
            "x": "",
            "source": src,
            "coef": {"call": k.attn_call_us * 1e-6, "req": reshape, "ctx": 2 * kv_gpu * b / (PB * k.attn_memory_eff)},
        },
        "sampling": {
            "form": "linear",
            "x": "reqs",
            "source": src,
            "coef": {"c0": d.sampler_us * 1e-6, "c1": d.sampler_per_req_us * 1e-6},
        },
    }


def attention_fits(path: Path, tp: int) -> dict[str, dict[str, Any]]:
    rows = [r for r in checked_rows(path) if int_cell(r, "num_tensor_parallel_workers") == tp]
    if not rows:
        return {}
    extra = ("time_stats.attn_input_reshape.median", "time_stats.attn_output_reshape.median")
    out = {}
    for op, is_pre, col in (
        ("attn_prefill", "True", "time_stats.attn_prefill.median"),
        ("attn_decode", "False", "time_stats.attn_decode.median"),
    ):
        sel = [r for r in rows if r.get("is_prefill") == is_pre and r.get(col, "") != ""]
        y = np.array([_ms(r, col, positive=True) + sum(_ms(r, e) for e in extra) for r in sel])
        if is_pre == "True":
            feats = {
                "chunk": np.array([num_cell(r, "prefill_chunk_size") for r in sel]),
                "prefix": np.array([num_cell(r, "kv_cache_size") for r in sel]),
            }
            form = "prefill_attn"
        else:
            B = np.array([num_cell(r, "batch_size") for r in sel])
            feats = {"batch": B, "ctx_tokens": B * np.array([num_cell(r, "kv_cache_size") for r in sel])}
            form = "decode_attn"
        _check_fit_points(path, op, form, feats, tp)
        fit, stats = fit_op(op, form, "", feats, y)
        out[op] = {**fit_to_json(fit, stats), "source": f"{path.name} ({col}+reshapes, fitted)"}
    return out


def _check_fit_points(path: Path, op: str, form: str, feats: dict[str, np.ndarray], tp: int) -> None:
    """Refuse rows too few, or too alike, to fit ``form``: one point more than its coefficients, which
    vary the features independently (decodes all at one context would leave the context's cost unknown)."""
    n = FIT_COEFS[form]
    x = np.column_stack(list(feats.values()))
    points = len(np.unique(x, axis=0))
    if points <= n or _rank(form, feats) < n:
        cols = FIT_COLUMNS[form]
        got = f"{points} distinct ({cols}) points" + ("" if points <= n else ", which do not vary them independently")
        raise PPSimError(
            f"--root: {path}: {op} at tensor parallel size {tp} has {got}; its {form} fit has {n} coefficients "
            f"and needs {n + 1} points or more that vary both, for a cross-validated error; {FIX}"
        )


def _rank(form: str, feats: dict[str, np.ndarray]) -> int:
    """The rank of ``form``'s least-squares design over ``feats``, its columns scaled to one magnitude."""
    if form == "prefill_attn":
        design = prefill_features(feats["chunk"], feats["prefix"])
    else:
        design = np.column_stack([np.ones_like(feats["batch"]), feats["batch"], feats["ctx_tokens"]])
    return int(np.linalg.matrix_rank(design / np.maximum(np.abs(design).max(axis=0), 1e-300)))


def cpu_fits(root: Path, device: str) -> tuple[dict[str, dict[str, Any]], str | None]:
    path = root / "cpu_overheads" / f"{device}.csv"
    note = None
    if not path.is_file():
        path, note = root / "cpu_overheads" / "a100.csv", f"cpu overheads on {device}: A100's used"
    if not path.is_file():
        return {}, f"cpu overheads: none under {root}/cpu_overheads; the scenario's engine.cpu is used"
    rows = checked_rows(path)
    cols = {
        "schedule": "schedule_median",
        "update": "process_model_outputs_median",
        "prepare_inputs": "prepare_inputs_e2e_median",
        "sampling": "sampler_e2e_median",
    }
    src = f"{path.relative_to(root)} ({rows[0].get('model_name')} TP{rows[0].get('tensor_parallel_degree')})"
    return {
        op: _interp(table(rows, "batch_size", c), "n" if op in ("schedule", "update") else "reqs", f"{src} {c}")
        for op, c in cols.items()
    }, note


def check_device(root: Path, device: str) -> None:
    """Refuse a ``--device`` with no ``compute/<device>`` folder under ``root``, or one no ppsim hardware
    preset describes (the import models lm_head, sampling and attention on the preset)."""
    have = sorted(p.name for p in (root / "compute").iterdir() if p.is_dir())
    if device not in have:
        raise PPSimError(
            f"--device: no folder {device!r} under {root}/compute; devices there: {', '.join(have) or 'none'}"
        )
    if device not in DEVICE_PRESET:
        pairs = ", ".join(f"{k} -> {v}" for k, v in DEVICE_PRESET.items())
        raise PPSimError(
            f"--device: {device} has no ppsim hardware preset, on which the import models what Vidur did not "
            f"measure (lm_head, attention, sampling); import a device folder that maps to one ({pairs})"
            + ("" if set(have) & set(DEVICE_PRESET) else f"; {root}/compute has none")
        )


def mlp_rows(path: Path, tp: int) -> list[Row]:
    """The rows of ``path`` (an mlp.csv) at tensor parallel size ``tp``; refused when it has none, naming
    the sizes it has."""
    rows = checked_rows(path)
    sizes = sorted({int_cell(r, "num_tensor_parallel_workers") for r in rows})
    if tp not in sizes:
        raise PPSimError(
            f"-tp: {path} has no rows at tensor parallel size {tp}; it has {', '.join(map(str, sizes))}: "
            "pass -tp one of them"
        )
    return [r for r in rows if int_cell(r, "num_tensor_parallel_workers") == tp]


def check_network(root: Path, network: str) -> None:
    """Refuse a ``--network`` name no ``network/<device>_<network>`` folder under ``root`` has."""
    known = sorted({p.name.split("_", 1)[1] for p in (root / "network").glob("*_*") if p.is_dir()})
    if network not in known and (known or network != "pairwise_nvlink"):
        raise PPSimError(
            f"--network: unknown network {network!r} under {root}/network; available: {', '.join(known) or 'none'}"
        )


def network_fits(root: Path, device: str, network: str, tp: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    d = root / "network" / f"{device}_{network}"
    out, missing = {}, []
    if (d / "send_recv.csv").is_file():
        out["send_recv"] = _interp(
            table(checked_rows(d / "send_recv.csv"), "size", "time_stats.send_recv.median"),
            "bytes",
            f"{d.name}/send_recv.csv",
        )
    else:
        missing.append(f"send_recv: no {d}/send_recv.csv; the scenario's --link preset is used")
    if tp > 1:
        path = d / "all_reduce.csv"
        ar = [r for r in checked_rows(path) if int_cell(r, "num_workers") == tp] if path.is_file() else []
        # dgx files mix GPUs in one node with GPUs across nodes at the same worker count: keep one node's
        intra = [r for r in ar if r.get("devices_per_node") == r["num_workers"]]
        ar = intra or ar
        if ar:
            out["all_reduce"] = _interp(
                table(ar, "size", "time_stats.all_reduce.median"), "bytes", f"{d.name}/all_reduce.csv"
            )
        else:
            missing.append(
                f"all_reduce at {tp} workers: not in {d}; the ring all-reduce over the scenario's "
                "cluster.tp_link is used"
            )
    return out, missing


def import_vidur(
    root: str,
    device: str,
    model: str,
    out: str,
    tp: int = 1,
    vidur_model: str | None = None,
    network: str = "pairwise_nvlink",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write a ppsim profile for ``model`` on ``device`` at ``tp`` from Vidur's CSVs; returns (meta, fits)."""
    base = Path(root)
    if not (base / "compute").is_dir():
        raise PPSimError(
            f"--root: {base} has no compute/ folder; point it at Vidur's profiling data, "
            "the data/profiling directory of a Vidur checkout (github.com/microsoft/vidur)"
        )
    check_device(base, device)
    check_network(base, network)
    check_output_dir(out, inputs={"--root": root})
    shape = load_model(model)
    vm = vidur_model or PRESET_TO_VIDUR.get(model)
    mdir = base / "compute" / device / (vm or "")
    if vm is None or not (mdir / "mlp.csv").is_file():
        cdir = base / "compute" / device
        have = ", ".join(sorted(str(p.parent.relative_to(cdir)) for p in cdir.glob("*/*/mlp.csv"))) or "none"
        raise PPSimError(f"vidur import: no mlp.csv for {model} on {device}; pass --vidur-model, one of: {have}")
    rows = mlp_rows(mdir / "mlp.csv", tp)
    check_vidur_shape(rows[0], shape, mdir / "mlp.csv")
    fits: dict[str, Any] = {
        ppsim_op: _interp(
            table(rows, "num_tokens", f"time_stats.{v}.median"), "tokens", f"mlp.csv time_stats.{v}.median"
        )
        for v, ppsim_op in MLP_OPS.items()
    }
    fits["final_norm"] = {**fits["input_layernorm"], "source": "mlp.csv input_layernorm (no final norm profiled)"}
    missing = ["final_norm: input_layernorm's table", "lm_head: the analytic model (ppsim/cost/kernels.py)"]
    fits.update({k: v for k, v in roofline_fits(shape, device, tp).items()})
    if (mdir / "attention.csv").is_file() and (att := attention_fits(mdir / "attention.csv", tp)):
        fits.update(att)
    else:
        missing.append(f"attention: no attention.csv for {vm} at TP {tp} on {device}; the analytic model's attention")
    cpu, note = cpu_fits(base, device)
    fits.update(cpu)
    missing += [note] if note else []
    net, miss = network_fits(base, device, network, tp)
    fits.update(net)
    missing += miss
    meta = base_meta(shape, f"vidur {base}", f"{device} (Vidur profile)", "float16", None, tp, None)
    meta.update({"vidur_model": vm, "network": f"{device}_{network}", "missing": missing})
    meta["hardware"] = DEVICE_PRESET[device]  # the preset measured: a scenario on another must not load it
    samples = [
        {"op": f"{op}", "split": "fit", f["x"]: int(x) if float(x).is_integer() else x, "median_s": y}
        for op, f in fits.items()
        if f["form"] == "interp"
        for x, y in zip(f["coef"]["xs"], f["coef"]["ys"], strict=True)
    ]
    write_artifact(out, meta, fits, samples)
    return meta, fits
