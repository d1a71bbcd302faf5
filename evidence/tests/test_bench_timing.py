# SPDX-License-Identifier: Apache-2.0
"""evidence/bench_timing.py: spread of timings, ratios, repetitions, the deadline watchdog and
the atomic JSON writer (CPU, no torch)."""

from __future__ import annotations

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
