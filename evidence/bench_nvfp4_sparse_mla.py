#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPU benchmark: Triton sparse MLA over nvfp4_ds_mla records beside fp8_ds_mla; capacity.

Runs on one GPU with vLLM importable (the pinned wheel) and the patched tree's two leaf files
loaded by path (--tree), so the shipped kernels are what runs:
``vllm/v1/attention/ops/triton_sparse_mla.py`` (``record_format=...``) and
``vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py`` (writer, codec).

Measured, same inputs for both formats (the same bf16 latent rows quantised both ways):
  * decode: 1..64 rows x 16 and 64 heads, top-k 2048 over a 1M-token cache (random slots);
  * extend: 4096 rows, each with its own top-k 2048 over a 32k-token context;
  * the cache writers: Triton nvfp4_ds_mla writer, CUDA fp8_ds_mla writer
    (``ops.concat_and_cache_mla``), and on SM100 the CUDA nvfp4_ds_mla writer (with a byte
    comparison against the Triton one).
Timing: CUDA-graph replay (bench_timing.graph_us, as in bench_sparse_mla_kernel.py): K calls
over K index sets (K x record bytes >= 4 x L2) captured in one graph, per-call time = median
replay / K, with the kernel's default launch (``plan_sparse_mla``) for each format.
``nvfp4_over_fp8`` = nvfp4 time / fp8 time (< 1: the 4-bit records are faster). Accuracy spot
checks: each format's kernel against fp32 attention over its own dequantised records, and both
against bf16 attention over the unquantised rows (first decode row of each head count).

Capacity (computed, and the pool a GPU holds): bytes per token per layer for bf16 (1152),
fp8_ds_mla (656), nvfp4_ds_mla (352), with and without the DSA indexer's key cache (132 B
per token per layer: 128 fp8 + one fp32 scale); tokens per GiB of KV memory for --layers
layers; and, with --kv-gib, the tokens that fit in that much KV memory.

Device command (one H200; vLLM 0.34.0 installed, patched tree at $TREE), ~3 min with JIT:
    python3 bench_nvfp4_sparse_mla.py --tree $TREE --out nvfp4-bench-h200.json
