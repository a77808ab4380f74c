"""Every configuration of a space resolved at load time, as :func:`ppsim.deployment.prepare` would,
without simulating.

A configuration whose model, hardware, partition, TP degree, cost profile or prompt budget is bad
input is refused before any work, in one line naming the axis values that cause it
(``space: pp = 100: ...``). One that does not fit in memory is not bad input but a result of the
sweep (status ``no-fit``), so it passes. Model shapes, cost models and workloads are built once per
distinct input: a space of hundreds of configurations resolves in a fraction of a second.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from ppsim.config import Scenario
from ppsim.cost.memory import stage_memory
from ppsim.deployment import build_cost, build_topology, check_prompt_budget, check_tensor_parallel
from ppsim.errors import PPSimError
from ppsim.hardware.presets import resolve_device
from ppsim.models.shape import load_model
from ppsim.workload import build_workload

if TYPE_CHECKING:
    from ppsim.sweep.space import Config


class _Memo:
    """Results (or the PPSimError) of expensive steps, by their inputs; one per space."""

    def __init__(self) -> None:
        self._done: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        if key not in self._done:
            try:
                self._done[key] = make()
            except PPSimError as err:
                self._done[key] = err
        got = self._done[key]
        if isinstance(got, PPSimError):
            raise got
        return got


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def check_scenario(s: Scenario, memo: _Memo) -> None:
    """Raise PPSimError if ``s`` is bad input; a stage that does not fit in memory is not."""
    shape = memo.get(
        _key("shape", s.model, s.weight_dtype, s.kv_cache_dtype),
        lambda: load_model(s.model).with_dtypes(
            None if s.weight_dtype == "auto" else s.weight_dtype,
            None if s.kv_cache_dtype == "auto" else s.kv_cache_dtype,
        ),
    )
    device = resolve_device(s.hardware)
    c, e = s.cluster, s.engine
    check_tensor_parallel(shape, c.tensor_parallel_size)
    topo = build_topology(shape, c.pipeline_parallel_size, c.tensor_parallel_size, c.layer_partition)
    for st in topo.stages:
        try:
            stage_memory(shape, st, device.memory_gib, e.gpu_memory_utilization, e.activation_reserve_gib, e.block_size)
        except PPSimError as err:
            if not str(err).startswith("memory:"):  # "memory:": the sweep's no-fit status
                raise
            break
    hw = s.hardware if isinstance(s.hardware, str) else s.hardware.model_dump(mode="json")
    cost_inputs = (s.model, s.weight_dtype, s.kv_cache_dtype, s.moe_router_zipf, hw)
    cost = memo.get(
        _key("cost", *cost_inputs, c.model_dump(mode="json"), s.cost.model_dump(mode="json"), e.cpu.model_dump()),
        lambda: build_cost(s, shape, device),
    )
    e.policy.return_cost(cost, e.cpu, c.pipeline_parallel_size)
    # the prompt lengths do not depend on the rate the search sets
    wl = s.workload.model_dump(mode="json", exclude={"request_rate"})
    reqs = memo.get(_key("workload", wl, s.seed), lambda: build_workload(s.workload, s.seed))
    check_prompt_budget(s, reqs)


def _where(bad: dict[str, str], failed: set[tuple], labels: list[dict[str, str]]) -> str:
    """The axis values of ``bad`` that every configuration holding them fails on (the cause), else all."""
    if not bad:
        return "base"
    every = len(failed) == len({_row(lab) for lab in labels})
    cause = [] if every else [k for k, v in bad.items() if all(_row(x) in failed for x in labels if x[k] == v)]
    shown = ", ".join(f"{k} = {{{v}}}" if "=" in v else f"{k} = {v}" for k, v in bad.items() if k in (cause or bad))
    return shown if cause or len(bad) == 1 else f"every configuration (e.g. {shown})"


def _row(labels: dict[str, str]) -> tuple:
    return tuple(labels.items())


def resolve_configs(configs: list[Config]) -> None:
    """Raise one PPSimError for the first configuration that is bad input, naming its axis values."""
    memo = _Memo()
    first: tuple[dict[str, str], str] | None = None
    failed: set[tuple] = set()
    for cfg in configs:
        try:
            check_scenario(cfg.scenario, memo)
        except PPSimError as err:
            first = first or (cfg.labels, str(err))
            failed.add(_row(cfg.labels))
    if first is not None:
        labels, msg = first
        raise PPSimError(f"space: {_where(labels, failed, [c.labels for c in configs])}: {msg}")
