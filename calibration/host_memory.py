"""Whether a calibration's weights fit where it runs, checked before any of them is allocated.

From its first timing to its last, calibration holds the profiler's stack of distinct layers (each a
:class:`calibration.layer.Layer` with its own embedding and lm_head), an engine stage over as many layers
plus the two stage ends (:class:`calibration.stage_step.EngineStages`) and, on a CPU, the co-running
stage's copy of that in a second process (:mod:`calibration.corun`). That much is a lower bound (the
live engine runs and the KV caches come on top); a model whose layer alone exceeds the memory available
ended in torch's ``RuntimeError: ... can't allocate memory`` (exit 1), or in the kernel's OOM killer.
"""

from __future__ import annotations

from ppsim.errors import PPSimError
from ppsim.hostmem import host_available_bytes
from ppsim.models.shape import ModelShape
from ppsim.units import format_gib


def weight_bytes(shape: ModelShape, element_bytes: int, stack_bytes: int, device: str) -> tuple[int, int, int]:
    """(bytes of weights calibration holds at once, bytes of one profiled layer, layers in its stack) for
    ``shape`` in a dtype of ``element_bytes``; the stack is as many layers as fit ``stack_bytes``, one at least."""
    engine = shape.layer_params() * element_bytes  # the heaviest layer kind, all its experts
    # a profiled Layer of a MoE model keeps a dense MLP too (the mlp_* operators of its dense layers)
    layer = engine + (shape.dense_mlp_params() * element_bytes if shape.is_moe else 0)
    ends = 2 * shape.vocab_size * shape.hidden_size * element_bytes  # embedding and lm_head
    stack = max(1, min(shape.num_layers, stack_bytes // max(1, layer)))
    stages = stack * engine + 2 * ends  # the stage over the stack, and the stage ends alone
    return stack * (layer + ends) + stages * (2 if device == "cpu" else 1), layer, stack


def available_bytes(device: str) -> int | None:
    """Memory free for new allocations: the host's ``MemAvailable`` (``/proc/meminfo``) or the CUDA
    device's free memory; None where it cannot be read (the check is then skipped)."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    return host_available_bytes()


def check_memory(shape: ModelShape, dtype: str, element_bytes: int, stack_bytes: int, device: str) -> None:
    """Refuse a calibration whose weights (:func:`weight_bytes`) exceed the memory available on ``device``."""
    need, layer, stack = weight_bytes(shape, element_bytes, stack_bytes, device)
    free = available_bytes(device)
    if free is None or need <= free:
        return
    where = "the CUDA device has free" if device == "cuda" else "the host has available (MemAvailable)"
    raise PPSimError(
        f"--model: calibrating {shape.name} in {dtype} holds {format_gib(need)} of weights ({stack} layer(s) "
        f"of {format_gib(layer, 2)} in the profiler and in the engine stages, with embedding and lm_head), more "
        f"than the {format_gib(free)} {where}; calibrate a smaller model or dtype (--dtype), or free memory"
    )
