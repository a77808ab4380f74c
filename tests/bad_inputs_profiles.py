"""Bad inputs to the profiled cost model's artifacts and the commands that write them: a corrupt profile
directory (``--profile``, ``[cost] profile_dir``) or one with absurd times, or of other hardware; a corrupt or
meaningless Vidur CSV (``import-vidur``); a router skew ``calibrate`` could never hand to a scenario, or one
on a dense model, an empty dtype, threads past the engine's bound, a model too large for the host's memory.
Same :class:`Case` table as ``tests/bad_inputs.py``; every case must end ``refused``: exit 2, one ``error:``
line containing ``fragment``, nothing written.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bad_inputs import TINY, Case, _files

SHIPPED = Path(__file__).resolve().parents[1] / "profiles" / "tiny-cpu"
TINY_CONFIG = (Path(__file__).resolve().parents[1] / "ppsim" / "models" / "presets" / "tiny.json").read_text()
SIM = ["simulate", *TINY, "--profile", "{d}/p", "--output-dir", "{d}/out"]
IMPORT = ["import-vidur", "--root", "{d}/vr", "--model", "llama-2-7b", "--output-dir", "{d}/out"]
CALIBRATE = ["calibrate", "--quick", "--no-link", "--model", "tiny-moe", "--output-dir", "{d}/out"]
DROP = object()  # _profile: delete the key instead of setting it


def _profile(file: str, keys: tuple[str | int, ...], value: Any = DROP) -> Callable[[Path], None]:
    """A copy of the shipped tiny profile at ``{d}/p`` with ``file``'s entry at ``keys`` set (or dropped)."""

    def make(d: Path) -> None:
        p = d / "p"
        shutil.copytree(SHIPPED, p)
        data = json.loads((p / file).read_text())
        parent = data
        for k in keys[:-1]:
            parent = parent[k]
        if value is DROP:
            del parent[keys[-1]]
        else:
            parent[keys[-1]] = value
        (p / file).write_text(json.dumps(data))

    return make


def _profile_on(hardware: str) -> Callable[[Path], None]:
    """The shipped tiny profile as an import from Vidur records it: measured on the preset ``hardware``."""

    def make(d: Path) -> None:
        _profile("meta.json", ("hardware",), hardware)(d)
        meta = json.loads((d / "p" / "meta.json").read_text())
        (d / "p" / "meta.json").write_text(json.dumps({**meta, "device": "h100 (Vidur profile)"}))

    return make


def _profile_bytes(file: str, tail: bytes) -> Callable[[Path], None]:
    """A copy of the shipped tiny profile with ``tail`` appended to ``file``."""

    def make(d: Path) -> None:
        shutil.copytree(SHIPPED, d / "p")
        with open(d / "p" / file, "ab") as f:
            f.write(tail)

    return make


def _profile_in_config(d: Path) -> None:
    """A corrupt profile named by ``[cost] profile_dir`` in a config file, not by ``--profile``."""
    _profile("fits.json", ("add",), 5)(d)
    (d / "c.toml").write_text(f'[cost]\nprofile_dir = "{d / "p"}"\n')


