# SPDX-License-Identifier: Apache-2.0
"""The arithmetic of the adaptive-depth benchmark (bench_mtp_depth.py), with no torch and no
vLLM: the interleaved mode order, the engine-log readings, the per-workload summary with its
noise, the step-time curve and the goals.

Noise: every repeat measures every mode of a workload back to back in one engine, so the ratio
of two modes is taken *within* a repeat (paired) and summarised over repeats by its median and
its range. A goal counts as met beyond the noise only when it holds for the smallest paired
ratio (at least) or the largest (at most), not just for the median.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any

import mtp_acceptance
from bench_timing import spread

FIXED_MODES = ("k1", "k2", "k3", "k4", "k5")
MODES = (*FIXED_MODES, "adaptive")
LADDER = (2, 4, 5)
LADDER_MODES = tuple(f"k{d}" for d in LADDER)
# adaptive / best fixed depth: at least this on a single-content workload (issue 36)
SINGLE_CONTENT_FLOOR = 0.97
SINGLE_CONTENT = ("prose", "code")
MIXED_CONTENT = ("stream", "mixed_batch")


def williams_orders(n: int) -> list[list[int]]:
    """Rows of a Williams design for ``n`` treatments: every treatment appears once per row
    and in every position once over ``n`` rows (twice as many rows for odd ``n``), and each
    treatment follows every other one equally often (carry-over balanced)."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    first = [0]
    lo, hi = 1, n - 1
    take_lo = True
    while len(first) < n:
        first.append(lo if take_lo else hi)
        if take_lo:
            lo += 1
        else:
            hi -= 1
        take_lo = not take_lo
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return rows


def mode_order(repeat: int, workload_index: int, modes: Sequence[str] = MODES) -> list[str]:
    """The order the modes run in for one repeat of one workload."""
    rows = williams_orders(len(modes))
    return [modes[i] for i in rows[(repeat + workload_index) % len(rows)]]


