"""Host guard: is this machine the same before and after every engine repeat, and is it ours?

The simulator knows nothing of other processes on the host: an engine run that shares its cores
with someone else's job is slower for a reason no cost model has, and a validation against it
measures the neighbour. So ``validate`` reads the host before and after each engine repeat (never
during one: the engine's own stages would be the load):

* ``load1``: ``os.getloadavg()[0]``, recorded for the reader; it is a one-minute moving average that
  still holds the previous repeat's own stages, so it is not judged.
* a fixed CPU probe run in one process per core at once: each runs 60 slices of a pure-Python loop
  over about 1.5 s, timing each by wall clock and by its thread's CPU time. ``core_share`` = the
  smallest CPU / wall ratio over the probes: 1.0 on an idle host, about 2/3 when a third busy process
  shares two cores. ``probe_s`` = the slowest probe's mean CPU time per slice: the host's speed. It
  is a mean over many slices because a virtual CPU's speed can flip within a second (on this
  project's 2-vCPU KVM guest each vCPU runs the same loop in 5.5 or 9.8 ms, at 100% CPU, switching
  second by second: a neighbour on the physical core); one short probe caught either state, and a
  guard built on it flagged 12 of 14 quiet runs for a drift of 17-84%.
* the engine's own decode step (``engine/probe.py``), on the CPU: a fixed 4-layer stage of ``tiny``
  (``stage_probe_s``) and the validated model whole, as the engine runs it at PP = 1 (``model_probe_s``;
  a model of up to 256 MiB of weights): the host's speed at the model's own footprint against the
  cache, which the fixed stage and the pure-Python loop do not have. The fixed stage is judged against
  its reading at calibration (``host_stage_probe_s``), like the CPU probe; the whole model against the
  profile's own price of that step (``engine/probe.py::model_price``), or, where it cannot be priced,
  against its reading at calibration (``host_model_probe_s`` of the same model).

A profile also records which CPU measured it (``meta.json`` ``host_cpu``, :func:`cpu_identity`: the model name, the
vCPUs, the L2 and L3 sizes from sysfs). A run whose host differs in any of them that both sides know is flagged first:
this project's VM has been an Intel guest with a 480 MB L3 and an AMD EPYC one with 32 MiB, and a model whose weights
sit between the two (`tiny`, 24 MB) costs per layer what its footprint against that cache makes it
(docs/validation.md, part 36), which no probe's speed ratio carries from one to the other.

A run is flagged when ``core_share`` fell below ``min_core_share`` at any reading, or when the mean
``probe_s`` of its readings differs by more than ``max_drift`` from the probe ``ppsim calibrate``
recorded in the profile (``meta.json`` ``host_probe_s``, a mean over one reading per calibration
round and one at the end): the cost model is the host's speed at calibration, so a host that has
since got slower or faster runs the engine at a speed no profile of it predicts. The drift between
single readings (max / min - 1) is recorded but judged only for a profile without a probe: on this
VM twelve consecutive 1.5-s readings of a steady host spread from 1.72 to 2.50 ms. ``--host-guard
refuse`` stops the validation at the first bad reading instead (exit 2, one line); ``off`` skips the
probe. Readings come from a function passed in, so tests inject them and never depend on how fast
the host is.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ppsim.errors import PPSimError

CPU_ROOT = "/sys/devices/system/cpu"
CPU_KEYS = ("model", "vcpus", "l2_bytes", "l3_bytes")  # what names a host's CPU (a None on either side: not judged)

PROBE_LOOP = 20_000  # iterations of one probe slice (about 2 ms of one core of a 2020s x86 server)
PROBE_SLICES = 60  # slices per probe, PROBE_GAP_S apart: the probe spans about 1.5 s
PROBE_GAP_S = 0.02
PROBE_CODE = (
    "import time\n"
    "cpu = wall = 0.0\n"
    f"for _ in range({PROBE_SLICES}):\n"
    "    t0 = time.perf_counter(); c0 = time.thread_time(); x = 0\n"
    f"    for i in range({PROBE_LOOP}):\n        x += i * i\n"
    "    cpu += time.thread_time() - c0; wall += time.perf_counter() - t0\n"
    f"    time.sleep({PROBE_GAP_S})\n"
    f"print(cpu / {PROBE_SLICES}, wall / {PROBE_SLICES})\n"
)
PROBE_TIMEOUT_S = 60.0
MAX_DRIFT = 10.0  # --host-max-drift: a host 11x slower than at calibration is no longer the host it measured
DEFAULT_MAX_DRIFT = 0.20
DEFAULT_MIN_CORE_SHARE = 0.85
GuardMode = Literal["flag", "refuse", "off"]


def _cache_bytes(text: str) -> int | None:
    """sysfs' cache ``size`` ("1024K", "32768K", "32M") in bytes; None if unreadable."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


