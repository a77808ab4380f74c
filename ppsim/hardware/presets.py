"""Accelerator and interconnect presets (vendor datasheet figures).

Device memory is the total an engine sees (nvidia-smi), in GiB. FLOP/s are dense (no sparsity)
tensor-core peaks: BF16, and FP8 / FP4 where the device has tensor cores for them (FP8 on Ada,
Hopper and Blackwell; FP4 on Blackwell). A dtype without its own peak runs at the BF16 rate
(vLLM's weight-only Marlin kernels dequantize FP8/FP4 weights to 16-bit on such GPUs).
Link bandwidth is per direction, in GB/s (1e9 bytes/s).

Sources: NVIDIA datasheets (A40: 149.7 BF16 dense, 696 GB/s; H100/H200 SXM: 989 BF16 / 1,979 FP8
dense; HGX B200: 2.25 / 4.5 / 9 PFLOP/s BF16 / FP8 / FP4 dense per GPU; L40S 362 / 733), H20 (96 GB
HBM3, 4.0 TB/s, 148 TFLOP/s BF16, 296 FP8 dense), RTX PRO 6000 Blackwell Server Edition (GB202, 188 SMs, 96 GB GDDR7 at
1,792 GB/s, PCIe Gen5 x16, no NVLink; "4,000 AI TOPS" is sparse FP4, so dense FP4 / FP8 / BF16 are
2,015 / 1,008 / 504 TFLOP/s per the RTX Blackwell architecture whitepaper).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, field_validator

from ppsim.errors import PPSimError
from ppsim.typed import Model

# Bounds on custom devices and links: far outside any real part, so that a unit mistake (memory in bytes,
# bandwidth in bytes/s or a value meant as a divisor) is refused instead of allocating a KV pool of
# billions of blocks or turning times into inf/NaN. The largest accelerators today have 288 GB, the
# fastest ~10 PFLOP/s (FP4) and ~8 TB/s.
MIN_TFLOPS = 1e-3  # 1 GFLOP/s
MAX_TFLOPS = 1e6  # 1 EFLOP/s
MIN_BANDWIDTH_GBPS = 1e-3  # 1 MB/s
MAX_BANDWIDTH_GBPS = 1e6  # 1 PB/s
MAX_MEMORY_GIB = 4096.0  # 4 TiB
MAX_LATENCY_US = 1e7  # 10 s


class DeviceSpec(Model):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    peak_tflops: float = Field(ge=MIN_TFLOPS, le=MAX_TFLOPS, description="dense BF16 tensor-core peak, TFLOP/s")
    hbm_bandwidth_gbps: float = Field(
        ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="memory bandwidth, GB/s"
    )
    memory_gib: float = Field(gt=0, description="device memory, GiB (not bytes)")
    peak_tflops_fp8: float | None = Field(
        default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS, description="dense FP8 peak; None: no FP8 cores"
    )
    peak_tflops_fp4: float | None = Field(
        default=None, ge=MIN_TFLOPS, le=MAX_TFLOPS, description="dense FP4 peak; None: no FP4 cores"
    )

    @field_validator("memory_gib")
    @classmethod
    def _memory_in_gib(cls, v: float) -> float:
        if v > MAX_MEMORY_GIB:
            raise ValueError(f"{v:g} GiB is more than {MAX_MEMORY_GIB:g} GiB; give the memory in GiB, not bytes")
        return v

    def gemm_tflops(self, weight_dtype: str | None) -> float:
        """Dense peak for GEMMs whose weights are ``weight_dtype`` (W8A8 / W4A4 where supported)."""
        if weight_dtype == "fp8" and self.peak_tflops_fp8:
            return self.peak_tflops_fp8
        if weight_dtype == "fp4" and self.peak_tflops_fp4:
            return self.peak_tflops_fp4
        return self.peak_tflops


class LinkSpec(Model):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    latency_us: float = Field(
        ge=0, le=MAX_LATENCY_US, description="one-way latency of a point-to-point send, microseconds"
    )
    bandwidth_gbps: float = Field(
        ge=MIN_BANDWIDTH_GBPS, le=MAX_BANDWIDTH_GBPS, description="per-direction bandwidth, GB/s"
    )


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec(name="a100-80gb", peak_tflops=312.0, hbm_bandwidth_gbps=2039.0, memory_gib=80.0),
        # A40: Ampere GA102, 48 GB GDDR6 at 696 GB/s (nvidia-smi 46,068 MiB), 149.7 TFLOP/s BF16 dense.
        DeviceSpec(name="a40", peak_tflops=149.7, hbm_bandwidth_gbps=696.0, memory_gib=45.0),
        DeviceSpec(
            name="h100-sxm", peak_tflops=989.0, hbm_bandwidth_gbps=3350.0, memory_gib=79.6, peak_tflops_fp8=1979.0
        ),
        DeviceSpec(name="h200", peak_tflops=989.0, hbm_bandwidth_gbps=4800.0, memory_gib=140.4, peak_tflops_fp8=1979.0),
        DeviceSpec(name="l40s", peak_tflops=362.0, hbm_bandwidth_gbps=864.0, memory_gib=44.5, peak_tflops_fp8=733.0),
        DeviceSpec(
            name="b200",
            peak_tflops=2250.0,
            hbm_bandwidth_gbps=8000.0,
            memory_gib=178.4,
            peak_tflops_fp8=4500.0,
            peak_tflops_fp4=9000.0,
        ),
        # H20: export-limited Hopper, 96 GB HBM3 (nvidia-smi ~97,900 MiB).
        DeviceSpec(name="h20", peak_tflops=148.0, hbm_bandwidth_gbps=4000.0, memory_gib=95.6, peak_tflops_fp8=296.0),
        # RTX PRO 6000 Blackwell Server Edition: PCIe card, 96 GB GDDR7 (nvidia-smi ~97,900 MiB), no NVLink.
        DeviceSpec(
            name="rtx-pro-6000",
            peak_tflops=503.8,
            hbm_bandwidth_gbps=1792.0,
            memory_gib=95.6,
            peak_tflops_fp8=1007.6,
            peak_tflops_fp4=2015.2,
        ),
    ]
}

LINKS: dict[str, LinkSpec] = {
    ln.name: ln
    for ln in [
        # NVLink 4 (H100): 900 GB/s bidirectional = 450 GB/s per direction.
        LinkSpec(name="nvlink", latency_us=5.0, bandwidth_gbps=450.0),
        # NVLink 3 (A100 SXM, NVSwitch): 600 GB/s bidirectional = 300 GB/s per direction.
        LinkSpec(name="nvlink3", latency_us=5.0, bandwidth_gbps=300.0),
        # InfiniBand NDR: 400 Gb/s = 50 GB/s per direction.
        LinkSpec(name="ib-ndr", latency_us=10.0, bandwidth_gbps=50.0),
        # PCIe Gen4 x16: 32 GB/s per direction nominal.
        LinkSpec(name="pcie", latency_us=10.0, bandwidth_gbps=32.0),
        # PCIe Gen5 x16: 64 GB/s per direction nominal (RTX PRO 6000 servers, no NVLink).
        LinkSpec(name="pcie5", latency_us=10.0, bandwidth_gbps=64.0),
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
