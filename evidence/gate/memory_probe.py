# SPDX-License-Identifier: Apache-2.0
"""What one gate rank measures of its own GPU memory (imported by gate/worker.py inside vLLM).

The KV pool is sized once, at start-up, by ``Worker.determine_available_memory``: a profiling
forward at the largest step whose torch peak (weights included) is what vLLM budgets for
everything that is not the KV cache. The series' 0016 makes the DCP attention path allocate
its largest step's transients inside that forward. Whether the budget holds is measured
here, per rank process (ranks sharing one GPU each have their own torch allocator, so the
figures are each rank's own, valid under one-GPU emulation):

* ``profile``: torch's allocated bytes when ``determine_available_memory`` starts and its
  peak during it (the peak statistic is reset at the start), and the KV bytes it returned;
* ``steps``: for every model step after the sizing (vLLM's own warm-up steps included), the
  peak from the start of ``Worker.execute_model`` to the end of the ``sample_tokens`` that
  follows it (the statistic reset before each step), the largest per class: ``prefill`` (some
  request schedules more than one token) and ``decode`` (every request one); a step that
  raised is ``failed_step``;
* ``engine``: after start-up, vLLM's own KV figures (blocks, block size, the token capacity
  and concurrency it logs) and the DCP reservation 0016 recorded on the attention layers.

The negative controls, test-only and never shipped, are a rank environment variable
``GATE_DROP_DCP_RESERVATION``: ``alloc`` makes 0016's profiling reservation record its rows
without allocating anything (the profiled peak, vLLM's budget for what is not KV cache, is then
what it would be without the reservation; the memory verdict must flag the run), ``all`` drops
the record too (what a profiling forward that skipped the reservation looks like: 0016's
start-up check must refuse the engine). With an explicit ``kv_cache_memory_bytes`` (every gate
run) the pool itself does not depend on the profile; the verdict still asks whether the steps
fit the budget a profiled engine would have made.
"""

from __future__ import annotations

import os
from typing import Any

from gate.plan import DROP_RESERVATION, DROP_RESERVATION_ENV

DROP_CHOICES = ("", *DROP_RESERVATION)

_STATE: dict[str, Any] = {"profile": None, "steps": {}, "last": None, "failed_step": None}


def _cuda() -> Any:
    import torch

    return torch.cuda


def install() -> None:
    """Wrap the worker's memory sizing and model step (idempotent); with
    ``GATE_DROP_DCP_RESERVATION`` set, also apply that negative control."""
    from vllm.v1.worker import gpu_worker

    cls = gpu_worker.Worker
    if getattr(cls, "_gate_memory_probe", False):
        return
    sizing, step, sample = (
        cls.determine_available_memory,
        cls.execute_model,
        cls.sample_tokens,
    )

    def determine_available_memory(self: Any) -> int:
        cuda = _cuda()
        cuda.synchronize()
        before = cuda.memory_allocated()
        cuda.reset_peak_memory_stats()
        kv_bytes = sizing(self)
        cuda.synchronize()
        _STATE["profile"] = {
            "allocated_before_bytes": before,
            "peak_bytes": cuda.max_memory_allocated(),
            "peak_reserved_bytes": cuda.max_memory_reserved(),
            "kv_cache_bytes": int(kv_bytes),
        }
        return kv_bytes

    def execute_model(self: Any, scheduler_output: Any) -> Any:
        per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        if not per_request:
            return step(self, scheduler_output)
        cuda = _cuda()
        cuda.synchronize()
        cuda.reset_peak_memory_stats()
        failed = True
        try:
            out = step(self, scheduler_output)
            cuda.synchronize()
            failed = False
        finally:  # a step that raises (an out-of-memory error) is recorded too
            record_step(
                per_request, cuda.max_memory_allocated(), cuda.max_memory_reserved(), failed
            )
        return out

    def sample_tokens(self: Any, grammar_output: Any) -> Any:
        # the V2 runner computes logits and samples here, after execute_model: the peak
        # since that step's reset covers both, and is folded into the same step
        out = sample(self, grammar_output)
        if _STATE["last"] is not None:
            cuda = _cuda()
            cuda.synchronize()
            fold_sampling(cuda.max_memory_allocated(), cuda.max_memory_reserved())
        return out

    cls.determine_available_memory = determine_available_memory
    cls.execute_model = execute_model
    cls.sample_tokens = sample_tokens
    cls._gate_memory_probe = True
    drop = dropped_reservation()
    if drop:
        drop_reservation(drop)


