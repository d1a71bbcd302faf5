#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Accuracy of sparse MLA over nvfp4_ds_mla records beside fp8_ds_mla, against bf16.

For each activation regime the script builds a KV cache of latent rows (512 NoPE + 64 RoPE,
bf16), quantises it both ways with the shipped codecs (``quantize_nvfp4_ds_mla``: the SM100
writer's arithmetic; ``quantize_fp8_ds_mla``: the 0.34 ``fp8_ds_mla`` writer's), and compares
sparse attention (every query row over its own top-k of the cache) over the dequantised records
with the same attention over the bf16 rows:

* ``format``: float32 torch attention over the dequantised records (the error the record
  format itself causes; the kernel computes this up to bf16 rounding of P and of the output);
* ``kernel`` (with ``--kernel``): the shipped Triton kernel over the records
  (``record_format=...``), on the GPU, or under ``TRITON_INTERPRET=1`` on a smaller shape
  (the first rows, a prefix of each top-k list); ``kernel_vs_format``: the kernel against
  float32 attention over the same dequantised records.

Reported per regime and format: output error (max abs, and relative Frobenius norm
``||o - o_bf16|| / ||o_bf16||`` over all rows and heads) and LSE error (max abs, mean abs,
natural log), plus the KV reconstruction error of the NoPE and RoPE parts.

Activations are synthetic, shaped like DeepSeek-V3.2 / GLM-5 MLA inputs (no checkpoint is
read): the latent is RMS-normalised per row, then multiplied by a per-channel gain
(log-normal, sigma 0.5, and 1 % outlier channels x8, as a trained ``kv_a_layernorm`` weight
looks); the RoPE part is a rotated Gaussian per frequency pair with a per-pair gain; queries
are Gaussian, scaled so that the attention logits of one head have the standard deviation
``logit_std`` (1: flat attention, 2.5: a few dominant keys, 5: near one-hot).

Usage (CPU: format errors on the full shape, kernel under the interpreter on a small one):
    TRITON_INTERPRET=1 python nvfp4_accuracy.py --tree /path/to/vllm-tree --kernel \
        --out nvfp4-accuracy-cpu.json
    # GPU (vLLM tree installed or on PYTHONPATH):
    python nvfp4_accuracy.py --device cuda --kernel --out nvfp4-accuracy-h200.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import sys
import time
import types
from pathlib import Path

import torch
from provenance import write_result

CODEC = "vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py"
KERNEL = "vllm/v1/attention/ops/triton_sparse_mla.py"
REGIMES = (
    # name, logit_std, outlier gain
    ("flat", 1.0, 8.0),
    ("peaked", 2.5, 8.0),
    ("one-hot", 5.0, 8.0),
    ("peaked-no-outliers", 2.5, 1.0),
)