(--quick: decode 1/8/64 rows and one extend row; --budget-s bounds the run; results are
written after every row.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from bench_timing import graph_us
from provenance import write_result

TOPK = 2048
NUM_SLOTS = 1 << 20
EXTEND_ROWS, EXTEND_CTX = 4096, 32768
MAX_ROTATION = 128
BYTES = {"bf16": 1152, "fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
INDEXER_BYTES = 132
FORMATS = ("fp8_ds_mla", "nvfp4_ds_mla")


def load(tree: Path, rel: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, tree / rel)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Workspace:
    """get_workspace stand-in: buffers allocated once and reused, as vLLM's reserved one."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def __call__(self, *specs):
        out = []
        for i, (shape, dtype) in enumerate(specs):
            key = (i, tuple(shape), dtype)
            if key not in self.buffers:
                self.buffers[key] = torch.empty(shape, dtype=dtype, device="cuda")
            out.append(self.buffers[key])
        return out


def attention(q, kv, indices, sm_scale):
    """fp32 attention of q [T,H,576] over rows kv[indices] ([N,576] float)."""
    gathered = kv[indices.long()].float()
    scores = torch.einsum("thd,tkd->thk", q.float(), gathered) * sm_scale
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None])
    return torch.einsum("thk,tkd->thd", probs, gathered[..., :512]), lse


def diff(out, lse, ref_out, ref_lse) -> dict[str, float]:
    d = (out.float() - ref_out).flatten()
    return {
        "out_max_abs": d.abs().max().item(),
        "out_rel_fro": (d.norm() / ref_out.flatten().norm()).item(),
        "lse_max_abs": (lse - ref_lse).abs().max().item(),
        "lse_mean_abs": (lse - ref_lse).abs().mean().item(),
    }


def latent_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    """[n, 576] bf16 rows: RMS-normalised latent x per-channel gain, Gaussian RoPE."""
    nope = torch.randn(n, 512, device="cuda", generator=gen)
    nope = nope * torch.rsqrt(nope.pow(2).mean(-1, keepdim=True))
    gain = torch.exp(0.5 * torch.randn(512, device="cuda", generator=gen))
    rope = torch.randn(n, 64, device="cuda", generator=gen)
    return torch.cat([nope * gain, rope], -1).to(torch.bfloat16)


def capacity(layers: int, kv_gib: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"layers": layers, "formats": {}}
    for fmt, b in BYTES.items():
        for indexer in (False, True):
            per_token = (b + (INDEXER_BYTES if indexer else 0)) * layers
            entry = {
                "bytes_per_token_per_layer": b + (INDEXER_BYTES if indexer else 0),
                "bytes_per_token_all_layers": per_token,
                "tokens_per_gib": (1 << 30) / per_token,
            }
            if kv_gib is not None:
                entry["tokens_in_kv_gib"] = int(kv_gib * (1 << 30) // per_token)
            out["formats"][fmt + ("+indexer" if indexer else "")] = entry
    f = out["formats"]
    out["nvfp4_over_fp8_tokens"] = (
        f["nvfp4_ds_mla"]["tokens_per_gib"] / f["fp8_ds_mla"]["tokens_per_gib"]
    )
    out["nvfp4_over_fp8_tokens_with_indexer"] = (
        f["nvfp4_ds_mla+indexer"]["tokens_per_gib"] / f["fp8_ds_mla+indexer"]["tokens_per_gib"]
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=61, help="61: DeepSeek-V3.2")
    ap.add_argument("--kv-gib", type=float, default=None)
    args = ap.parse_args()
    t0 = time.time()
    tsm = load(args.tree, "vllm/v1/attention/ops/triton_sparse_mla.py", "tsm_bench")
    codec = load(args.tree, "vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py", "nv_bench")
    from vllm import _custom_ops as ops

    props = torch.cuda.get_device_properties(0)
    sm100 = props.major == 10
    l2 = props.L2_cache_size
    result: dict[str, Any] = {
        "script": "bench_nvfp4_sparse_mla.py",
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "device": torch.cuda.get_device_name(),
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "capacity": capacity(args.layers, args.kv_gib),
        "decode": [],
        "extend": [],
        "writer": [],
        "complete": False,
    }

    def flush() -> None:
        write_result(args.out, result)

    def left() -> float:
        return args.budget_s - (time.time() - t0)

    gen = torch.Generator(device="cuda").manual_seed(0)
    # One set of latent rows, both caches.
    caches: dict[str, torch.Tensor] = {}
    latent = latent_rows(NUM_SLOTS, gen)
    caches["fp8_ds_mla"] = tsm.quantize_fp8_ds_mla(latent)
    nv = torch.empty(NUM_SLOTS, 352, dtype=torch.uint8, device="cuda")
    codec.concat_and_cache_nvfp4_ds_mla(
        latent[:, :512],
        latent[:, 512:],
        nv.view(NUM_SLOTS // 64, 64, 352),
        torch.arange(NUM_SLOTS, device="cuda"),
    )
    caches["nvfp4_ds_mla"] = nv
    sample = torch.randint(0, NUM_SLOTS, (4096,), device="cuda", generator=gen)
    result["writer_matches_codec_on_4096_rows"] = bool(
        torch.equal(
            nv[sample].cpu(),
            codec.quantize_nvfp4_ds_mla(latent[sample, :512].cpu(), latent[sample, 512:].cpu()),
        )
    )
    ws = Workspace()
    sm_scale = 576**-0.5

    def run_row(kind: str, rows: int, heads: int, slots: int) -> dict[str, Any]:
        q = (torch.randn(rows, heads, 576, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
        row: dict[str, Any] = {"kind": kind, "rows": rows, "heads": heads, "topk": TOPK}
        for fmt in FORMATS:
            rec = caches[fmt][:slots]
            call_bytes = rows * TOPK * BYTES[fmt]
            k = max(1, min(MAX_ROTATION, -(-4 * l2 // call_bytes)))
            sets = [
                torch.randint(0, slots, (rows, TOPK), device="cuda", generator=gen).int()
                for _ in range(k)
            ]
            out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
            lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")

            def make(idx, rec=rec, out=out, lse=lse, fmt=fmt):
                return lambda: tsm.sparse_mla_fp8_ds_mla_attention(
                    q, rec, idx, sm_scale, out=out, lse=lse, get_workspace=ws,
                    record_format=fmt,
                )  # fmt: skip

            us = graph_us([make(i) for i in sets], args.reps)
            plan = tsm.plan_sparse_mla(
                rows, heads, TOPK, q.device, contiguous=True, record_format=fmt
            )
            row[fmt] = {
                "us": us,
                "record_read_gbps": call_bytes / (us * 1e-6) / 1e9,
                "rotation_calls": k,
                "plan": plan.__dict__,
            }
            if kind == "decode" and rows <= 8:
                make(sets[0])()
                if fmt == "fp8_ds_mla":
                    deq = tsm.dequantize_fp8_ds_mla(rec[sets[0].flatten().long()])
                else:
                    deq = codec.dequantize_nvfp4_ds_mla(rec[sets[0].flatten().long()])
                local = torch.arange(rows * TOPK, device="cuda").view(rows, TOPK)
                r_out, r_lse = attention(q, deq.to(torch.bfloat16), local, sm_scale)
                row[fmt]["kernel_vs_records"] = diff(out, lse, r_out, r_lse)
                b_out, b_lse = attention(q, latent[:slots], sets[0], sm_scale)
                row[fmt]["kernel_vs_bf16"] = diff(out, lse, b_out, b_lse)
        row["nvfp4_over_fp8"] = row["nvfp4_ds_mla"]["us"] / row["fp8_ds_mla"]["us"]
        print(json.dumps({k: v for k, v in row.items() if k not in FORMATS}), flush=True)
        return row

    decode_rows = (1, 8, 64) if args.quick else (1, 2, 4, 8, 16, 32, 64)
    for heads in (16, 64):
        for rows in decode_rows:
            if left() < 30:
                break
            result["decode"].append(run_row("decode", rows, heads, NUM_SLOTS))
            flush()
    for heads in (16,) if args.quick else (16, 64):
        if left() < 60:
            break
        result["extend"].append(run_row("extend", EXTEND_ROWS, heads, EXTEND_CTX))
        flush()

    # Writers.
    scale = torch.ones(1, device="cuda")
    for n in (1, 64, 4096, 16384):
        if left() < 15:
            break
        kv = latent[:n]
        kv_c, k_pe = kv[:, :512].contiguous(), kv[:, 512:].contiguous()
        slots = torch.randperm(NUM_SLOTS, device="cuda")[:n]
        nv_cache = torch.zeros(NUM_SLOTS // 64, 64, 352, dtype=torch.uint8, device="cuda")
        fp8_cache = torch.zeros(NUM_SLOTS // 64, 64, 656, dtype=torch.uint8, device="cuda")
        entry: dict[str, Any] = {"tokens": n}
        entry["triton_nvfp4_us"] = graph_us(
            [partial(codec.concat_and_cache_nvfp4_ds_mla, kv_c, k_pe, nv_cache, slots)] * 8,
            args.reps,
        )
        entry["cuda_fp8_ds_mla_us"] = graph_us(
            [partial(ops.concat_and_cache_mla, kv_c, k_pe, fp8_cache, slots, "fp8_ds_mla", scale)]
            * 8,
            args.reps,
        )
        if sm100:
            cuda_nv = torch.zeros_like(nv_cache)
            entry["cuda_nvfp4_us"] = graph_us(
                [
                    partial(
                        ops.concat_and_cache_mla,
                        kv_c,
                        k_pe,
                        cuda_nv,
                        slots,
                        "nvfp4_ds_mla",
                        scale,
                    )  # fmt: skip
                ]
                * 8,
                args.reps,
            )
            entry["triton_equals_cuda_bytes"] = bool(torch.equal(cuda_nv, nv_cache))
        result["writer"].append(entry)
        print(json.dumps(entry), flush=True)
        flush()

    result["complete"] = left() > 0
    result["elapsed_s"] = time.time() - t0
    flush()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
