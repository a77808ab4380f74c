"""The search space of a capacity sweep, read from a TOML/YAML file.

A space file has four sections::

    [base]        # any scenario fields, exactly as in a --config file (model, workload, ...)
    [space]       # axes: key = list of values; the sweep is their cartesian product
    [slo]         # latency objectives, e.g. p99_ttft_ms = 2000, p99_tpot_ms = 100
    [search]      # bisection settings (rel_tolerance, max_steps)

An axis key is a short name (``pp``, ``tp``, ``max_num_seqs``, ``chunk_size``, ``policy``, ...)
or a dotted scenario path (``engine.gpu_memory_utilization``). A value is a scalar, set at the
path, or a table, merged at the path: ``scheduler = [{policy = "vllm-batch-queue", pp_throttle =
false}, ...]`` varies a policy together with its knobs. ``num_gpus`` is not a scenario field: it
keeps only configurations whose ``pp x tp`` is one of the listed counts. ``chunk_size`` is vLLM's
chunked-prefill chunk, which in V1 is the per-step token budget ``max_num_batched_tokens``
(``vllm/v1/core/sched/scheduler.py``: a prefill takes ``min(num_new_tokens, token_budget)``); it
sets SGLang's ``engine.chunked_prefill_size`` instead for ``sglang-ring``, so one axis means the chunk
for every policy.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ppsim.config import Scenario, check_sections, deep_merge, format_validation_error
from ppsim.errors import PPSimError
from ppsim.fileio import cut_text, read_mapping
from ppsim.flags import flag_paths

SECTIONS = ("name", "base", "space", "slo", "search")
# The product of the axes (before the num_gpus filter) at most: each configuration is checked at load time
# (~0.5 ms) and then costs a few simulated runs, so 10,000 is already hours of work on one host
MAX_CONFIGURATIONS = 10_000

# axis name -> path: every deployment flag's field by its name (ppsim/flags.py: the engines' names, each
# policy knob beside engine.policy, the flat form the scenario maps; the workload is the search's), plus
# the sweep's short names
ALIASES: dict[str, tuple[str, ...]] = {
    **{path[-1]: path for path in flag_paths().values() if path[0] not in ("workload", "cost")},
    "pp": ("cluster", "pipeline_parallel_size"),
    "tp": ("cluster", "tensor_parallel_size"),
    "batch": ("engine", "max_num_seqs"),
    "chunk_size": ("engine", "max_num_batched_tokens"),
    "scheduler": ("engine",),
    "engine": ("engine",),
    "cluster": ("cluster",),
    "workload": ("workload",),
    "cost": ("cost",),
}

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
SLO_KEYS = tuple(f"{s}_{m}_ms" for s in ("mean", "median", "p99") for m in METRIC_NAMES)


@dataclass(frozen=True)
class SearchSettings:
    """Bisection over request rate: stop when the bracket is below ``rel_tolerance`` x saturation."""

    rel_tolerance: float = 0.03
    max_steps: int = 8


@dataclass(frozen=True)
class Config:
    """One point of the space: its axis labels and the resolved scenario (request rate unset)."""

    labels: dict[str, str]
    scenario: Scenario

    @property
    def num_gpus(self) -> int:
        c = self.scenario.cluster
        return c.pipeline_parallel_size * c.tensor_parallel_size


@dataclass(frozen=True)
class SweepSpace:
    name: str
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    slo: dict[str, float]
    search: SearchSettings
    num_gpus: tuple[int, ...] | None = None
    configs: list[Config] = field(default_factory=list)
    filtered: int = 0  # combinations dropped by num_gpus


def read_space_file(path: str | Path) -> dict[str, Any]:
    return read_mapping(path, "--space", f"sections {', '.join(SECTIONS)}", (".toml", ".yaml", ".yml"))


def axis_path(key: str) -> tuple[str, ...]:
    if key in ALIASES:
        return ALIASES[key]
    parts = tuple(key.split("."))
    if len(parts) < 2 or parts[0] not in ("cluster", "engine", "cost", "workload"):
        raise PPSimError(
            f"space.{key}: unknown axis; use one of {', '.join(sorted(ALIASES))}, num_gpus "
            "or a dotted scenario path like engine.gpu_memory_utilization"
        )
    return parts


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    for k in path[:-1]:
        node = node.setdefault(k, {})
    node[path[-1]] = value
    return out


def label(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={label(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _parse_slo(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict) or not raw:
        raise PPSimError(f"slo: give at least one objective, e.g. p99_ttft_ms = 2000; known: {', '.join(SLO_KEYS)}")
    out = {}
    for k, v in raw.items():
        if k not in SLO_KEYS:
            raise PPSimError(f"slo.{k}: unknown objective; use one of {', '.join(SLO_KEYS)}")
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or math.isinf(v):
            raise PPSimError(f"slo.{k}: must be a positive number of milliseconds (got {v!r})")
        out[k] = float(v)
    return out


def _parse_search(raw: Any) -> SearchSettings:
    if raw is None:
        return SearchSettings()
    if not isinstance(raw, dict):
        raise PPSimError("search: must be a table with rel_tolerance and/or max_steps")
    for k in raw:
        if k not in ("rel_tolerance", "max_steps"):
            raise PPSimError(f"search.{k}: unknown setting; use rel_tolerance or max_steps")
    tol = raw.get("rel_tolerance", SearchSettings.rel_tolerance)
    steps = raw.get("max_steps", SearchSettings.max_steps)
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 < tol < 1:
        raise PPSimError(f"search.rel_tolerance: must be in (0, 1), e.g. 0.03 (got {tol!r})")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 30:
        raise PPSimError(f"search.max_steps: must be an integer in [1, 30] (got {steps!r})")
    return SearchSettings(float(tol), steps)


def _parse_axes(raw: Any, source: str) -> tuple[dict[str, list[Any]], tuple[int, ...] | None]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PPSimError("space: must be a table of axes, e.g. tp = [1, 2, 4, 8]")
    axes: dict[str, list[Any]] = {}
    gpus = None
    seen: dict[tuple[str, ...], str] = {}
    for k, v in raw.items():
        if not isinstance(v, list) or not v:
            raise PPSimError(f"space.{k}: must be a non-empty list of values (got {v!r})")
        if k == "num_gpus":
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v):
                raise PPSimError(f"space.num_gpus: must be a list of positive integers (got {v!r})")
            gpus = tuple(v)
            continue
        path = axis_path(k)
        whole = len(path) == 2 and path[0] == "workload"  # "workload.request_rate" (else a table axis)
        for x in v:
            where, fix = (f"space.{k}", "remove this axis") if whole else (f"space.{k}.{{}}", "remove it")
            check_sections(_nested(path, x), source, field=f"space.{k}")
            _check_workload(_nested(path, x).get("workload"), where, fix)
        if path in seen and not isinstance(v[0], dict):
            raise PPSimError(f"space.{k}: sets the same field as space.{seen[path]}; keep one of them")
        seen[path] = k
        axes[k] = v
    return axes, gpus


def _check_size(raw: Any, source: str) -> None:
    """Refuse a space of more than MAX_CONFIGURATIONS combinations before any is built."""
    axes = raw if isinstance(raw, dict) else {}  # not a table: _parse_axes names it
    lengths = {k: len(v) for k, v in axes.items() if isinstance(v, list) and k != "num_gpus"}
    count = math.prod(lengths.values())
    if count > MAX_CONFIGURATIONS:
        product = " x ".join(f"{k} {n}" for k, n in lengths.items())
        raise PPSimError(
            f"space: {source} has {count:,} configurations ({cut_text(product, 200)} values), more than the "
            f"{MAX_CONFIGURATIONS:,} a sweep may have; give the axes fewer values or split the space into several files"
        )


def _check_workload(wl: Any, where: str, fix: str) -> None:
    """The search sets the request rate of a synthetic workload: a rate or a trace in the space is refused.
    ``where`` names the field, ``{}`` standing for ``request_rate`` or ``trace``."""
    if not isinstance(wl, dict):
        return  # not a table: the scenario's validation names it
    if "request_rate" in wl:
        raise PPSimError(f"{where.replace('{}', 'request_rate')}: the sweep searches the request rate; {fix}")
    if wl.get("trace"):
        raise PPSimError(
            f"{where.replace('{}', 'trace')}: the sweep searches the request rate of a synthetic workload, "
            f"and a trace fixes its arrival times; {fix} and describe the requests with num_prompts, "
            "random_input_len and random_output_len"
        )


def load_space(path: str | Path) -> SweepSpace:
    """Parse and check a space file, and resolve every configuration as a run would (model, hardware,
    partition, TP, cost profile, prompt budget), without simulating; raises PPSimError on bad input."""
    from ppsim.sweep.resolve import resolve_configs

    data = read_space_file(path)
    space = parse_space(data, default_name=Path(path).stem, source=str(path))
    resolve_configs(space.configs)
    return space


def parse_space(data: dict[str, Any], default_name: str = "sweep", source: str = "the space file") -> SweepSpace:
    for k in data:
        if k not in SECTIONS:
            raise PPSimError(f"{k}: unknown section in the space file; use {', '.join(SECTIONS)}")
    _check_size(data.get("space"), source)
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise PPSimError("base: must be a table of scenario fields (as in a --config file)")
    check_sections(base, source, prefix="base.")
    _check_workload(base.get("workload"), "base.workload.{}", "remove it")
    axes, gpus = _parse_axes(data.get("space"), source)
    slo = _parse_slo(data.get("slo"))
    search = _parse_search(data.get("search"))
    name = str(data.get("name") or default_name)
    configs, filtered = expand(base, axes, gpus)
    if not configs:
        raise PPSimError("space.num_gpus: no configuration has pp x tp equal to one of the listed GPU counts")
    return SweepSpace(name, base, axes, slo, search, gpus, configs, filtered)


def _chunk_knob(data: dict[str, Any]) -> dict[str, Any]:
    """``chunk_size`` sets the chunk of the configuration's policy: vLLM's (and TRT-LLM's) step budget,
    SGLang's ``chunked_prefill_size`` (whose prefill batches ``max_num_batched_tokens`` does not bound)."""
    eng = data.get("engine")
    if isinstance(eng, dict) and eng.get("policy") == "sglang-ring" and "max_num_batched_tokens" in eng:
        eng = dict(eng)
        v = eng.pop("max_num_batched_tokens")
        eng.setdefault("chunked_prefill_size", v)
        data = {**data, "engine": eng}
    return data


def expand(base: dict[str, Any], axes: dict[str, list[Any]], gpus: tuple[int, ...] | None) -> tuple[list[Config], int]:
    """Every combination of axis values as a validated scenario; ``num_gpus`` filters by pp x tp."""
    keys = list(axes)
    configs: list[Config] = []
    filtered = 0
    for combo in itertools.product(*(axes[k] for k in keys)):
        data = json.loads(json.dumps(base))
        for k, v in zip(keys, combo, strict=True):
            data = deep_merge(data, _nested(axis_path(k), v))
        if "chunk_size" in keys:
            data = _chunk_knob(data)
        # a placeholder rate: the search sets the real one
        data = deep_merge(data, {"workload": {"request_rate": 1.0}})
        try:
            s = Scenario.model_validate(data)
        except ValidationError as err:
            where = ", ".join(f"{k}={label(v)}" for k, v in zip(keys, combo, strict=True))
            raise PPSimError(f"space: {format_validation_error(err)} (in configuration {where})") from None
        cfg = Config({k: label(v) for k, v in zip(keys, combo, strict=True)}, s)
        if gpus is not None and cfg.num_gpus not in gpus:
            filtered += 1
            continue
        configs.append(cfg)
    return configs, filtered
