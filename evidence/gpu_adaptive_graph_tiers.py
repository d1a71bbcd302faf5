#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Patch 0012 on vLLM 0.34 (one GPU): the adaptive depth's ladder gets FULL CUDA graphs
per depth, and the steps replay them.

Builds one engine with MTP, num_speculative_tokens=5, adaptive_speculative_tokens=
"acceptance", ladder 2/4/5 and short windows (4/3/3), on a seeded "agree" MTP checkpoint
(mtp_agree_ckpt.py: the draft predicts the target's next token, so every draft is accepted
and the controller climbs 2 -> 4 -> 5). Then, through LLM.collective_rpc on the worker:

* captured: the FULL target graphs' uniform query lengths (expected to hold 3, 5, 6 =
  ladder depth + 1, from VllmConfig.get_decode_cudagraph_query_lens) and the draft
  decode-loop graphs' num_speculative_tokens (expected 2, 4, 5 minus depths <= 1);
* replayed: every run_fullgraph of the target manager and the draft decode manager while
  a batch of 4 requests decodes 160 tokens, counted per query length / depth;
* the scheduler's num_spec_tokens_to_schedule per step (VLLM_ENABLE_V1_MULTIPROCESSING=0).

Verdict ``ok`` when every ladder depth was captured and replayed on both managers and the
depth trace reached 5. Writes one JSON (``--out``); the checkpoint is written to ``--ckpt``
unless one is there:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python evidence/gpu_adaptive_graph_tiers.py \
        --ckpt <work>/mtp-agree --arch glm --out <out>/adaptive-graph-tiers.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import mtp_agree_ckpt
from gate.spec_metrics import record_depths
from make_dsa_gate_ckpt import ARCHS

LADDER = [2, 4, 5]
WINDOWS = [4, 3, 3]


def _managers(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    out = {"target": getattr(runner, "cudagraph_manager", None)}
    speculator = getattr(runner, "speculator", None)
    out["draft_decode"] = getattr(speculator, "decode_cudagraph_manager", None)
    return out


def _key(kind: str, desc: Any) -> int | None:
    if kind == "target":
        return getattr(desc, "uniform_token_count", None)
    return getattr(desc, "num_speculative_tokens", None)


def probe_captured(worker: Any) -> dict[str, Any]:
    from vllm.config.compilation import CUDAGraphMode

    result: dict[str, Any] = {}
    for kind, manager in _managers(worker).items():
        if manager is None:
            result[kind] = None
            continue
        keys = collections.Counter(
            _key(kind, d) for d in manager.graphs if d.cg_mode == CUDAGraphMode.FULL
        )
        result[kind] = {str(k): n for k, n in sorted(keys.items(), key=lambda kv: str(kv[0]))}
    return result


def install_replay_counters(worker: Any) -> bool:
    counts: dict[str, collections.Counter] = {}
    for kind, manager in _managers(worker).items():
        if manager is None:
            continue
        counter: collections.Counter = collections.Counter()
        counts[kind] = counter
        original = manager.run_fullgraph

        def wrapped(desc, *a, _orig=original, _kind=kind, _counter=counter, **kw):
            _counter[_key(_kind, desc)] += 1
            return _orig(desc, *a, **kw)

        manager.run_fullgraph = wrapped
    worker._p0012_replays = counts
    return True


def collect_replays(worker: Any) -> dict[str, Any]:
    counts = getattr(worker, "_p0012_replays", {})
    return {
        kind: {str(k): n for k, n in sorted(c.items(), key=lambda kv: str(kv[0]))}
        for kind, c in counts.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", type=Path, required=True, help="the agreeing checkpoint's folder")
    ap.add_argument("--arch", default="glm", choices=ARCHS)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=160)
    ap.add_argument("--gpu-mem", type=float, default=0.5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        print("set VLLM_ENABLE_V1_MULTIPROCESSING=0 (the depth trace needs the scheduler)")
        return 2
    ckpt = args.ckpt
    if not (ckpt / "model.safetensors").is_file():
        mtp_agree_ckpt.write(ckpt, args.arch)

    from vllm import LLM, SamplingParams

    result: dict[str, Any] = {"ladder": LADDER, "windows": WINDOWS, "ckpt": str(ckpt)}
    try:
        t0 = time.time()
        llm = LLM(
            model=str(ckpt),
            skip_tokenizer_init=True,
            seed=0,
            max_model_len=4096,
            max_num_seqs=8,
            gpu_memory_utilization=args.gpu_mem,
            disable_log_stats=False,
            speculative_config={
                "method": "mtp",
                "num_speculative_tokens": LADDER[-1],
                "adaptive_speculative_tokens": "acceptance",
                "adaptive_speculative_tokens_ladder": LADDER,
                "adaptive_speculative_tokens_window": WINDOWS,
            },
        )
        result["startup_s"] = round(time.time() - t0, 1)
        config = llm.llm_engine.vllm_config
        result["cudagraph_mode"] = config.compilation_config.cudagraph_mode.name
        result["decode_query_lens"] = {
            str(q): n
            for q, n in config.get_decode_cudagraph_query_lens(
                config.uniform_decode_query_len
            ).items()
        }
        result["captured"] = llm.collective_rpc(probe_captured)[0]
        llm.collective_rpc(install_replay_counters)
        depths = record_depths(llm)
        vocab = json.loads((ckpt / "config.json").read_text())["vocab_size"]
        assert vocab > 100 + 1000 * args.batch + 16
        prompts = [
            {"prompt_token_ids": [100 + i * 1000 + j for j in range(16)]} for i in range(args.batch)
        ]
        params = SamplingParams(
            temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True, detokenize=False
        )
        llm.generate(prompts, params)
        result["replayed"] = llm.collective_rpc(collect_replays)[0]
        result["depth_trace"] = depths
    except Exception as e:  # noqa: BLE001 - recorded in the result file
        result["error"] = repr(e)
        result["traceback"] = traceback.format_exc()[-4000:]

    want_target = {str(d + 1) for d in LADDER}
    want_draft = {str(d) for d in LADDER if d > 1}
    captured = result.get("captured") or {}
    replayed = result.get("replayed") or {}
    checks = {
        "target_captured_every_depth": want_target <= set(captured.get("target") or {}),
        "draft_captured_every_depth": want_draft <= set(captured.get("draft_decode") or {}),
        "target_replayed_every_depth": want_target <= set(replayed.get("target") or {}),
        "draft_replayed_every_depth": want_draft <= set(replayed.get("draft_decode") or {}),
        "climbed_to_top": bool(result.get("depth_trace")) and LADDER[-1] in result["depth_trace"],
    }
    result["checks"] = checks
    result["verdict"] = "ok" if all(checks.values()) and "error" not in result else "fail"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({"verdict": result["verdict"], "checks": checks}))
    return 0 if result["verdict"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
