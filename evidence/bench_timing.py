# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the GPU benchmarks that must stop on time and leave a result behind:
the spread of repeated timings, a hard wall-clock deadline with a watchdog, CUDA-event timing
and CUDA-graph capture. Their result files go through ``provenance.write_json_atomic``.

No torch at import: the CUDA helpers import it when called; the rest is tested on a CPU, the
CUDA helpers' order of calls too, with a stand-in torch (evidence/tests/test_bench_timing.py).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of an ascending, non-empty sequence."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] * (1.0 - frac) + sorted_values[hi] * frac


def spread(samples: Sequence[float]) -> dict[str, float | int]:
    """Median and spread of repeated timings: ``median``, ``p10``, ``p90``, ``min``, ``max``,
    ``n`` and ``rel_spread`` = (p90 - p10) / median (0 when the median is 0)."""
    values = sorted(float(s) for s in samples)
    if not values:
        raise ValueError("spread of no samples")
    med = quantile(values, 0.5)
    p10, p90 = quantile(values, 0.1), quantile(values, 0.9)
    return {
        "median": med,
        "p10": p10,
        "p90": p90,
        "min": values[0],
        "max": values[-1],
        "n": len(values),
        "rel_spread": (p90 - p10) / med if med > 0 else 0.0,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def repetitions(first_ms: float, target_ms: float, lo: int, hi: int) -> int:
    """How many repetitions of a call that took ``first_ms`` spend about ``target_ms``,
    clamped to [lo, hi]."""
    if lo > hi:
        raise ValueError(f"lo {lo} > hi {hi}")
    if not first_ms > 0:
        return hi
    return max(lo, min(hi, int(target_ms / first_ms)))


class Deadline:
    """A hard wall-clock bound: ``left()`` seconds remain of ``seconds`` from construction.

    ``arm(on_expiry)`` starts a daemon watchdog that calls ``on_expiry()`` once the deadline has
    passed (the benchmarks write their partial JSON there and exit), unless ``disarm()`` came
    first. ``clock`` is injectable for tests."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not seconds > 0:
            raise ValueError(f"deadline must be > 0 s, got {seconds}")
        self.seconds = float(seconds)
        self._clock = clock
        self._start = clock()
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None

    def elapsed(self) -> float:
        return self._clock() - self._start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def expired(self) -> bool:
        return self.left() <= 0

    def allows(self, expected_s: float, margin_s: float = 0.0) -> bool:
        """Whether a step expected to take ``expected_s`` ends ``margin_s`` before the
        deadline."""
        return self.left() - margin_s >= expected_s

    def arm(self, on_expiry: Callable[[], None], poll_s: float = 0.2) -> None:
        def watch() -> None:
            while not self._disarmed.wait(min(poll_s, max(self.left(), 0.0) + 1e-3)):
                if self.expired():
                    on_expiry()
                    return

        self._thread = threading.Thread(target=watch, name="deadline", daemon=True)
        self._thread.start()

    def disarm(self) -> None:
        self._disarmed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def event_times(fn: Callable[[], object], iters: int) -> list[float]:
    """Milliseconds of ``iters`` calls of ``fn``, each between two CUDA events, the device
    synchronised before the next call."""
    import torch

    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _capture(
    warmup: Sequence[Callable[[], object]], captured: Sequence[Callable[[], object]]
) -> Any:
    """A CUDA graph of the ``captured`` calls back to back, captured after the ``warmup`` calls
    ran on a side stream (lazy initialisation and allocations done before the capture)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in warmup:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in captured:
            call()
    return graph


def capture_graph(fn: Callable[[], object], calls: int, warmup: int = 3) -> Any:
    """A CUDA graph of ``calls`` back-to-back calls of ``fn``, captured after ``warmup`` calls
    on a side stream (lazy initialisation and allocations done before the capture)."""
    return _capture([fn] * warmup, [fn] * calls)


def graph_us(calls: Sequence[Callable[[], object]], reps: int = 20) -> float:
    """Microseconds per call of ``calls`` captured back to back in one CUDA graph (each run once
    before the capture): the median of ``reps`` replays between CUDA events, after one untimed
    replay, over ``len(calls)``."""
    import torch

    graph = _capture(calls, calls)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) * 1e3 / len(calls)
