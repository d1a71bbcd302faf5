# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the MTP GPU evidence scripts (gpu_mtp_exactness.py, gpu_mtp_adaptive.py),
written for vLLM 0.33 (Model Runner V2, ``adaptive_speculative_tokens="acceptance"`` of patch
vllm/0012-spec-decode-adaptive-depth.patch).

Result files follow the repository convention: one JSON per run under ``results/`` (or
``$OUT`` on the device machine) with the command, the git revision, the machine and the
figures.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import evidence

REPO = Path(__file__).resolve().parent.parent


def git_revision() -> str:
    """The series revision ($DCP_GIT_REV on the device machine), or "unknown"."""
    return evidence.git_revision() or "unknown"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    try:
        import vllm

        info["vllm"] = vllm.__version__
        info["vllm_path"] = str(Path(vllm.__file__).parent)
    except ImportError:
        pass
    info["variant"] = os.environ.get("VARIANT", "stock")
    return info


def write_result(name: str, payload: dict[str, Any], out_dir: str | None = None) -> Path:
    """Write ``payload`` plus provenance to ``<out>/<name>-<UTC stamp>.json``."""
    out = Path(out_dir or os.environ.get("OUT") or REPO / "results")
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    record = {
        "schema_version": 1,
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "git_revision": git_revision(),
        "machine": machine(),
        "utc": stamp,
        **payload,
    }
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def tiny_dsa_dir() -> Path:
    for candidate in (
        REPO / ".gpu" / "tiny_dsa",
        REPO.parent / "shared" / "gpu" / "tiny_dsa",
        Path("/work/shared/gpu/tiny_dsa"),
    ):
        if (candidate / "config.json").is_file():
            return candidate
    raise SystemExit("tiny_dsa/config.json not found: pass --model")


# Upstream's batch-size schedule for mode "schedule": deep at small batches, shallow at large
# ones, within the ladder's range (num_speculative_tokens 5).
DEFAULT_SCHEDULE: list[list[int]] = [[1, 2, 5], [3, 4, 4], [5, 1024, 2]]


def mtp_spec(
    mode: int | str,
    windows: list[int] | None = None,
    schedule: list[list[int]] | None = None,
) -> dict[str, Any] | None:
    """The speculative_config of one run: ``0`` none, an int a fixed MTP depth,
    ``"schedule"`` upstream's batch-size schedule (``num_speculative_tokens_per_batch_size``,
    ``schedule`` or DEFAULT_SCHEDULE), ``"adaptive"`` the 2/4/5 ladder
    (``adaptive_speculative_tokens="acceptance"``; vLLM's default windows unless ``windows``
    is given)."""
    if mode in (0, "0"):
        return None
    spec: dict[str, Any] = {"method": "mtp"}
    if mode == "adaptive":
        spec |= {
            "num_speculative_tokens": 5,
            "adaptive_speculative_tokens": "acceptance",
            "adaptive_speculative_tokens_ladder": [2, 4, 5],
        }
        if windows is not None:
            spec["adaptive_speculative_tokens_window"] = windows
    elif mode == "schedule":
        entries = schedule if schedule is not None else DEFAULT_SCHEDULE
        spec |= {
            "num_speculative_tokens": max(k for _, _, k in entries),
            "num_speculative_tokens_per_batch_size": [list(e) for e in entries],
        }
    else:
        spec["num_speculative_tokens"] = int(mode)
    return spec


def mode_key(mode: int | str) -> str:
    """The result key of a mode: ``k4``, ``schedule``, ``adaptive``, ``no_spec``."""
    if mode in (0, "0"):
        return "no_spec"
    return str(mode) if mode in ("adaptive", "schedule") else f"k{mode}"


def vllm_base() -> str | None:
    """The vLLM release the run used, e.g. ``vllm-0.33.0`` (None without vLLM)."""
    try:
        import vllm
    except ImportError:
        return None
    return f"vllm-{vllm.__version__}"


def engine_kwargs(args: Any, model: str, spec: dict[str, Any] | None, **extra: Any) -> dict:
    """The LLM(...) arguments both MTP scripts share (token-id prompts, fixed seed, metrics
    on), from their common command-line options; ``extra`` adds or overrides."""
    return {
        "model": model,
        "skip_tokenizer_init": True,
        "seed": 0,
        "tensor_parallel_size": args.tp,
        "decode_context_parallel_size": args.dcp,
        "max_model_len": args.max_model_len,
        "enforce_eager": args.eager,
        "gpu_memory_utilization": args.gpu_mem,
        "max_num_seqs": args.max_num_seqs,
        "disable_log_stats": False,
        "speculative_config": spec,
        **extra,
    }


def free_llm(llm: Any) -> None:
    """Shut an LLM down so the next one in this process gets the GPU memory."""
    import torch

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort, the object is dropped below
        pass
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def resolved_cudagraph_mode(llm: Any) -> str | None:
    """The cudagraph_mode vLLM resolved for this engine (a V1 fallback to PIECEWISE shows)."""
    try:
        return llm.llm_engine.vllm_config.compilation_config.cudagraph_mode.name
    except AttributeError:
        return None


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
