"""Accelerator and interconnect presets (vendor datasheet figures).

Device memory is the total an engine sees (nvidia-smi), in GiB. FLOP/s are dense (no sparsity)
BF16 tensor-core peaks. Link bandwidth is per direction, in GB/s (1e9 bytes/s).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ppsim.errors import PPSimError


class DeviceSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    peak_tflops: float = Field(gt=0, description="dense BF16 tensor-core peak, TFLOP/s")
    hbm_bandwidth_gbps: float = Field(gt=0, description="memory bandwidth, GB/s")
    memory_gib: float = Field(gt=0, description="device memory, GiB")


class LinkSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    latency_us: float = Field(ge=0, description="one-way latency of a point-to-point send, microseconds")
    bandwidth_gbps: float = Field(gt=0, description="per-direction bandwidth, GB/s")


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec(name="a100-80gb", peak_tflops=312.0, hbm_bandwidth_gbps=2039.0, memory_gib=80.0),
        DeviceSpec(name="h100-sxm", peak_tflops=989.0, hbm_bandwidth_gbps=3350.0, memory_gib=79.6),
        DeviceSpec(name="h200", peak_tflops=989.0, hbm_bandwidth_gbps=4800.0, memory_gib=140.4),
        DeviceSpec(name="l40s", peak_tflops=362.0, hbm_bandwidth_gbps=864.0, memory_gib=44.5),
        DeviceSpec(name="b200", peak_tflops=2250.0, hbm_bandwidth_gbps=8000.0, memory_gib=178.4),
    ]
}

LINKS: dict[str, LinkSpec] = {
    ln.name: ln
    for ln in [
        # NVLink 4 (H100): 900 GB/s bidirectional = 450 GB/s per direction.
        LinkSpec(name="nvlink", latency_us=5.0, bandwidth_gbps=450.0),
        # InfiniBand NDR: 400 Gb/s = 50 GB/s per direction.
        LinkSpec(name="ib-ndr", latency_us=10.0, bandwidth_gbps=50.0),
        # PCIe Gen4 x16: 32 GB/s per direction nominal.
        LinkSpec(name="pcie", latency_us=10.0, bandwidth_gbps=32.0),
        # 100 GbE with TCP: 12.5 GB/s.
        LinkSpec(name="ethernet", latency_us=30.0, bandwidth_gbps=12.5),
    ]
}


def resolve_device(value: str | DeviceSpec) -> DeviceSpec:
    if isinstance(value, DeviceSpec):
        return value
    if value not in DEVICES:
        raise PPSimError(f"hardware: unknown preset {value!r}; use one of {', '.join(DEVICES)} or give custom values")
    return DEVICES[value]


def resolve_link(value: str | LinkSpec, field: str = "link") -> LinkSpec:
    if isinstance(value, LinkSpec):
        return value
    if value not in LINKS:
        raise PPSimError(f"{field}: unknown preset {value!r}; use one of {', '.join(LINKS)} or give custom values")
    return LINKS[value]