def record_step(
    per_request: dict[str, int], peak: int, peak_reserved: int, failed: bool = False
) -> None:
    """Fold one step's peak into the largest of its class (pure; see the module docstring);
    a step that raised is kept apart as ``failed_step`` (its peak up to the error)."""
    kind = "prefill" if max(per_request.values()) > 1 else "decode"
    tokens = sum(per_request.values())
    if failed:
        _STATE["failed_step"] = {"kind": kind, "tokens": tokens, "peak_bytes": peak}
        _STATE["last"] = None
        return
    cur = _STATE["steps"].get(kind)
    if cur is None:
        cur = _STATE["steps"][kind] = {"steps": 0, "peak_bytes": -1}
    cur["steps"] += 1
    cur["max_step_tokens"] = max(cur.get("max_step_tokens", 0), tokens)
    _STATE["last"] = (kind, tokens)
    _fold(cur, peak, peak_reserved, tokens)


def fold_sampling(peak: int, peak_reserved: int) -> None:
    """The sampling after the last recorded step: its peak (since that step's reset) counts
    for that step."""
    kind, tokens = _STATE["last"]
    _fold(_STATE["steps"][kind], peak, peak_reserved, tokens)
    _STATE["last"] = None


def _fold(cur: dict[str, Any], peak: int, peak_reserved: int, tokens: int) -> None:
    cur["peak_reserved_bytes"] = max(cur.get("peak_reserved_bytes", 0), peak_reserved)
    if peak > cur["peak_bytes"]:
        cur.update(peak_bytes=peak, peak_step_tokens=tokens)


def dropped_reservation() -> str:
    """The negative control asked for ("" when none); an unknown value is an error."""
    value = os.environ.get(DROP_RESERVATION_ENV, "")
    if value not in DROP_CHOICES:
        raise ValueError(
            f"{DROP_RESERVATION_ENV}={value!r}; valid: {', '.join(c for c in DROP_CHOICES if c)}"
            " (or unset)"
        )
    return value


def drop_reservation(what: str) -> None:
    """Replace 0016's ``_reserve_dcp_step``: ``alloc`` records the rows and allocates nothing,
    ``all`` does nothing."""
    from vllm.models.deepseek_v32 import attention

    cls = attention.DeepseekV32Attention
    if not hasattr(cls, "_reserve_dcp_step"):
        raise RuntimeError(f"{DROP_RESERVATION_ENV}={what}, but this tree has no 0016 reservation")

    def record_only(self: Any, rows: int, device: Any) -> None:
        if what == "alloc":
            self.dcp_reserved_rows = max(self.dcp_reserved_rows, rows)

    cls._reserve_dcp_step = record_only


def dcp_reservation(model: Any) -> dict[str, Any] | None:
    """0016's plan and reservation over the model's DCP layers (run through
    ``LLM.apply_model``); ``None`` on a tree or configuration without them."""
    from vllm.v1.attention.ops.dcp_memory import largest_plan

    layers = [m for m in model.modules() if getattr(m, "dcp_step_plan", None) is not None]
    if not layers:
        return None
    largest = largest_plan(m.dcp_step_plan for m in layers)
    return {
        "layers": len(layers),
        "reserved_rows": min(int(m.dcp_reserved_rows) for m in layers),
        "plan_rows": int(largest.rows),
        "plan_peak_phase": largest.peak.name,
        "plan_peak_bytes": int(largest.peak_bytes),
    }


def engine_figures(llm: Any) -> dict[str, Any]:
    """vLLM's own KV figures after start-up (None where this vLLM has no such field)."""
    cache = llm.llm_engine.vllm_config.cache_config
    return {
        name: getattr(cache, name, None)
        for name in (
            "num_gpu_blocks",
            "block_size",
            "kv_cache_size_tokens",
            "kv_cache_max_concurrency",
            "kv_cache_memory_bytes",
        )
    }


def snapshot(llm: Any | None = None, reservation: Any = None) -> dict[str, Any]:
    """This rank's memory record so far (JSON-ready)."""
    cuda = _cuda()
    out: dict[str, Any] = {
        "profile": _STATE["profile"],
        "steps": {k: dict(v) for k, v in _STATE["steps"].items()},
        "failed_step": _STATE["failed_step"],
        "allocated_now_bytes": cuda.memory_allocated(),
        "reservation_dropped": dropped_reservation() or None,
    }
    if llm is not None:
        out["engine"] = engine_figures(llm)
        out["dcp_reservation"] = reservation
    return out
