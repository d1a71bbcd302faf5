# SPDX-License-Identifier: Apache-2.0
"""evidence/mtp_depth_report.py: the adaptive-depth benchmark's order, log readings, noise and
goals (pure Python; one property per test)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mtp_depth_report as rep  # noqa: E402


@given(st.integers(1, 9))
def test_williams_rows_balance_position_and_carry_over(n: int) -> None:
    rows = rep.williams_orders(n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    for pos in range(n):
        counts = [sum(r[pos] == t for r in rows) for t in range(n)]
        assert len(set(counts)) == 1
    follows = {pair: 0 for pair in itertools.permutations(range(n), 2)}
    for r in rows:
        for a, b in itertools.pairwise(r):
            follows[(a, b)] += 1
    assert len(set(follows.values())) <= 1


def test_mode_order_changes_with_repeat_and_workload() -> None:
    orders = {tuple(rep.mode_order(r, 0)) for r in range(6)}
    assert len(orders) == 6
    assert rep.mode_order(1, 0) == rep.mode_order(0, 1)
    assert sorted(rep.mode_order(3, 2)) == sorted(rep.MODES)


# lines as vLLM 0.34.0 prints them (vllm/v1/worker/gpu/model_runner.py, gpu_worker.py)
LOG = """\
INFO 12-07 10:00:01 [model_runner.py:442] Model loading took 32.12 GiB memory and 41.2 seconds
INFO 12-07 10:00:40 [gpu_worker.py:874] Available KV cache memory: 30.5 GiB
INFO 12-07 10:01:10 [model_runner.py:1217] Graph capturing finished in 23 secs, took 0.84 GiB
INFO 12-07 10:01:10 [gpu_worker.py:1191] CUDA graph pool memory: 0.81 GiB (actual), 0.9 GiB \
(estimated), difference: 0.09 GiB (11.1%).
"""


def test_engine_log_memory_figures_are_read() -> None:
    assert rep.read_engine_log(LOG) == {
        "graph_capture_gib": 0.84,
        "graph_pool_gib": 0.81,
        "graph_pool_estimate_gib": 0.9,
        "model_gib": 32.12,
        "kv_cache_gib": 30.5,
    }
    assert set(rep.read_engine_log("no engine here").values()) == {None}


def _runs(tok_s: dict[str, list[float]], workload: str = "prose") -> list[dict]:
    return [
        {"mode": m, "repeat": r, "tokens": 100 * v, "wall_s": 100.0, "exact": True, "steps": 10}
        for m, vs in tok_s.items()
        for r, v in enumerate(vs)
    ]


def test_single_content_goal_beyond_noise_needs_every_repeat() -> None:
    """Paired ratios: adaptive/k2 = 0.99, 0.98, 0.95 -> median 0.98 meets 0.97, the smallest
    (0.95) does not: met, not beyond the noise."""
    s = rep.summarize(
        _runs({"k2": [10, 10, 10], "k5": [5, 5, 5], "adaptive": [9.9, 9.8, 9.5]}), "prose"
    )
    assert s["best_fixed"] == "k2" and s["best_ladder_depth"] == "k2"
    assert s["adaptive_over_best_fixed"] == pytest.approx(0.98)
    assert s["goal"]["met"] is True and s["goal"]["beyond_noise"] is False
    s = rep.summarize(_runs({"k2": [10, 10, 10], "adaptive": [9.9, 9.8, 9.75]}), "prose")
    assert s["goal"]["beyond_noise"] is True


def test_mixed_goal_needs_adaptive_above_every_fixed_depth() -> None:
    runs = _runs({"k2": [10, 11], "k4": [12, 12], "k5": [11, 13], "adaptive": [13, 13.5]})
    s = rep.summarize(runs, "stream")
    # paired ratio over k5: 13/11, 13.5/13 -> both > 1; over k4: 13/12, 13.5/12
    assert s["goal"]["met"] is True and s["goal"]["beyond_noise"] is True
    runs = _runs({"k4": [12, 12], "k5": [11, 14], "adaptive": [13, 13.5]})
    s = rep.summarize(runs, "mixed_batch")
    assert s["goal"]["met"] is True and s["goal"]["beyond_noise"] is False


def test_summary_flags_a_wrong_token() -> None:
    runs = _runs({"k2": [10], "adaptive": [10]})
    runs[0]["exact"] = False
    assert rep.summarize(runs, "code")["exact"] is False


def test_noise_is_the_relative_range_of_the_best_mode() -> None:
    s = rep.summarize(_runs({"k2": [9, 10, 11], "adaptive": [10, 10, 10]}), "prose")
    assert s["noise"] == pytest.approx(0.2)


def test_step_curve_divides_wall_time_by_steps_and_normalises_by_t1() -> None:
    runs = [
        {"mode": "k1", "wall_s": 1.0, "steps": 500},
        {"mode": "k5", "wall_s": 1.0, "steps": 250},
        {"mode": "k5", "wall_s": 1.2, "steps": 250},
        {"mode": "adaptive", "wall_s": 9.0, "steps": 1},
    ]
    nospec = [{"wall_s": 1.0, "steps": 1000}]
    curve = rep.step_curve(runs, nospec)
    assert curve["step_ms"] == {"1": 1.0, "2": 2.0, "6": 4.4}
    assert curve["over_t1"] == {"1": 1.0, "2": 2.0, "6": 4.4}
    assert rep.step_curve(runs, [])["over_t1"] is None


def test_acceptance_per_position_is_unconditional() -> None:
    # three verifications at depth 3: accepted 3, 1, 0
    assert rep.acceptance_per_position([(3, 3), (3, 1), (3, 0)], 5) == [
        0.6667,
        0.3333,
        0.3333,
        0.0,
        0.0,
    ]


def _stepped(mode: str, depths: dict[str, int], wall_s: float, repeat: int = 0) -> dict:
    steps = sum(depths.values())
    return {
        "mode": mode,
        "repeat": repeat,
        "tokens": 3 * steps,
        "wall_s": wall_s,
        "exact": True,
        "steps": steps,
        "steps_per_depth": depths,
        "acceptance_per_position": [0.9, 0.5, 0.0, 0.0, 0.0],
    }


def test_depth_use_reports_steps_per_depth_and_whether_repeats_agree() -> None:
    runs = [_stepped("adaptive", {"2": 4, "5": 3}, 1.0, r) for r in range(3)]
    use = rep.depth_use(runs)["adaptive"]
    assert use["steps"] == 7 and use["steps_per_depth"] == {"2": 4, "5": 3}
    assert use["tokens_per_step"] == 3 and use["repeats_agree"] is True
    runs.append(_stepped("adaptive", {"2": 5, "5": 3}, 1.0, 3))
    assert rep.depth_use(runs)["adaptive"]["repeats_agree"] is False


def test_time_model_is_steps_per_depth_times_the_curve() -> None:
    """t(3) = 3 ms and t(6) = 6 ms from the fixed depths; adaptive's 4 steps at depth 2 and 3
    at depth 5 model as 30 ms: against a measured 30 ms the account is whole (ratio 1), and a
    run that took twice as long shows as 0.5."""
    runs = [
        _stepped("k2", {"2": 10}, 0.030),
        _stepped("k5", {"5": 5}, 0.030),
        _stepped("adaptive", {"2": 4, "5": 3}, 0.030),
    ]
    curve = rep.step_curve(runs, [])["step_ms"]
    model = rep.step_time_model(rep.depth_use(runs), curve, {"adaptive": 30.0, "k2": 30.0})
    assert model["adaptive"]["model_ms"] == pytest.approx(30.0)
    assert model["adaptive"]["model_ms_per_depth"] == {"2": 12.0, "5": 18.0}
    assert model["adaptive"]["model_over_measured"] == pytest.approx(1.0)
    assert model["k2"]["model_over_measured"] == pytest.approx(1.0)
    slow = rep.step_time_model(rep.depth_use(runs), curve, {"adaptive": 60.0})
    assert slow["adaptive"]["model_over_measured"] == pytest.approx(0.5)
    assert "k3" not in rep.step_time_model(
        rep.depth_use([_stepped("k3", {"3": 2}, 0.01)]), curve, {}
    )
