"""Model shapes (HF ``config.json``), per-operator FLOPs/bytes and the layer partition."""

from ppsim.models.shape import ModelShape, list_presets, load_model

__all__ = ["ModelShape", "list_presets", "load_model"]