_LOG_PATTERNS = {
    "graph_capture_gib": re.compile(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB"),
    "graph_pool_gib": re.compile(r"CUDA graph pool memory: ([\d.]+) GiB \(actual\)"),
    "graph_pool_estimate_gib": re.compile(
        r"CUDA graph pool memory: [\d.]+ GiB \(actual\), "
        r"([\d.]+) GiB \(estimated\)"
    ),
    "model_gib": re.compile(r"Model loading took ([\d.]+) GiB memory"),
    "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
}


def read_engine_log(text: str) -> dict[str, float | None]:
    """The memory figures one engine logged (the last of each; None where absent)."""
    out: dict[str, float | None] = {}
    for key, pattern in _LOG_PATTERNS.items():
        found = pattern.findall(text)
        out[key] = float(found[-1]) if found else None
    return out


def tokens_per_s(run: dict[str, Any]) -> float:
    return run["tokens"] / run["wall_s"]


def summarize(runs: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    """One workload's figures from its runs (``mode``, ``repeat``, ``tokens``, ``wall_s``,
    ``exact``): tok/s per mode, the best fixed depth (of 1-5 and of the ladder's), adaptive
    over each fixed depth as paired ratios, and whether its goal is met beyond the noise."""
    by_mode: dict[str, dict[int, float]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], {})[run["repeat"]] = tokens_per_s(run)
    per_mode = {m: spread(list(v.values())) for m, v in by_mode.items()}
    out: dict[str, Any] = {
        "workload": workload,
        "tokens_per_s": per_mode,
        "exact": all(run["exact"] for run in runs),
    }
    fixed = [m for m in FIXED_MODES if m in per_mode]
    if "adaptive" not in by_mode or not fixed:
        out["goal"] = None
        return out
    best = max(fixed, key=lambda m: per_mode[m]["median"])
    ladder = [m for m in LADDER_MODES if m in per_mode]
    best_ladder = max(ladder, key=lambda m: per_mode[m]["median"]) if ladder else None
    ratios = {}
    for m in fixed:
        paired = [
            by_mode["adaptive"][r] / by_mode[m][r] for r in by_mode["adaptive"] if r in by_mode[m]
        ]
        if paired:
            ratios[m] = spread(paired)
    out |= {
        "best_fixed": best,
        "best_ladder_depth": best_ladder,
        "adaptive_over_fixed": ratios,
        "adaptive_over_best_fixed": ratios.get(best, {}).get("median"),
        "noise": noise(by_mode[best]) if best in by_mode else None,
        "goal": goal(workload, ratios, best),
    }
    return out


def noise(samples_by_repeat: dict[int, float]) -> float:
    """The noise of one mode: its relative range over repeats, (max - min) / median."""
    s = spread(list(samples_by_repeat.values()))
    return (s["max"] - s["min"]) / s["median"] if s["median"] else 0.0


def goal(workload: str, ratios: dict[str, dict[str, Any]], best: str) -> dict[str, Any] | None:
    """Issue 36's goal for a workload: adaptive >= 0.97 x the best fixed depth on a
    single-content workload; adaptive > every fixed depth on a mixed one. ``met`` compares
    medians; ``beyond_noise`` asks it of every repeat's paired ratio."""
    if workload in SINGLE_CONTENT and best in ratios:
        r = ratios[best]
        return {
            "rule": f"adaptive >= {SINGLE_CONTENT_FLOOR} x best fixed ({best})",
            "met": r["median"] >= SINGLE_CONTENT_FLOOR,
            "beyond_noise": r["min"] >= SINGLE_CONTENT_FLOOR,
        }
    if workload in MIXED_CONTENT and ratios:
        return {
            "rule": "adaptive > every fixed depth",
            "met": all(r["median"] > 1.0 for r in ratios.values()),
            "beyond_noise": all(r["min"] > 1.0 for r in ratios.values()),
        }
    return None


def step_curve(runs: list[dict[str, Any]], nospec: list[dict[str, Any]]) -> dict[str, Any]:
    """t(q): the median engine step time at each fixed depth d (q = d + 1 query tokens per
    request: the verification of q tokens and d draft steps), and at q = 1 from the engine
    without speculation; each also as a ratio to t(1) when that was measured."""
    per_q: dict[int, list[float]] = {}
    for run in runs:
        if run["mode"] in FIXED_MODES and run["steps"]:
            per_q.setdefault(int(run["mode"][1:]) + 1, []).append(run["wall_s"] / run["steps"])
    for run in nospec:
        if run["steps"]:
            per_q.setdefault(1, []).append(run["wall_s"] / run["steps"])
    ms = {q: 1e3 * statistics.median(v) for q, v in sorted(per_q.items())}
    t1 = ms.get(1)
    return {
        "step_ms": {str(q): round(v, 4) for q, v in ms.items()},
        "over_t1": {str(q): round(v / t1, 4) for q, v in ms.items()} if t1 else None,
    }


def depth_use(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode, what its steps did: the engine steps of a run, the steps at each depth, the
    tokens per step, and the median acceptance per draft position; ``repeats_agree`` says
    whether every repeat took the same steps (the tables make a run deterministic)."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("steps"):
            by_mode.setdefault(run["mode"], []).append(run)
    out: dict[str, dict[str, Any]] = {}
    for mode, rs in by_mode.items():
        first = rs[0]
        positions = [r["acceptance_per_position"] for r in rs if r.get("acceptance_per_position")]
        out[mode] = {
            "steps": first["steps"],
            "steps_per_depth": first.get("steps_per_depth") or {},
            "tokens_per_step": round(first["tokens"] / first["steps"], 4),
            "acceptance_per_position": [
                round(statistics.median(p), 4) for p in zip(*positions, strict=True)
            ]
            if positions
            else None,
            "repeats_agree": all(
                (r["steps"], r.get("steps_per_depth"))
                == (first["steps"], first.get("steps_per_depth"))
                for r in rs
            ),
        }
    return out


def step_time_model(
    use: dict[str, dict[str, Any]], step_ms: dict[str, float], measured_ms: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """Where a mode's time goes: its steps at each depth d times the step time t(d + 1) of the
    curve, summed (``model_ms``), beside its measured median wall time (``measured_ms``).
    Built from the same workload's fixed-depth runs, the curve reproduces each fixed depth by
    construction; for the adaptive mode, whose steps mix depths, the model is a prediction, and
    ``model_over_measured`` near 1 says its time is the steps it took at each depth. A mode with
    a depth the curve lacks gets no model."""
    out: dict[str, dict[str, Any]] = {}
    for mode, u in use.items():
        per_depth = u["steps_per_depth"]
        if not per_depth or any(str(int(d) + 1) not in step_ms for d in per_depth):
            continue
        ms = {d: n * step_ms[str(int(d) + 1)] for d, n in per_depth.items()}
        total = sum(ms.values())
        out[mode] = {
            "model_ms": round(total, 2),
            "model_ms_per_depth": {d: round(v, 2) for d, v in sorted(ms.items())},
            "measured_ms": round(measured_ms[mode], 2) if mode in measured_ms else None,
            "model_over_measured": round(total / measured_ms[mode], 4)
            if measured_ms.get(mode)
            else None,
        }
    return out


def acceptance_per_position(verifications: Sequence[Sequence[int]], depth: int) -> list[float]:
    """Unconditional acceptance per draft position over ``(drafted, accepted)`` pairs: the
    share of verifications that drafted position p whose draft at p was accepted."""
    steps = (mtp_acceptance.Step(n, a) for n, a in verifications)
    return [round(r, 4) for r in mtp_acceptance.acceptance(steps, depth)["unconditional"]]
