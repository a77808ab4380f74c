"""SGLang's dynamic chunk sizes for chunked pipeline prefill, as pure functions.

Follows ``python/sglang/srt/managers/scheduler_pp_mixin.py``:

- ``profile_and_init_predictor``: PP rank 0 times 128 single-request prefills of lengths
  ``int(1.25 C - i (1.25 C // 128))`` (no prefix) and ``ChunkSizePredictor.fit`` fits
  f(l) = a l^2 + b l + c by least squares, dropping the first (warm-up) sample; fewer than 8
  samples or a <= 0 is an error, a negative b is clamped to 0.
- ``ChunkSizePredictor.set_target_latency``: T = f(C) - f(0) for the initial chunk C
  (``--chunked-prefill-size``).
- ``ChunkSizePredictor.predict_next_chunk_size``: with L tokens already prefilled, solve
  f(L + x) - f(L) = T, i.e. a x^2 + (2 a L + b) x - T = 0; smooth s = C + sigma (x - C)
  (``SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR``, default 0.75); floor at C // 4; align down to a
  multiple of max(page_size, 64) (at least one alignment unit); cap by ``max_prefill_tokens`` and
  ``context_len - L - 100``; align again; a result below one alignment unit means "no
  prediction" and the scheduler keeps C.
- ``Scheduler._get_new_batch_prefill_raw`` uses the prediction only for a request that is already
  being chunked (``history_len = len(chunked_req.prefix_indices)``), so the first chunk is C; the
  ``PrefillAdder`` then takes ``min(budget, remaining prompt)`` tokens.

The refined form t(L, x) = c + gamma L + b x + a (2 L x + x^2) (time of an x-token chunk after an
L-token prefix) is ppsim's extension: it adds per-chunk prefix work (reading the prefix KV), so
t(L, x) = t(0, C) gives a x^2 + (2 a L + b) x - (T - gamma L) = 0; gamma = 0 is SGLang's form.
Units of a, b, c cancel in the chunk sizes (SGLang fits milliseconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppsim.errors import PPSimError

MIN_FIT_SAMPLES = 8  # ChunkSizePredictor.fit: "Need at least 8 samples"
PROFILE_SAMPLES = 128  # profile_and_init_predictor: range(128)
MIN_ALIGNMENT = 64  # predict_next_chunk_size: "minimum alignment size is 64"
CONTEXT_MARGIN = 100  # predict_next_chunk_size: "Leave 100 tokens margin"
DEFAULT_SMOOTH_FACTOR = 0.75  # environ.py: SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR = EnvFloat(0.75)


@dataclass(frozen=True, slots=True)
class ChunkModel:
    """Fitted prefill cost of one stage: f(l) = a l^2 + b l + c, plus gamma L in the refined form."""

    a: float
    b: float
    c: float
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and self.a >= 0):
            raise PPSimError(
                f"chunking: quadratic coefficient a={self.a:.3g} must be >= 0 "
                "(attention is quadratic in length); check the samples or --coefficients"
            )
        if not (math.isfinite(self.b) and self.b >= 0):
            raise PPSimError(f"chunking: linear coefficient b={self.b:.3g} must be >= 0")

    def f(self, length: float) -> float:
        return self.a * length * length + self.b * length + self.c

    def chunk_time(self, prefix: float, x: float) -> float:
        """Refined t(L, x): an x-token chunk after an L-token prefix."""
        return self.c + self.gamma * prefix + self.b * x + self.a * (2 * prefix * x + x * x)

    def target(self, initial_chunk: int) -> float:
        """T = f(C) - f(0)."""
        t = self.f(float(initial_chunk)) - self.f(0.0)
        if t <= 0:
            raise PPSimError(f"chunking: target time f(C) - f(0) = {t:.3g} is not positive")
        return t


def profile_lengths(initial_chunk: int, n: int = PROFILE_SAMPLES) -> list[int]:
    """The prefill lengths SGLang times at start-up (longest first)."""
    top = initial_chunk * 1.25
    step = top // n
    out = []
    for i in range(n):
        size = int(top - i * step)
        if size <= 0:
            break
        out.append(size)
    return out


def fit_quadratic(lengths: Sequence[float], times: Sequence[float], skip_first: bool = True) -> ChunkModel:
    """Least-squares f(l) = a l^2 + b l + c (``ChunkSizePredictor.fit``)."""
    if len(lengths) != len(times):
        raise PPSimError("chunking: lengths and times must have the same number of samples")
    start = 1 if skip_first else 0
    L = np.asarray(lengths[start:], dtype=np.float64)
    T = np.asarray(times[start:], dtype=np.float64)
    if len(L) < MIN_FIT_SAMPLES:
        raise PPSimError(
            f"chunking: {len(L)} samples are too few for a quadratic fit "
            f"(need >= {MIN_FIT_SAMPLES} after the warm-up sample)"
        )
    X = np.column_stack([L * L, L, np.ones_like(L)])
    (a, b, c), *_ = np.linalg.lstsq(X, T, rcond=None)
    if a <= 0 and abs(a) * L.max() ** 2 <= 1e-9 * np.abs(T).max():
        a = 0.0  # a linear cost (the quadratic term is fitting noise): the a -> 0 limit keeps chunks at C
    elif not a > 0:  # ChunkSizePredictor.fit raises the same way (SGLang then fails to start)
        raise PPSimError(
            f"chunking: fitted a={a:.3g} is not positive (SGLang's ChunkSizePredictor.fit refuses "
            "it): stage 0's prefill time does not grow quadratically over these lengths; "
            "use a larger --chunked-prefill-size or give --coefficients"
        )
    return ChunkModel(float(a), max(0.0, float(b)), float(c))


def fit_refined(prefixes: Sequence[float], chunks: Sequence[float], times: Sequence[float]) -> ChunkModel:
    """Least-squares t(L, x) = c + gamma L + b x + a (2 L x + x^2) over (prefix, chunk, time) samples."""
    if not len(prefixes) == len(chunks) == len(times):
        raise PPSimError("chunking: prefixes, chunks and times must have the same number of samples")
    if len(times) < MIN_FIT_SAMPLES:
        raise PPSimError(f"chunking: {len(times)} samples are too few (need >= {MIN_FIT_SAMPLES})")
    Lp = np.asarray(prefixes, dtype=np.float64)
    x = np.asarray(chunks, dtype=np.float64)
    X = np.column_stack([2 * Lp * x + x * x, x, Lp, np.ones_like(x)])
    T = np.asarray(times, dtype=np.float64)
    (a, b, g, c), *_ = np.linalg.lstsq(X, T, rcond=None)
    if a <= 0 and abs(a) * float(X[:, 0].max()) <= 1e-9 * np.abs(T).max():
        a = 0.0  # a linear cost: the quadratic term is fitting noise
    elif not a > 0:
        raise PPSimError(
            f"chunking: fitted a={a:.3g} of the refined form is not positive: the prefill time does "
            "not grow quadratically over these chunks; use a larger --chunked-prefill-size or give "
            "--coefficients"
        )
    return ChunkModel(float(a), max(0.0, float(b)), float(c), max(0.0, float(g)))


def alignment(page_size: int) -> int:
    return max(page_size, MIN_ALIGNMENT)


def solve_chunk(model: ChunkModel, prefix: int, initial_chunk: int) -> float | None:
    """Unsmoothed x with t(L, x) = t(0, C); None when there is no positive root."""
    A = model.a
    B = 2 * model.a * prefix + model.b
    T = model.target(initial_chunk) - model.gamma * prefix
    disc = B * B + 4 * A * T
    if disc < 0:
        return None
    # (-B + sqrt(disc)) / 2A, written without the cancellation that loses it when A L << B
    # (a nearly linear cost: the root tends to T / B)
    root = math.sqrt(disc)
    if B + root <= 0:
        return None
    x = 2 * T / (B + root) if B >= 0 else (-B + root) / (2 * A)
    return x if x > 0 else None


def predict_next_chunk_size(
    model: ChunkModel,
    prefix: int,
    initial_chunk: int,
    smooth_factor: float = DEFAULT_SMOOTH_FACTOR,
    page_size: int = 1,
    max_chunk: int | None = None,
    context_len: int | None = None,
) -> int | None:
    """SGLang's next chunk size after ``prefix`` tokens; None = keep the initial chunk size."""
    x = solve_chunk(model, prefix, initial_chunk)
    if x is None:
        return None
    smoothed = initial_chunk + smooth_factor * (x - initial_chunk)
    size = max(int(smoothed), initial_chunk // 4)
    align = alignment(page_size)
    size = max(align, size // align * align)
    allowed = math.inf if context_len is None else context_len - prefix - CONTEXT_MARGIN
    if max_chunk is not None:
        allowed = min(allowed, max_chunk)
    size = int(min(size, allowed)) // align * align if allowed < math.inf else size
    return size if size >= align else None


def chunk_plan(
    prompt_len: int,
    initial_chunk: int,
    model: ChunkModel | None,
    smooth_factor: float = DEFAULT_SMOOTH_FACTOR,
    page_size: int = 1,
    max_chunk: int | None = None,
) -> list[int]:
    """Chunk sizes of one prompt scheduled alone; ``model=None`` gives fixed chunks of C."""
    if prompt_len < 1 or initial_chunk < 1:
        raise PPSimError("chunking: prompt length and initial chunk size must be >= 1")
    fn = chunk_budget_fn(initial_chunk, model, smooth_factor, page_size, max_chunk)
    sizes: list[int] = []
    done = 0
    while done < prompt_len:
        n = min(fn(done), prompt_len - done)
        if n < prompt_len - done and page_size > 1:  # whole pages, at least one, never past the prompt
            n = min(max(page_size, n // page_size * page_size), prompt_len - done)
        sizes.append(n)
        done += n
    return sizes


def chunk_budget_fn(
    initial_chunk: int,
    model: ChunkModel | None,
    smooth_factor: float = DEFAULT_SMOOTH_FACTOR,
    page_size: int = 1,
    max_chunk: int | None = None,
) -> Callable[[int], int]:
    """prefix length -> the prefill token budget of the batch that continues that request."""
    cap = initial_chunk if max_chunk is None else min(initial_chunk, max_chunk)
    if model is None:
        return lambda prefix: cap

    def budget(prefix: int) -> int:
        if prefix <= 0:
            return cap
        size = predict_next_chunk_size(model, prefix, initial_chunk, smooth_factor, page_size, max_chunk)
        return cap if size is None else size

    return budget
