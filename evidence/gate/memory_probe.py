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
  request schedules more than one token) and ``decode`` (every request one), with
  ``peak_step_start_bytes``, torch's allocated bytes when the step that set that peak started
  (after the synchronize, before the step runs: what the engine holds between steps, so the
  step's own transient is ``peak_bytes - peak_step_start_bytes``); a step that raised is
  ``failed_step`` (its peak up to the error and its ``start_bytes``); ``prefill`` also keeps
  ``step_seconds``, each prefill step's wall time from the synchronize before it to the one
  after it, in order (sampling excluded; with ranks sharing one GPU, one-GPU emulation times;
  under speculative decoding a verification step schedules several tokens and so counts as
  a prefill step here too);
* ``engine``: after start-up, vLLM's own KV figures (blocks, block size, the token capacity
  and concurrency it logs) and the DCP reservation 0016 recorded on the attention layers;
* ``attribution``: where in the profiling forward (``profile``) and in the step that set each
  class's peak (``prefill``, ``decode``) the memory peaked. Forward hooks on the model's modules
  whose class name contains one of ``HOOKED_CLASSES`` (attention, indexer, MoE, MLP, decoder
  layer, logits) cut the measured span into segments at every module entry and exit: each
  segment's peak is torch's peak statistic since the previous cut (reset there), owned by the
  innermost hooked module running (``outside modules`` between them: embedding, sampling).
  Each class keeps its top ``TOP_SITES`` sites (a module's name with layer indices as ``*``;
  the worst instance's name, class, peak and allocated bytes at the segment's entry, so the
  transient is ``peak - entry``); a step that raised keeps the module it raised in
  (``failed_step``). Guarantee: the recorded ``peak_bytes`` of the profile and of each step is
  the largest segment peak, which is exactly the peak since the span began, as without the
  hooks. The hooks are inert outside a measured span and while a CUDA graph is being captured.
  The cuts reset torch's peak statistic inside a forward, so vLLM's own readings of it (its
  memory profiling without an explicit ``kv_cache_memory_bytes``) would not hold: a probed run
  must set ``kv_cache_memory_bytes`` (``GateConfig`` refuses one that does not, and the wrapped
  sizing raises).

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
import re
import time
from typing import Any

from gate.plan import DROP_RESERVATION, DROP_RESERVATION_ENV

DROP_CHOICES = ("", *DROP_RESERVATION)

_STATE: dict[str, Any] = {
    "profile": None,
    "steps": {},
    "last": None,  # (class, tokens, holds its class's peak, start bytes) of the last step
    "failed_step": None,
    "span": None,  # the Segments being measured (a profile, or a step and its sampling)
    "attribution": {},
}
# the modules the attribution cuts at: class names containing one of these
HOOKED_CLASSES = (
    "Attention",
    "Indexer",
    "MoE",
    "MLP",
    "DecoderLayer",
    "LogitsProcessor",
    "ParallelLMHead",
)
TOP_SITES = 3
OUTSIDE = ("outside modules", "", "outside modules")  # (name, class, site) of the gaps


def _cuda() -> Any:
    import torch

    return torch.cuda