def _load(tree: Path | None, relpath: str):
    """The shipped module: from ``tree`` by path (``vllm.triton_utils`` -> real Triton, as
    the proofs' loader does), else the installed vLLM."""
    if tree is None:
        name = relpath.removesuffix(".py").replace("/", ".")
        return importlib.import_module(name)
    import triton
    import triton.language as tl

    shim = types.ModuleType("vllm.triton_utils")
    shim.triton, shim.tl, shim.HAS_TRITON = triton, tl, True
    saved = {k: sys.modules.get(k) for k in ("vllm", "vllm.triton_utils")}
    if saved["vllm"] is None:
        pkg = types.ModuleType("vllm")
        pkg.__path__ = []
        sys.modules["vllm"] = pkg
    sys.modules["vllm.triton_utils"] = shim
    try:
        name = "nvfp4_acc_" + Path(relpath).stem
        spec = importlib.util.spec_from_file_location(name, tree / relpath)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def make_cache(num_slots: int, outlier_gain: float, gen: torch.Generator) -> torch.Tensor:
    """[num_slots, 576] bf16 latent rows (see the module docstring)."""
    nope = torch.randn(num_slots, 512, generator=gen)
    nope = nope / nope.pow(2).mean(-1, keepdim=True).sqrt()
    gain = torch.exp(0.5 * torch.randn(512, generator=gen))
    outliers = torch.randperm(512, generator=gen)[: max(1, 512 // 100)]
    gain[outliers] *= outlier_gain
    nope = nope * gain
    # RoPE: Gaussian pairs rotated by position-dependent angles, per-pair gain.
    pos = torch.arange(num_slots, dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(32, dtype=torch.float32) / 32)
    ang = pos * freq
    a, b = torch.randn(2, num_slots, 32, generator=gen)
    pair_gain = torch.exp(0.5 * torch.randn(32, generator=gen))
    rope = torch.cat(
        [a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1
    ) * pair_gain.repeat(2)
    return torch.cat([nope, rope], -1).to(torch.bfloat16)


def make_queries(
    kv: torch.Tensor, rows: int, heads: int, logit_std: float, gen: torch.Generator
) -> tuple[torch.Tensor, float]:
    """[rows, heads, 576] bf16 queries and sm_scale with logits of std ``logit_std``."""
    q = torch.randn(rows, heads, 576, generator=gen)
    sm_scale = 576**-0.5
    sample = kv[torch.randint(0, kv.shape[0], (256,), generator=gen)].float()
    std = (q[:1].reshape(heads, 576) @ sample.T * sm_scale).std().item()
    q = q * (logit_std / std)
    return q.to(torch.bfloat16), sm_scale


def attention(q, kv, indices, sm_scale):
    """float32 sparse attention: out [T, H, 512], lse [T, H] (natural log)."""
    gathered = kv[indices.long()].float()  # [T, K, 576]
    scores = torch.einsum("thd,tkd->thk", q.float(), gathered) * sm_scale
    lse = torch.logsumexp(scores, -1)
    probs = torch.exp(scores - lse[..., None])
    return torch.einsum("thk,tkd->thd", probs, gathered[..., :512]), lse


def errors(out, lse, ref_out, ref_lse) -> dict[str, float]:
    d_out = (out.float() - ref_out).flatten()
    d_lse = (lse.float() - ref_lse).abs()
    return {
        "out_max_abs": d_out.abs().max().item(),
        "out_rel_fro": (d_out.norm() / ref_out.flatten().norm()).item(),
        "out_ref_max_abs": ref_out.abs().max().item(),
        "lse_max_abs": d_lse.max().item(),
        "lse_mean_abs": d_lse.mean().item(),
    }


def kv_errors(deq: torch.Tensor, kv: torch.Tensor) -> dict[str, float]:
    x = kv.float()
    d = deq.float() - x
    return {
        "nope_rel_fro": (d[:, :512].norm() / x[:, :512].norm()).item(),
        "rope_rel_fro": (d[:, 512:].norm() / x[:, 512:].norm()).item(),
        "nope_max_abs": d[:, :512].abs().max().item(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", type=Path, help="load the shipped modules from this tree")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--slots", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--kernel", action="store_true", help="also run the Triton kernel")
    ap.add_argument("--kernel-rows", type=int, default=None)
    ap.add_argument("--kernel-topk", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if args.device == "cpu" and args.kernel and not interpret:
        ap.error("--kernel on CPU needs TRITON_INTERPRET=1 (and --tree)")
    codec = _load(args.tree, CODEC)
    tsm = _load(args.tree, KERNEL)
    dev = torch.device(args.device)
    # The interpreter is slow: a smaller kernel shape on CPU unless given.
    k_rows = args.kernel_rows or (2 if interpret else args.rows)
    k_topk = args.kernel_topk or (256 if interpret else args.topk)

    result: dict = {
        "script": "nvfp4_accuracy.py",
        "generated_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "triton_interpret": interpret,
        "shipped_sha256": {
            rel: hashlib.sha256((args.tree / rel).read_bytes()).hexdigest()
            for rel in (CODEC, KERNEL)
        }
        if args.tree is not None
        else None,
        "activations": "synthetic (module docstring): RMS-normalised latent x log-normal "
        "channel gain with 1% outlier channels, rotated RoPE pairs",
        "bytes_per_token": {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352, "bf16": 1152},
        "regimes": {},
    }
    for name, logit_std, outlier_gain in REGIMES:
        gen = torch.Generator().manual_seed(args.seed)
        kv = make_cache(args.slots, outlier_gain, gen)
        q, sm_scale = make_queries(kv, args.rows, args.heads, logit_std, gen)
        indices = torch.stack(
            [torch.randperm(args.slots, generator=gen)[: args.topk] for _ in range(args.rows)]
        ).to(torch.int32)
        ref_out, ref_lse = attention(q, kv, indices, sm_scale)
        records = {
            "fp8_ds_mla": tsm.quantize_fp8_ds_mla(kv),
            "nvfp4_ds_mla": codec.quantize_nvfp4_ds_mla(
                kv[:, :512].contiguous(), kv[:, 512:].contiguous()
            ),
        }
        deq = {
            "fp8_ds_mla": tsm.dequantize_fp8_ds_mla(records["fp8_ds_mla"]),
            "nvfp4_ds_mla": codec.dequantize_nvfp4_ds_mla(records["nvfp4_ds_mla"]),
        }
        entry: dict = {"logit_std": logit_std, "outlier_gain": outlier_gain}
        for fmt in ("fp8_ds_mla", "nvfp4_ds_mla"):
            f_out, f_lse = attention(q, deq[fmt].to(torch.bfloat16), indices, sm_scale)
            entry[fmt] = {
                "kv": kv_errors(deq[fmt], kv),
                "format": errors(f_out, f_lse, ref_out, ref_lse),
            }
            if args.kernel:
                kq = q[:k_rows].to(dev)
                kidx = indices[:k_rows, :k_topk].contiguous()
                r_out, r_lse = attention(q[:k_rows], kv, kidx, sm_scale)
                out, lse = tsm.sparse_mla_fp8_ds_mla_attention(
                    kq, records[fmt].to(dev), kidx.to(dev), sm_scale, record_format=fmt
                )
                entry[fmt]["kernel"] = errors(out.cpu(), lse.cpu(), r_out, r_lse)
                # The kernel against float32 attention over the same records: what
                # the kernel adds to the format's error (bf16 P and output).
                d_out, d_lse = attention(q[:k_rows], deq[fmt].to(torch.bfloat16), kidx, sm_scale)
                entry[fmt]["kernel_vs_format"] = errors(out.cpu(), lse.cpu(), d_out, d_lse)
                entry[fmt]["kernel"]["rows"] = k_rows
                entry[fmt]["kernel"]["topk"] = k_topk
        ratio = {
            k: entry["nvfp4_ds_mla"]["format"][k] / max(entry["fp8_ds_mla"]["format"][k], 1e-30)
            for k in ("out_rel_fro", "lse_max_abs", "lse_mean_abs")
        }
        entry["nvfp4_over_fp8"] = ratio
        result["regimes"][name] = entry
        f4, f8 = entry["nvfp4_ds_mla"]["format"], entry["fp8_ds_mla"]["format"]
        print(
            f"{name:20s} out rel {f8['out_rel_fro']:.4f} (fp8) {f4['out_rel_fro']:.4f} (nvfp4)"
            f"  lse max {f8['lse_max_abs']:.4f} / {f4['lse_max_abs']:.4f}"
            f"  lse mean {f8['lse_mean_abs']:.5f} / {f4['lse_mean_abs']:.5f}",
            flush=True,
        )
    write_result(args.out, result, gpus=args.device != "cpu")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