def cpu_identity(root: str = CPU_ROOT, cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """This host's CPU as a profile records it: ``model`` (``/proc/cpuinfo``'s model name), ``vcpus``
    (``os.cpu_count()``), ``l2_bytes`` and ``l3_bytes`` (cpu0's unified caches of levels 2 and 3 in sysfs, the
    L3 shared by the cores that share it); a field this host does not expose is None."""
    out: dict[str, Any] = dict.fromkeys(CPU_KEYS)
    out["vcpus"] = os.cpu_count()
    try:
        for line in open(cpuinfo, encoding="utf-8"):
            if line.startswith("model name"):
                out["model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cache = os.path.join(root, "cpu0", "cache")
    try:
        entries = sorted(os.listdir(cache))
    except OSError:
        return out
    for name in entries:
        level, kind, size = (_read(os.path.join(cache, name, f)) for f in ("level", "type", "size"))
        if kind == "Unified" and level in ("2", "3") and size is not None:
            out[f"l{level}_bytes"] = _cache_bytes(size)
    return out


def _read(path: str) -> str | None:
    """A sysfs file's text, stripped; None if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_text(cpu: dict[str, Any]) -> str:
    """ "AMD EPYC, 2 vCPUs, L2 1 MiB, L3 32 MiB" (the fields known)."""
    parts = [str(cpu["model"])] if cpu.get("model") else []
    parts += [f"{cpu['vcpus']} vCPUs"] if cpu.get("vcpus") else []
    for level in ("l2", "l3"):
        b = cpu.get(f"{level}_bytes")
        if b:
            parts.append(f"{level.upper()} {b / 1024**2:g} MiB")
    return ", ".join(parts) or "unknown"


def cpu_differs(reference: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    """The fields of :data:`CPU_KEYS` both sides know and that differ."""
    if not isinstance(reference, dict) or not isinstance(now, dict):
        return []
    return [k for k in CPU_KEYS if reference.get(k) is not None and now.get(k) is not None and reference[k] != now[k]]


@dataclass(frozen=True)
class HostReading:
    when: str  # "before 0", "after 0", ...
    load1: float
    probe_s: float  # the slowest core's mean CPU seconds per probe slice (the host's speed)
    core_share: float  # smallest CPU / wall over the probes (1.0: each probe had a core to itself)
    stage_probe_s: float | None = None  # the engine's own step, CPU s (engine/probe.py); None: not read
    model_probe_s: float | None = None  # the validated model's whole step, CPU s (engine/probe.py::model_probe)
    shaped_probe_s: float | None = None  # the same model at the predicted run's decode step (HostGuard.shaped_step)


def cpu_probe(processes: int | None = None) -> tuple[float, float]:
    """Run the probe in ``processes`` (default: one per core) processes at once.

    Returns (the slowest process's mean CPU seconds per slice, smallest CPU / wall share)."""
    n = processes or os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", PROBE_CODE], stdout=subprocess.PIPE, text=True) for _ in range(n)]
    cpus, shares = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=PROBE_TIMEOUT_S)
            cpu, wall = (float(v) for v in out.split())
            cpus.append(cpu)
            shares.append(min(1.0, cpu / wall) if wall > 0 else 1.0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
    return max(cpus), min(shares)


def read_host(
    when: str,
    probe: Callable[[], tuple[float, float]] = cpu_probe,
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
    stage_probe: Callable[[], float] | None = None,
    model_probe: Callable[[], float] | None = None,
    shaped_probe: Callable[[], float] | None = None,
) -> HostReading:
    wall, share = probe()
    step = float(stage_probe()) if stage_probe is not None else None
    whole = float(model_probe()) if model_probe is not None else None
    shaped = float(shaped_probe()) if shaped_probe is not None else None
    return HostReading(when, float(loadavg()[0]), float(wall), float(share), step, whole, shaped)


@dataclass
class HostGuard:
    """Readings around each engine repeat and the judgement over them."""

    mode: GuardMode = "flag"
    max_drift: float = DEFAULT_MAX_DRIFT
    min_core_share: float = DEFAULT_MIN_CORE_SHARE
    probe: Callable[[], tuple[float, float]] = cpu_probe
    loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg
    readings: list[HostReading] = field(default_factory=list)
    reference_s: float | None = None  # the probe when the profile was calibrated (meta.json host_probe_s)
    stage_probe: Callable[[], float] | None = None  # the engine-step probe (engine/probe.py), if read
    stage_reference_s: float | None = None  # it at calibration (meta.json host_stage_probe_s)
    model_probe: Callable[[], float] | None = None  # the validated model's whole step (engine/probe.py), if read
    model_reference_s: float | None = None  # it at calibration (meta.json host_model_probe_s, same kind)
    model_price_s: float | None = None  # what the profile charges for its step (engine/probe.py::model_price)
    shaped_probe: Callable[[], float] | None = None  # the whole model at the predicted run's decode step, if read
    shaped_step: tuple[int, int] | None = None  # that step: (requests, context tokens)
    shaped_price_s: float | None = None  # what the profile charges for it
    sampler: Callable[[], Any] | None = None  # makes an in-run sampler (engine/host_sampler.py), if read
    sampler_reference_s: float | None = None  # its mean through calibration (meta.json host_sampler_s)
    sampled_s: list[float] = field(default_factory=list)  # its mean through each engine repeat
    cpu: dict[str, Any] | None = None  # this host's CPU (cpu_identity), if read
    cpu_reference: dict[str, Any] | None = None  # the CPU the profile was calibrated on (meta.json host_cpu)

    def __post_init__(self) -> None:
        if self.mode not in ("flag", "refuse", "off"):
            raise PPSimError(f"--host-guard: {self.mode!r} is not one of flag, refuse, off")
        if not 0 < self.max_drift <= MAX_DRIFT:
            raise PPSimError(
                f"--host-max-drift: {self.max_drift:g} must be in (0, {MAX_DRIFT:g}] (a fraction, e.g. 0.15)"
            )
        if not 0 < self.min_core_share <= 1:
            raise PPSimError(f"--host-min-core-share: {self.min_core_share} must be in (0, 1]")
        if self.mode == "off":
            self._no_limits_when_off()

    def _no_limits_when_off(self) -> None:
        """A limit away from its default with the guard off would judge nothing: refused, not ignored."""
        for flag, value, default in (
            ("--host-max-drift", self.max_drift, DEFAULT_MAX_DRIFT),
            ("--host-min-core-share", self.min_core_share, DEFAULT_MIN_CORE_SHARE),
        ):
            if value != default:
                raise PPSimError(
                    f"{flag}: the host guard is off (--host-guard off), so no reading is judged against "
                    "the limit; drop it, or use --host-guard flag or refuse"
                )

    def read(self, when: str) -> None:
        """Take one reading; in ``refuse`` mode raise at once if the host is already off."""
        if self.mode == "off":
            return
        self.readings.append(
            read_host(when, self.probe, self.loadavg, self.stage_probe, self.model_probe, self.shaped_probe)
        )
        problem = self.problem()
        if problem and self.mode == "refuse":
            raise PPSimError(
                f"host guard: {problem}; validation refused (--host-guard refuse); "
                "rerun on a quiet host or pass --host-guard flag"
            )

    @contextlib.contextmanager
    def during(self) -> Iterator[None]:
        """Around one engine repeat: the in-run sampler beside it, its mean kept in ``sampled_s``. A repeat
        over before the sampler's first sample (a short run on a loaded host) adds none: no mean to keep."""
        if self.mode == "off" or self.sampler is None:
            yield
            return
        with self.sampler() as sampler:
            yield
        got = sampler.stats()
        if got["n"]:
            self.sampled_s.append(float(got["mean_s"]))

    def sampler_ratio(self) -> float | None:
        """The in-run sampler's mean over the repeats over its mean through calibration: 1.08 = the host
        ran 8% slower during the engine runs than while the profile was measured. None: not read."""
        if not self.sampled_s or not self.sampler_reference_s:
            return None
        return sum(self.sampled_s) / len(self.sampled_s) / self.sampler_reference_s

    def drift(self) -> float:
        walls = [r.probe_s for r in self.readings]
        return max(walls) / min(walls) - 1.0 if walls and min(walls) > 0 else 0.0

    def vs_reference(self) -> float | None:
        """Mean probe over the readings against the calibration's: +0.2 = the host is 20% slower now."""
        if not self.readings or not self.reference_s:
            return None
        return sum(r.probe_s for r in self.readings) / len(self.readings) / self.reference_s - 1.0

    def stage_vs_reference(self) -> float | None:
        """Mean engine-step probe over the readings against the calibration's: +0.2 = 20% slower now."""
        return _vs([r.stage_probe_s for r in self.readings], self.stage_reference_s)

    def model_vs_reference(self) -> float | None:
        """Mean whole-model probe over the readings against the calibration's: +0.2 = 20% slower now."""
        return _vs([r.model_probe_s for r in self.readings], self.model_reference_s)

    def model_vs_price(self) -> float | None:
        """Mean whole-model probe over the readings against the profile's price of the same step: +0.2 =
        the host runs this model 20% slower than its profile charges."""
        return _vs([r.model_probe_s for r in self.readings], self.model_price_s)

    def probe_factor(self) -> float | None:
        """The whole-model probe read before the repeats (``before i``) over the profile's price of its step:
        1.10 = the host ran this model 10% slower than its profile charges just before the runs. None: not
        read or not priced."""
        return self._before_over("model_probe_s", self.model_price_s)

    def shaped_factor(self) -> float | None:
        """:meth:`probe_factor` of the shaped probe: the whole model at the predicted run's own decode step
        (``shaped_step``) read before the repeats over the profile's price of that step. None: not read."""
        return None if self.shaped_step is None else self._before_over("shaped_probe_s", self.shaped_price_s)

    def _before_over(self, key: str, price: float | None) -> float | None:
        """The mean of the readings ``key`` taken before the repeats over ``price`` (None: none, or no price)."""
        vs = _vs([getattr(r, key) for r in self.readings if r.when.startswith("before")], price)
        return None if vs is None else 1.0 + vs

    def problem(self) -> str | None:
        """What is wrong with the host, in a phrase; None when the readings are within bounds."""
        if self.mode != "off" and cpu_differs(self.cpu_reference, self.cpu):
            return (
                f"the profile was calibrated on another CPU ({cpu_text(self.cpu_reference or {})}; this host: "
                f"{cpu_text(self.cpu or {})}): its costs are of that host; calibrate on this one"
            )
        if not self.readings:
            return None
        worst = min(self.readings, key=lambda r: r.core_share)
        if worst.core_share < self.min_core_share:
            return (
                f"the CPU probe got {worst.core_share:.0%} of a core at '{worst.when}' (load {worst.load1:.1f}; "
                f"limit {self.min_core_share:.0%}): another process shares the cores"
            )
        priced = self.model_vs_price()
        for what, step, than in (
            ("model's whole step", priced, "its profile charges"),
            (
                "model's whole step",
                None if priced is not None else self.model_vs_reference(),
                "when the profile was calibrated",
            ),
            ("engine's own step", self.stage_vs_reference(), "when the profile was calibrated"),
        ):
            if step is not None and abs(step) > self.max_drift:
                return (
                    f"the {what} runs {abs(step):.0%} {'slower' if step > 0 else 'faster'} than {than} "
                    f"(limit {self.max_drift:.0%}): recalibrate, or wait for a steadier host"
                )
        ref = self.vs_reference()
        if ref is not None:  # judged against the host the profile was calibrated on
            if abs(ref) > self.max_drift:
                return (
                    f"the host runs the CPU probe {abs(ref):.0%} {'slower' if ref > 0 else 'faster'} than when "
                    f"the profile was calibrated (limit {self.max_drift:.0%}): recalibrate, or wait for a steadier host"
                )
        elif self.drift() > self.max_drift:  # a profile without a probe: judged between the readings
            return f"the CPU probe's time drifted {self.drift():.0%} over the run (limit {self.max_drift:.0%})"
        return None

    def to_dict(self) -> dict[str, Any]:
        problem = self.problem()
        return {
            "mode": self.mode,
            "ok": problem is None,
            "problem": problem,
            "max_drift": self.max_drift,
            "min_core_share": self.min_core_share,
            "probe_drift": self.drift(),
            "reference_probe_s": self.reference_s,
            "vs_reference": self.vs_reference(),
            "stage_reference_s": self.stage_reference_s,
            "stage_vs_reference": self.stage_vs_reference(),
            "model_reference_s": self.model_reference_s,
            "model_vs_reference": self.model_vs_reference(),
            "model_price_s": self.model_price_s,
            "model_vs_price": self.model_vs_price(),
            "probe_factor": self.probe_factor(),
            "shaped_step": list(self.shaped_step) if self.shaped_step else None,
            "shaped_price_s": self.shaped_price_s,
            "shaped_factor": self.shaped_factor(),
            "sampler_reference_s": self.sampler_reference_s,
            "sampler_s": list(self.sampled_s),
            "sampler_ratio": self.sampler_ratio(),
            "cpu_count": os.cpu_count(),
            "cpu": self.cpu,
            "cpu_reference": self.cpu_reference,
            "cpu_differs": cpu_differs(self.cpu_reference, self.cpu),
            "readings": [asdict(r) for r in self.readings],
        }


def _vs(readings: list[float | None], reference: float | None) -> float | None:
    got = [r for r in readings if r is not None]
    if not got or not reference:
        return None
    return sum(got) / len(got) / reference - 1.0


def host_line(h: dict[str, Any]) -> str:
    """One line for the report."""
    if h.get("mode") != "off" and not h.get("ok", True):
        if h.get("cpu_differs"):  # not contention: the profile is another machine's
            return f"host guard: FLAGGED, {h['problem']}"
        return f"host guard: FLAGGED, {h['problem']}: engine figures include contention the simulator does not model"
    if h.get("mode") == "off" or not h.get("readings"):
        return "host guard: off (host not measured)"
    loads = [r["load1"] for r in h["readings"]]
    share = min(r["core_share"] for r in h["readings"])
    ref, step = h.get("vs_reference"), h.get("stage_vs_reference")
    vs = "" if ref is None else f", {ref:+.0%} vs calibration"
    vs += "" if step is None else f", engine step {step:+.0%} vs calibration"
    whole, priced = h.get("model_vs_reference"), h.get("model_vs_price")
    vs += "" if whole is None else f", whole model {whole:+.0%} vs calibration"
    vs += "" if priced is None else f", whole model {priced:+.0%} vs its profile's price"
    ratio = h.get("sampler_ratio")
    vs += "" if ratio is None else f", in-run sampler x{ratio:.3f} its calibration time"
    return (
        f"host guard: ok (CPU probe drift {h['probe_drift']:.0%}{vs}, core share >= {share:.0%}, "
        f"load {min(loads):.1f}-{max(loads):.1f})"
    )
