# SPDX-License-Identifier: Apache-2.0
"""evidence/bench_timing.py: spread of timings, ratios, repetitions, the deadline watchdog, the
atomic JSON writer and the CUDA-graph helpers' order of calls (CPU: a stand-in for torch.cuda)."""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_timing as bt  # noqa: E402


def test_spread_of_known_samples() -> None:
    s = bt.spread([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 5.0 and s["n"] == 5
    assert s["p10"] == pytest.approx(1.4) and s["p90"] == pytest.approx(4.6)
    assert s["rel_spread"] == pytest.approx((4.6 - 1.4) / 3.0)
    assert bt.spread([2.0])["rel_spread"] == 0.0
    with pytest.raises(ValueError):
        bt.spread([])


def test_quantile_interpolates_and_refuses_bad_q() -> None:
    assert bt.quantile([0.0, 10.0], 0.25) == 2.5
    with pytest.raises(ValueError):
        bt.quantile([1.0], 1.5)


def test_ratio_is_none_without_a_positive_denominator() -> None:
    assert bt.ratio(3.0, 2.0) == 1.5
    assert bt.ratio(None, 2.0) is None
    assert bt.ratio(1.0, 0.0) is None
    assert bt.ratio(1.0, None) is None


def test_repetitions_fill_the_target_within_bounds() -> None:
    assert bt.repetitions(2.0, 100.0, 3, 30) == 30
    assert bt.repetitions(10.0, 100.0, 3, 30) == 10
    assert bt.repetitions(500.0, 100.0, 3, 30) == 3
    assert bt.repetitions(0.0, 100.0, 3, 30) == 30
    with pytest.raises(ValueError):
        bt.repetitions(1.0, 1.0, 5, 4)


def test_deadline_counts_down_on_its_clock() -> None:
    now = [100.0]
    d = bt.Deadline(10.0, clock=lambda: now[0])
    assert d.left() == 10.0 and not d.expired()
    now[0] = 105.0
    assert d.allows(4.0, margin_s=1.0) and not d.allows(4.5, margin_s=1.0)
    now[0] = 110.0
    assert d.expired()
    with pytest.raises(ValueError):
        bt.Deadline(0.0)


def test_watchdog_fires_once_after_the_deadline_and_not_when_disarmed() -> None:
    fired = threading.Event()
    d = bt.Deadline(0.05)
    d.arm(fired.set, poll_s=0.01)
    assert fired.wait(2.0)

    quiet = threading.Event()
    d2 = bt.Deadline(0.3)
    d2.arm(quiet.set, poll_s=0.01)
    d2.disarm()
    assert not quiet.wait(0.5)


class _FakeCuda:
    """The torch.cuda calls the graph helpers make, logged; a graph replays what it captured,
    and each event pair measures ``replay_ms`` per replay."""

    def __init__(self, replay_ms: float) -> None:
        self.log: list[str] = []
        self.replay_ms = replay_ms
        self.capturing: list[str] | None = None
        cuda = self

        class Stream:
            def wait_stream(self, other: object) -> None:
                cuda.log.append("wait_stream")

        class Graph:
            def __init__(self) -> None:
                self.calls: list[str] = []

            def replay(self) -> None:
                cuda.log.append(f"replay({','.join(self.calls)})")

        class Capture:
            def __init__(self, graph: Graph) -> None:
                self.graph = graph

            def __enter__(self) -> None:
                cuda.capturing = self.graph.calls

            def __exit__(self, *exc: object) -> None:
                cuda.capturing = None

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                pass

            def record(self) -> None:
                pass

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: object) -> float:
                return cuda.replay_ms

        self.Stream, self.CUDAGraph, self.Event = Stream, Graph, Event
        self.graph = Capture
        self.stream = lambda s: contextlib.nullcontext()
        self.current_stream = Stream
        self.synchronize = lambda: self.log.append("synchronize")

    def call(self, name: str):
        def run() -> None:
            if self.capturing is not None:
                self.capturing.append(name)
            else:
                self.log.append(name)

        return run


def test_graph_us_warms_each_call_captures_them_and_times_the_median_replay(monkeypatch) -> None:
    cuda = _FakeCuda(replay_ms=0.5)
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].cuda = cuda
    got = bt.graph_us([cuda.call("a"), cuda.call("b")], reps=3)
    assert got == 0.5 * 1e3 / 2  # microseconds per call
    warm = cuda.log.index("synchronize")
    assert cuda.log[:warm] == ["wait_stream", "a", "b", "wait_stream"]
    assert cuda.log[warm + 1 :] == ["replay(a,b)", "synchronize"] + ["replay(a,b)"] * 3


def test_capture_graph_warms_up_one_call_and_captures_it_repeated(monkeypatch) -> None:
    cuda = _FakeCuda(replay_ms=1.0)
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].cuda = cuda
    graph = bt.capture_graph(cuda.call("f"), calls=3, warmup=2)
    assert cuda.log == ["wait_stream", "f", "f", "wait_stream", "synchronize"]
    assert graph.calls == ["f", "f", "f"]