# --- a synthetic Vidur data/profiling tree: one mlp.csv for llama-2-7b on h100 ----------------------
VIDUR_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj")
VIDUR_OPS += ("post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
MLP_HEADER = ",".join(["num_tensor_parallel_workers", "num_tokens", *(f"time_stats.{v}.median" for v in VIDUR_OPS)])
MLP_CSV = "vr__compute__h100__meta-llama__Llama-2-7b-hf__mlp.csv"
SEND_CSV = "vr__network__h100_pairwise_nvlink__send_recv.csv"


def _mlp(first_row: str = "") -> str:
    """mlp.csv text: ``first_row`` (default: a good one) at line 2, then two good rows."""
    good = [f"1,{t}," + ",".join(f"{0.01 * t * (i + 1):g}" for i in range(len(VIDUR_OPS))) for t in (1, 2, 4)]
    return "\n".join([MLP_HEADER, first_row or good[0], *good[1:]]) + "\n"


def _mlp_cell(col: str, value: str) -> str:
    """mlp.csv with line 2's cell ``col`` replaced by ``value``."""
    head = MLP_HEADER.split(",")
    row = _mlp().splitlines()[1].split(",")
    row[head.index(col)] = value
    return _mlp(",".join(row))


UP = "time_stats.mlp_up_proj.median"
ATT_CSV = "vr__compute__h100__meta-llama__Llama-2-7b-hf__attention.csv"
ATT_HEADER = "num_tensor_parallel_workers,is_prefill,prefill_chunk_size,kv_cache_size,batch_size,"
ATT_HEADER += "time_stats.attn_prefill.median,time_stats.attn_decode.median"
# (chunk, prefix) points that determine prefill_attn's four coefficients
PREFILL_ROWS = [
    f"1,True,{c},{p},1,{0.001 * c + 1e-6 * c * p:g}," for c, p in ((16, 0), (32, 64), (64, 0), (128, 256), (256, 512))
]


def _attention(decode: list[tuple[int, int]], prefill: list[str] | None = None) -> str:
    """attention.csv: ``prefill`` rows (default: five good ones), then a decode row per (batch, kv_cache_size)."""
    dec = [f"1,False,,{kv},{b},,{0.01 + 1e-5 * b * kv:g}" for b, kv in decode]
    return "\n".join([ATT_HEADER, *(PREFILL_ROWS if prefill is None else prefill), *dec]) + "\n"


def _mlp_tokens(tokens: int) -> str:
    """mlp.csv whose every row is at ``tokens`` tokens: a table of one point."""
    return "\n".join([MLP_HEADER, *(",".join(["1", str(tokens), *r.split(",")[2:]]) for r in _mlp().splitlines()[1:])])


def _vidur_device(name: str) -> Callable[[Path], None]:
    """The synthetic Vidur tree with its compute/h100 folder renamed ``name``."""

    def make(d: Path) -> None:
        _files(**{MLP_CSV: _mlp()})(d)
        (d / "vr" / "compute" / "h100").rename(d / "vr" / "compute" / name)

    return make


# a HF config that passes every bound (hidden 2^16, intermediate 2^20) and whose one layer is 832 GiB in float32
HUGE_LAYER = (
    '{"hidden_size": 65536, "intermediate_size": 1048576, "num_hidden_layers": 2, "num_attention_heads": 512, '
    '"vocab_size": 256, "torch_dtype": "float32"}'
)

CASES_PROFILES: list[Case] = [
    # --- fits.json ----------------------------------------------------------------------------------
    Case(
        "profile-op-not-object",
        SIM,
        "fits.json: operator add: is a number, not an object",
        _profile("fits.json", ("add",), 5),
    ),
    Case("profile-op-no-coef", SIM, "operator add: has no coef", _profile("fits.json", ("add", "coef"))),
    Case("profile-op-no-form", SIM, "operator add: unknown form None", _profile("fits.json", ("add", "form"))),
    Case("profile-op-unknown-form", SIM, "unknown form 'cubic'", _profile("fits.json", ("add", "form"), "cubic")),
    Case(
        "profile-op-wrong-form",
        SIM,
        "operator attn_prefill: form 'linear' cannot time it",
        _profile("fits.json", ("attn_prefill", "form"), "linear"),
    ),
    Case(
        "profile-interp-empty",
        SIM,
        "operator add: interp needs coef xs and ys as non-empty lists",
        _profile("fits.json", ("add", "coef"), {"xs": [], "ys": []}),
    ),
    Case(
        "profile-interp-mismatched",
        SIM,
        "of equal length, got a list of 2 and a list of 1",
        _profile("fits.json", ("add", "coef"), {"xs": [1, 2], "ys": [1e-6]}),
    ),
    Case(
        "profile-interp-string",
        SIM,
        "operator add: coef ys[0] = 'fast' is not a number",
        _profile("fits.json", ("add", "coef", "ys", 0), "fast"),
    ),
    Case(
        "profile-interp-unsorted",
        SIM,
        "coef xs is not strictly ascending",
        _profile("fits.json", ("add", "coef"), {"xs": [2, 1], "ys": [1e-6, 2e-6]}),
    ),
    Case(
        "profile-interp-negative-time",
        SIM,
        "operator add: coef ys[1] = -1e-06 is negative",
        _profile("fits.json", ("add", "coef", "ys", 1), -1e-6),
    ),
    Case(
        "profile-linear-missing-c1",
        SIM,
        "operator send_recv: form linear needs coef c1, missing; re-run ppsim calibrate",
        _profile("fits.json", ("send_recv", "coef", "c1")),
    ),
    Case(
        "profile-coef-string",
        SIM,
        "operator attn_decode: coef call = 'fast' is not a number",
        _profile("fits.json", ("attn_decode", "coef", "call"), "fast"),
    ),
    Case(
        "profile-coef-bool",
        SIM,
        "operator attn_decode: coef ctx = True is not a number",
        _profile("fits.json", ("attn_decode", "coef", "ctx"), True),
    ),
    Case(
        "profile-coef-nan",
        SIM,
        "operator attn_prefill: coef cc = nan is not finite",
        _profile("fits.json", ("attn_prefill", "coef", "cc"), float("nan")),
    ),
    Case(
        "profile-decode-negative",
        SIM,
        "operator attn_decode: coef call = -1.0 is negative",
        _profile("fits.json", ("attn_decode", "coef", "call"), -1.0),
    ),
    Case(
        "profile-send-recv-negative",
        SIM,
        "operator send_recv: coef c1 = -1e-09 is negative",
        _profile("fits.json", ("send_recv", "coef", "c1"), -1e-9),
    ),
    Case(
        "profile-glue-form-wrong",
        SIM,
        "operator layer_glue: form 'decode_attn' cannot time it",
        _profile("fits.json", ("layer_glue", "form"), "decode_attn"),
    ),
    Case("profile-fits-not-utf8", SIM, "fits.json is not UTF-8 text", _profile_bytes("fits.json", b" \xe9")),
    Case(
        "profile-dir-in-config-corrupt",
        ["simulate", *TINY, "--config", "{d}/c.toml", "--output-dir", "{d}/out"],
        "fits.json: operator add: is a number",
        _profile_in_config,
    ),
    # --- meta.json ----------------------------------------------------------------------------------
    Case("profile-meta-tp-string", SIM, "meta.json: tp = 'abc' is not a tensor", _profile("meta.json", ("tp",), "abc")),
    Case("profile-meta-tp-null", SIM, "meta.json: tp = None is not a tensor", _profile("meta.json", ("tp",), None)),
    Case("profile-meta-tp-zero", SIM, "meta.json: tp = 0 is not a tensor", _profile("meta.json", ("tp",), 0)),
    Case(
        "profile-meta-model-not-object",
        SIM,
        "meta.json: model is a number, not an object",
        _profile("meta.json", ("model",), 5),
    ),
    Case("profile-meta-moe-not-object", SIM, "meta.json: moe is a number", _profile("meta.json", ("moe",), 5)),
    Case(
        "profile-meta-moe-load-string",
        SIM,
        "moe.expert_load[1] = 'x' is not a number",
        _profile("meta.json", ("moe",), {"router_zipf": 0.0, "expert_load": [0.5, "x"]}),
    ),
    Case(
        "profile-meta-live-charges-unknown",
        SIM,
        "meta.json: live_charges = 'sometimes' is not one of charged, recorded",
        _profile("meta.json", ("live_charges",), "sometimes"),
    ),
    Case("profile-meta-not-utf8", SIM, "meta.json is not UTF-8 text", _profile_bytes("meta.json", b" \xff")),
    # --- absurd times: 1e300 s in a table overflowed the simulator's clock (OverflowError, metrics/oplog.py) ------
    Case(
        "profile-table-time-huge",
        SIM,
        "operator add: coef ys[0] = 1e+300 is beyond 1000 in magnitude",
        _profile("fits.json", ("add", "coef", "ys", 0), 1e300),
    ),
    Case(
        "profile-coef-huge",
        SIM,
        "operator attn_decode: coef call = 5000.0 is beyond 1000",
        _profile("fits.json", ("attn_decode", "coef", "call"), 5000.0),
    ),
    Case(
        "profile-glue-huge-negative",
        SIM,
        "operator layer_glue: coef c0 = -1e+300 is beyond 1000",
        _profile("fits.json", ("layer_glue", "coef", "c0"), -1e300),
    ),
    Case(
        "profile-table-steep-tail",
        SIM,
        "operator add: the table's last slope, 1e+06 per unit of x past xs[-1], is beyond 1000",
        _profile("fits.json", ("add", "coef"), {"xs": [1, 1.5, 1.5001], "ys": [1e-6, 1e-6, 100.000001]}),
    ),
    Case(
        "profile-meta-hardware-number",
        SIM,
        "meta.json: hardware is a number, not the name of a hardware preset",
        _profile("meta.json", ("hardware",), 5),
    ),
    Case(
        "profile-of-other-hardware",
        [*SIM, "--hardware", "a100-80gb"],
        "measured on h100-sxm (h100 (Vidur profile)), the scenario runs on a100-80gb; pass --hardware h100-sxm",
        _profile_on("h100-sxm"),
    ),
    # --- import-vidur ---------------------------------------------------------------------------------
    Case(
        "vidur-cell-not-a-number",
        IMPORT,
        f"mlp.csv line 2 column {UP}: 'abc' is not a number",
        _files(**{MLP_CSV: _mlp_cell(UP, "abc")}),
    ),
    Case(
        "vidur-cell-nan", IMPORT, f"line 2 column {UP}: 'nan' is not finite", _files(**{MLP_CSV: _mlp_cell(UP, "nan")})
    ),
    Case("vidur-cell-inf", IMPORT, "'inf' is not finite", _files(**{MLP_CSV: _mlp_cell("num_tokens", "inf")})),
    Case("vidur-time-negative", IMPORT, f"column {UP}: '-5' is negative", _files(**{MLP_CSV: _mlp_cell(UP, "-5")})),
    Case(
        "vidur-tp-not-whole",
        IMPORT,
        "column num_tensor_parallel_workers: '1.5' is not a whole number",
        _files(**{MLP_CSV: _mlp_cell("num_tensor_parallel_workers", "1.5")}),
    ),
    Case("vidur-row-truncated", IMPORT, "mlp.csv line 2 has fewer cells", _files(**{MLP_CSV: _mlp("1,1,0.01")})),
    Case(
        "vidur-row-too-wide",
        IMPORT,
        "mlp.csv line 2 has more cells",
        _files(**{MLP_CSV: _mlp(_mlp().splitlines()[1] + ",7")}),
    ),
    Case(
        "vidur-not-utf8",
        IMPORT,
        "mlp.csv line 5 is not UTF-8 text",
        _files(**{MLP_CSV: _mlp().encode() + "# caf\xe9\n".encode("latin-1")}),
    ),
    Case(
        "vidur-send-recv-not-a-number",
        IMPORT,
        "send_recv.csv line 3 column size: 'big' is not a number",
        _files(**{MLP_CSV: _mlp(), SEND_CSV: "size,time_stats.send_recv.median\n2048,0.01\nbig,0.02\n"}),
    ),
    Case(
        "vidur-no-tp-column",
        IMPORT,
        "mlp.csv has no column num_tensor_parallel_workers",
        _files(**{MLP_CSV: "num_tokens,time_stats.add.median\n1,0.01\n"}),
    ),
    # --- import-vidur: meaningless data, accepted before (an import that timed every operator at 0 s) ------
    Case(
        "vidur-time-huge",
        IMPORT,
        f"mlp.csv line 2 column {UP}: '1e300' ms is above 60 s",
        _files(**{MLP_CSV: _mlp_cell(UP, "1e300")}),
    ),
    Case(
        "vidur-time-zero",
        IMPORT,
        f"mlp.csv line 2 column {UP}: '0' ms is zero: no measured operator takes no time",
        _files(**{MLP_CSV: _mlp_cell(UP, "0")}),
    ),
    Case(
        "vidur-one-token-count",
        IMPORT,
        "only at num_tokens = 0; a table needs two num_tokens values or more",
        _files(**{MLP_CSV: _mlp_tokens(0)}),
    ),
    Case(
        "vidur-column-twice",
        IMPORT,
        f"mlp.csv line 1 names column {UP} twice",
        _files(**{MLP_CSV: _mlp().replace("time_stats.add.median", UP, 1)}),
    ),
    Case("vidur-mlp-empty", IMPORT, "mlp.csv is empty", _files(**{MLP_CSV: ""})),
    Case("vidur-mlp-header-only", IMPORT, "mlp.csv has a header but no rows", _files(**{MLP_CSV: MLP_HEADER + "\n"})),
    Case(
        "vidur-send-recv-empty",
        IMPORT,
        "h100_pairwise_nvlink/send_recv.csv is empty",
        _files(**{MLP_CSV: _mlp(), SEND_CSV: ""}),
    ),
    Case(
        "vidur-tp-not-profiled",
        [*IMPORT, "-tp", "2"],
        "Llama-2-7b-hf/mlp.csv has no rows at tensor parallel size 2; it has 1: pass -tp one of them",
        _files(**{MLP_CSV: _mlp()}),
    ),
    Case(
        "vidur-attention-two-rows",
        IMPORT,
        "attn_prefill at tensor parallel size 1 has 2 distinct (prefill_chunk_size, kv_cache_size) points; its "
        "prefill_attn fit has 4 coefficients and needs 5 points or more",
        _files(**{MLP_CSV: _mlp(), ATT_CSV: _attention([(1, 128), (4, 512)], PREFILL_ROWS[:2])}),
    ),
    Case(
        "vidur-attention-decode-one-context",
        IMPORT,
        "attn_decode at tensor parallel size 1 has 5 distinct (batch_size, kv_cache_size) points, which do not vary "
        "them independently",
        _files(**{MLP_CSV: _mlp(), ATT_CSV: _attention([(b, 256) for b in (1, 2, 4, 8, 16)])}),
    ),
    Case(
        "vidur-device-absent",
        [*IMPORT, "--device", "foo"],
        "/vr/compute; devices there: h100",
        _files(**{MLP_CSV: _mlp()}),
    ),
    Case(
        "vidur-device-without-preset",
        [*IMPORT, "--device", "l4"],
        "--device: l4 has no ppsim hardware preset",
        _vidur_device("l4"),
    ),
    # --- import-vidur: the profile replaced its own data, or was written inside it -------------------------
    Case(
        "import-vidur-outdir-is-root",
        [*IMPORT[:-1], "{d}/vr"],
        "/vr is also --root; the results would replace it",
        _files(**{MLP_CSV: _mlp()}),
    ),
    Case(
        "import-vidur-outdir-inside-root",
        [*IMPORT[:-1], "{d}/vr/profile"],
        "/vr/profile lies inside --root ",
        _files(**{MLP_CSV: _mlp()}),
    ),
    # --- calibrate: the profile replaced the --model it reads (a folder of config.json passed as a result) ----
    Case(
        "calibrate-outdir-is-model-dir",
        [*CALIBRATE[:-1], "{d}/m", "--model", "{d}/m"],
        "/m is also --model; the results would replace it",
        _files(**{"m__config.json": TINY_CONFIG}),
        needs_torch=True,
    ),
    Case(
        "calibrate-outdir-holds-model",
        [*CALIBRATE[:-1], "{d}/m", "--model", "{d}/m/config.json"],
        "/m holds --model ",
        _files(**{"m__config.json": TINY_CONFIG}),
        needs_torch=True,
    ),
    # --- calibrate: a router skew no scenario can use, refused before any profiling -------------------
    *(
        Case(f"calibrate-zipf-{v}", [*CALIBRATE, "--moe-router-zipf", v], "give a finite value in [0, 8]")
        for v in ("nan", "inf", "9", "-1")
    ),
    # --- calibrate: values that changed nothing, or ran out of threads or memory, after minutes or at once ----
    Case(
        "calibrate-zipf-dense-model",
        [*CALIBRATE, "--model", "tiny", "--moe-router-zipf", "3"],
        "--moe-router-zipf: tiny is a dense model",
        needs_torch=True,
    ),
    Case("calibrate-dtype-empty", [*CALIBRATE, "--dtype", ""], "--dtype: '' is not one of", needs_torch=True),
    Case(
        "calibrate-threads-huge",
        [*CALIBRATE, "--threads", "100000"],
        "--threads: 100000 is more than 1024",
        needs_torch=True,
    ),
    Case(
        "calibrate-layer-beyond-memory",
        [*CALIBRATE, "--model", "{d}/config.json"],
        "GiB the host has available (MemAvailable)",
        _files(**{"config.json": HUGE_LAYER}),
        needs_torch=True,
    ),
]