class Segments:
    """One measured span cut at module boundaries (see ``attribution`` in the module
    docstring). Opening it resets torch's peak statistic; ``peak_bytes`` and
    ``peak_reserved_bytes`` are the running maxima over the segments closed so far."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.stack = [OUTSIDE]
        self.sites: dict[tuple[str, str], dict[str, Any]] = {}  # (site, class) -> worst
        self.peak_bytes = self.peak_reserved_bytes = 0
        cuda.reset_peak_memory_stats()
        self.entry = cuda.memory_allocated()

    def cut(self) -> None:
        """Close the running segment (its peak to its owner) and start the next."""
        cuda = self.cuda
        peak = cuda.max_memory_allocated()
        self.peak_bytes = max(self.peak_bytes, peak)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, cuda.max_memory_reserved())
        name, cls, site = self.stack[-1]
        key = (site, cls)
        if key not in self.sites or peak > self.sites[key]["peak_bytes"]:
            self.sites[key] = {
                "module": name,
                "class": cls,
                "peak_bytes": peak,
                "entry_bytes": self.entry,
            }
        cuda.reset_peak_memory_stats()
        self.entry = cuda.memory_allocated()

    def enter(self, owner: tuple[str, str, str]) -> None:
        self.cut()
        self.stack.append(owner)

    def leave(self, owner: tuple[str, str, str]) -> None:
        """The parent owns the next segment (a module that raised inside this one and never
        left is dropped with it)."""
        self.cut()
        if owner in self.stack[1:]:
            del self.stack[len(self.stack) - 1 - self.stack[::-1].index(owner) :]

    def top(self) -> list[dict[str, Any]]:
        """The ``TOP_SITES`` sites with the highest segment peaks (JSON-ready)."""
        ranked = sorted(self.sites.values(), key=lambda s: -s["peak_bytes"])
        return [dict(s) for s in ranked[:TOP_SITES]]


def _hook(owner: tuple[str, str, str], enter: bool) -> Any:
    def hook(module: Any, *args: Any) -> None:
        span = _STATE["span"]
        if span is None or span.cuda.is_current_stream_capturing():
            return
        if enter:
            span.enter(owner)
        else:
            span.leave(owner)

    return hook


def install_hooks(model: Any, classes: tuple[str, ...] = HOOKED_CLASSES) -> int:
    """Hook the model's modules whose class name contains one of ``classes`` (once per
    model); the number hooked."""
    if model is None or getattr(model, "_gate_memory_hooks", None) is not None:
        return 0
    hooked = 0
    for name, module in model.named_modules():
        cls = type(module).__name__
        if name and any(c in cls for c in classes):
            owner = (name, cls, re.sub(r"\.\d+(?=\.|$)", ".*", name))  # layers.*: one site
            module.register_forward_pre_hook(_hook(owner, True))
            module.register_forward_hook(_hook(owner, False))
            hooked += 1
    model._gate_memory_hooks = hooked
    return hooked


def model_of(worker: Any) -> Any:
    """The worker's model (the V2 runner's ``get_model()``, else its ``model``); None when
    there is none yet."""
    runner = getattr(worker, "model_runner", None)
    try:
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    except AttributeError:  # no runner, or no model loaded
        return None
    return model if hasattr(model, "named_modules") else None


def open_span(cuda: Any) -> Segments:
    """Start measuring (resets torch's peak statistic)."""
    _STATE["span"] = span = Segments(cuda)
    return span


def close_span() -> Segments | None:
    """Stop measuring: the last segment closed; the span, or None when none was open."""
    span, _STATE["span"] = _STATE["span"], None
    if span is not None:
        span.cut()
    return span


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
        if not getattr(getattr(self, "cache_config", None), "kv_cache_memory_bytes", None):
            # vLLM's own sizing reads torch's peak inside this call; the cuts reset it
            raise RuntimeError(
                "memory_probe needs kv_cache_memory_bytes: without it vLLM sizes the KV "
                "pool from the torch peak that the probe's segment cuts reset"
            )
        install_hooks(model_of(self))  # the model is loaded by now
        cuda = _cuda()
        cuda.synchronize()
        before = cuda.memory_allocated()
        span = open_span(cuda)
        try:
            kv_bytes = sizing(self)
            cuda.synchronize()
        finally:  # a refused start-up keeps where its profiling forward peaked
            close_span()
            _STATE["attribution"]["profile"] = span.top()
        _STATE["profile"] = {
            "allocated_before_bytes": before,
            "peak_bytes": span.peak_bytes,
            "peak_reserved_bytes": span.peak_reserved_bytes,
            "kv_cache_bytes": int(kv_bytes),
        }
        return kv_bytes

    def execute_model(self: Any, scheduler_output: Any) -> Any:
        per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        if not per_request:
            return step(self, scheduler_output)
        cuda = _cuda()
        cuda.synchronize()
        start = cuda.memory_allocated()  # what the engine holds before this step
        span = open_span(cuda)  # stays open through the sampling that follows
        failed = True
        t0 = time.perf_counter()
        try:
            out = step(self, scheduler_output)
            cuda.synchronize()
            failed = False
        finally:  # a step that raises (an out-of-memory error) is recorded too
            if failed:
                close_span()
            else:
                span.cut()
            record_step(
                per_request,
                span.peak_bytes,
                span.peak_reserved_bytes,
                failed,
                top=span.top(),
                raised_in=span.stack[-1][0] if failed else None,
                start=start,
                seconds=time.perf_counter() - t0,
            )
        return out

    def sample_tokens(self: Any, grammar_output: Any) -> Any:
        # the V2 runner computes logits and samples here, after execute_model: the peak
        # since that step's reset covers both, and is folded into the same step
        out = sample(self, grammar_output)
        if _STATE["last"] is not None:
            _cuda().synchronize()
            span = close_span()
            if span is not None:
                fold_sampling(span.peak_bytes, span.peak_reserved_bytes, top=span.top())
        return out

    cls.determine_available_memory = determine_available_memory
    cls.execute_model = execute_model
    cls.sample_tokens = sample_tokens
    cls._gate_memory_probe = True
    drop = dropped_reservation()
    if drop:
        drop_reservation(drop)


def record_step(
    per_request: dict[str, int],
    peak: int,
    peak_reserved: int,
    failed: bool = False,
    top: list[dict[str, Any]] | None = None,
    raised_in: str | None = None,
    start: int | None = None,
    seconds: float | None = None,
) -> None:
    """Fold one step's peak into the largest of its class (pure; see the module docstring),
    with ``top`` (its attribution so far) and ``start`` (allocated bytes when the step
    started) when the step sets that peak; a prefill step's ``seconds`` joins its class's
    ``step_seconds`` in order; a step that raised is kept apart as ``failed_step`` (its peak
    up to the error, its start, the module it raised in)."""
    kind = "prefill" if max(per_request.values()) > 1 else "decode"
    tokens = sum(per_request.values())
    if failed:
        _STATE["failed_step"] = {
            "kind": kind,
            "tokens": tokens,
            "peak_bytes": peak,
            "start_bytes": start,
        }
        if top is not None:
            _STATE["attribution"]["failed_step"] = {"raised_in": raised_in, "top": top}
        _STATE["last"] = None
        return
    cur = _STATE["steps"].get(kind)
    if cur is None:
        cur = _STATE["steps"][kind] = {"steps": 0, "peak_bytes": -1}
    cur["steps"] += 1
    cur["max_step_tokens"] = max(cur.get("max_step_tokens", 0), tokens)
    if kind == "prefill" and seconds is not None:
        cur.setdefault("step_seconds", []).append(round(seconds, 4))
    holds = _fold(cur, peak, peak_reserved, tokens, start)
    _STATE["last"] = (kind, tokens, holds, start)
    if holds and top is not None:
        _STATE["attribution"][kind] = top


def fold_sampling(peak: int, peak_reserved: int, top: list[dict[str, Any]] | None = None) -> None:
    """The sampling after the last recorded step: its peak (since that step's reset) counts
    for that step (with that step's start), and ``top`` (the step's whole attribution) when
    that step holds its class's peak."""
    kind, tokens, held, start = _STATE["last"]
    holds = _fold(_STATE["steps"][kind], peak, peak_reserved, tokens, start) or held
    if holds and top is not None:
        _STATE["attribution"][kind] = top
    _STATE["last"] = None


def _fold(
    cur: dict[str, Any], peak: int, peak_reserved: int, tokens: int, start: int | None
) -> bool:
    """Whether ``peak`` is the class's new largest (then its step's tokens and start are
    the class's too)."""
    cur["peak_reserved_bytes"] = max(cur.get("peak_reserved_bytes", 0), peak_reserved)
    if peak > cur["peak_bytes"]:
        cur.update(peak_bytes=peak, peak_step_tokens=tokens, peak_step_start_bytes=start)
        return True
    return False


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


def _nvml() -> Any:
    """NVML's Python bindings, as vLLM vendors them."""
    from vllm.third_party import pynvml

    return pynvml


def nvml_process_bytes(pid: int) -> int | None:
    """The GPU memory NVML charges to process ``pid``, summed over the visible devices (a
    gate rank uses one); None where NVML cannot say (no pynvml, no driver, no entry)."""
    try:
        pynvml = _nvml()
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: the figure is unknown, not zero
        return None
    try:
        used = [
            proc.usedGpuMemory
            for i in range(pynvml.nvmlDeviceGetCount())
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(
                pynvml.nvmlDeviceGetHandleByIndex(i)
            )
            if proc.pid == pid and proc.usedGpuMemory is not None
        ]
    except Exception:  # noqa: BLE001
        return None
    finally:
        pynvml.nvmlShutdown()
    return sum(used) if used else None


def process_memory() -> dict[str, Any]:
    """This rank process's GPU memory now: what NVML charges to it, what torch's allocator
    holds (reserved) and hands out (allocated), and the difference of the first two, the
    memory allocated outside torch (the CUDA context, NCCL's buffers, a DCP channel's IPC
    slab). Per process, so valid with ranks sharing one GPU (the device's free memory is not)."""
    cuda = _cuda()
    used = nvml_process_bytes(os.getpid())
    reserved = cuda.memory_reserved()
    return {
        "process_bytes": used,
        "torch_reserved_bytes": reserved,
        "torch_allocated_bytes": cuda.memory_allocated(),
        "non_torch_bytes": None if used is None else used - reserved,
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
        "attribution": dict(_STATE["attribution"]),
    }
    if llm is not None:
        out["engine"] = engine_figures(llm)
        out["dcp_reservation"] = reservation
    return out
