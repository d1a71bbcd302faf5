# SPDX-License-Identifier: Apache-2.0
"""Speculative-decoding readings of an in-process engine for the gate worker: the depth each
step drafted (the scheduler's ``num_spec_tokens_to_schedule``) and the spec-decode counters of
vLLM's metrics, as deltas over a pass."""

from __future__ import annotations

from typing import Any


def find_scheduler(llm: Any) -> Any | None:
    """The in-process scheduler (needs VLLM_ENABLE_V1_MULTIPROCESSING=0), if reachable."""
    obj = llm.llm_engine
    for attr in ("engine_core", "engine_core", "scheduler"):
        obj = getattr(obj, attr, None)
        if obj is None:
            return None
    return obj


def record_depths(llm: Any) -> list[int] | None:
    """Wrap Scheduler.schedule to record num_spec_tokens_to_schedule of every non-empty
    step (the depth the drafts of that step use). None if the scheduler is not reachable."""
    scheduler = find_scheduler(llm)
    if scheduler is None:
        return None
    depths: list[int] = []
    schedule = scheduler.schedule

    def wrapped(*a: Any, **kw: Any) -> Any:
        out = schedule(*a, **kw)
        if out.total_num_scheduled_tokens > 0:
            depths.append(out.num_spec_tokens_to_schedule)
        return out

    scheduler.schedule = wrapped
    return depths


def spec_metrics(llm: Any) -> dict[str, Any]:
    """The spec-decode counters of vLLM's metrics (LLM.get_metrics), by name; labelled
    counters (position, depth) as dicts and the per-position vector as a list."""
    snap: dict[str, Any] = {}
    try:
        metrics = llm.get_metrics()
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"error": repr(e)}
    for m in metrics:
        if not m.name.startswith("vllm:spec_decode"):
            continue
        if hasattr(m, "buckets"):  # a histogram: cumulative counts per upper bound "le"
            bucket = snap.setdefault(m.name, {})
            for le, count in m.buckets.items():
                bucket[le] = bucket.get(le, 0) + count
        elif hasattr(m, "values"):
            snap[m.name] = list(m.values)
        elif hasattr(m, "value"):
            label = m.labels.get("position") or m.labels.get("depth")
            if label is None:
                snap[m.name] = snap.get(m.name, 0) + m.value
            else:
                bucket = snap.setdefault(m.name, {})
                bucket[label] = bucket.get(label, 0) + m.value
    return snap


def metrics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before, per counter (metrics are process-wide and cumulative)."""
    out: dict[str, Any] = {}
    for name, val in after.items():
        old = before.get(name)
        if isinstance(val, dict):
            old = old if isinstance(old, dict) else {}
            out[name] = {k: v - old.get(k, 0) for k, v in val.items()}
        elif isinstance(val, list):
            old = old if isinstance(old, list) else []
            out[name] = [v - (old[i] if i < len(old) else 0) for i, v in enumerate(val)]
        elif isinstance(val, (int, float)):
            out[name] = val - (old if isinstance(old, (int, float)) else 0)
        else:
            out[name] = val
    return out
