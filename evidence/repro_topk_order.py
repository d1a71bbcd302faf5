# SPDX-License-Identifier: Apache-2.0
"""GPU repro: is the DSA indexer's top-k selection repeatable, and does its order matter?

Stock vLLM 0.33.0 does not repeat itself on DSA models once the context exceeds the indexer's
top-k (design/dcp-gates.md: the same request twice, prefix caching off, moves log-probs by up
to 1.88). The suspected cause is the prefill top-k kernel (``top_k_per_row_prefill``) writing
its selection through shared-memory atomics, so that the ORDER of the selected indices changes
from call to call, and the sparse attention then sums the records in a different order. This
script tests each link on the real kernels of the installed vLLM, on one GPU:

1. ``order``: the same fp32 logits through ``top_k_per_row_prefill`` / ``_decode`` several
   times: rows whose index order differs, rows whose index SET differs (from ties at the
   threshold), per shape; also on logits with many exact ties.
2. ``attention``: FlashMLA's sparse fp8 decode kernel on the same query and cache, with each
   row's indices permuted: is its output bit-identical (order-independent) or not.
3. ``fix``: the same top-k followed by an in-place per-row sort: repeatable order, and the
   sort's time at prefill-chunk shapes.

Run on the GPU machine with the staged vLLM importable (``source .gpu/device-env.sh``):
    python3 evidence/repro_topk_order.py --out $OUT/topk-order-h200.json
Writes one JSON file (command, revision, vLLM version, machine, figures). About 20 s warm.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import command, git_revision  # noqa: E402


def topk_prefill(logits: torch.Tensor, ends: torch.Tensor, k: int) -> torch.Tensor:
    from vllm import _custom_ops as ops

    rows = logits.shape[0]
    out = torch.full((rows, k), -7, dtype=torch.int32, device=logits.device)
    starts = torch.zeros_like(ends)
    ops.top_k_per_row_prefill(
        logits, starts, ends, out, rows, logits.stride(0), logits.stride(1), k
    )
    return out


def topk_decode(logits: torch.Tensor, seq_lens: torch.Tensor, k: int) -> torch.Tensor:
    from vllm import _custom_ops as ops

    rows = logits.shape[0]
    out = torch.full((rows, k), -7, dtype=torch.int32, device=logits.device)
    ops.top_k_per_row_decode(logits, 1, seq_lens, out, rows, logits.stride(0), logits.stride(1), k)
    return out


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, int]:
    """Rows whose index order differs, and rows whose index set differs."""
    order = int((a != b).any(dim=1).sum())
    sets = int((a.sort(dim=1).values != b.sort(dim=1).values).any(dim=1).sum())
    return {"rows_order_differs": order, "rows_set_differs": sets}


def order_case(kind: str, rows: int, ctx: int, k: int, ties: bool, calls: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(rows * 31 + ctx + k)
    logits = torch.randn(rows, ctx, device="cuda", generator=g)
    if ties:  # many exactly equal values: a coarse grid
        logits = (logits * 8).round() / 8
    if kind == "prefill":
        # causal rows: row i sees the first ctx - rows + i + 1 keys
        ends = torch.arange(ctx - rows + 1, ctx + 1, device="cuda", dtype=torch.int32)
        run = lambda: topk_prefill(logits, ends, k)  # noqa: E731
    else:
        seq_lens = torch.full((rows,), ctx, device="cuda", dtype=torch.int32)
        run = lambda: topk_decode(logits, seq_lens, k)  # noqa: E731
    first = run()
    worst = {"rows_order_differs": 0, "rows_set_differs": 0}
    for _ in range(calls - 1):
        c = compare(first, run())
        worst = {key: max(worst[key], c[key]) for key in worst}
    torch.cuda.synchronize()
    return {
        "kind": kind,
        "rows": rows,
        "ctx": ctx,
        "topk": k,
        "ties": ties,
        "calls": calls,
        **worst,
    }


def attention_order_case(batch: int, heads: int, k: int) -> dict[str, Any]:
    """FlashMLA sparse fp8 decode with each row's indices permuted: bit-identical or not."""
    from bench_sparse_mla_kernel import FlashMLA  # FlashMLASparseImpl's call, one place
    from vllm.v1.attention.ops import flashmla

    ok, reason = flashmla.is_flashmla_sparse_supported()
    if not ok:
        return {"skipped": reason}
    g = torch.Generator(device="cuda").manual_seed(7)
    slots = 1 << 16
    # random fp8_ds_mla records: fp8 NoPE bytes, positive scales, bf16 RoPE
    cache = torch.randint(0, 120, (slots, 656), dtype=torch.uint8, device="cuda", generator=g)
    scales = torch.rand(slots, 4, device="cuda", generator=g) * 0.01 + 1e-3
    cache[:, 512:528] = scales.view(torch.uint8)
    rope = torch.randn(slots, 64, device="cuda", generator=g).to(torch.bfloat16)
    cache[:, 528:] = rope.view(torch.uint8)
    block = 64
    q = torch.randn(batch, 1, heads, 576, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.stack(
        [torch.randperm(slots, device="cuda", generator=g)[:k] for _ in range(batch)]
    ).to(torch.int32)
    perm = torch.stack([torch.randperm(k, device="cuda", generator=g) for _ in range(batch)])
    idx_perm = torch.gather(idx, 1, perm)
    index_sets = [idx.view(batch, 1, k), idx.view(batch, 1, k), idx_perm.view(batch, 1, k)]
    calls = FlashMLA().calls(q, cache.view(slots // block, block, 656), index_sets, 576**-0.5)
    results = []
    for call in calls:
        out, lse = call()
        results.append((out[:, :, :heads].float(), lse))
    (o1, l1), (o2, _), (o3, l3) = results
    return {
        "batch": batch,
        "heads": heads,
        "topk": k,
        "same_order_bit_identical": bool(torch.equal(o1, o2)),
        "permuted_bit_identical": bool(torch.equal(o1, o3)),
        "permuted_max_abs_out_diff": float((o1 - o3).abs().max()),
        "permuted_max_abs_lse_diff": float((l1.float() - l3.float()).abs().max()),
    }


def fix_case(rows: int, ctx: int, k: int, calls: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(11)
    logits = torch.randn(rows, ctx, device="cuda", generator=g)
    ends = torch.arange(ctx - rows + 1, ctx + 1, device="cuda", dtype=torch.int32)

    def run():
        out = topk_prefill(logits, ends, k)
        # -1 (unused slot) sorts first; FlashMLA and the series' kernels skip it anywhere
        return out.sort(dim=1).values

    first = run()
    worst = 0
    for _ in range(calls - 1):
        worst = max(worst, int((first != run()).any(dim=1).sum()))
    sel = topk_prefill(logits, ends, k)
    for _ in range(3):
        sel.sort(dim=1)
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    n = 20
    for _ in range(n):
        sel.sort(dim=1)
    t1.record()
    torch.cuda.synchronize()
    t_sort = t0.elapsed_time(t1) / n
    t0.record()
    for _ in range(n):
        topk_prefill(logits, ends, k)
    t1.record()
    torch.cuda.synchronize()
    t_topk = t0.elapsed_time(t1) / n
    return {
        "rows": rows,
        "ctx": ctx,
        "topk": k,
        "calls": calls,
        "rows_differ_after_sort": worst,
        "sort_ms": round(t_sort, 4),
        "topk_ms": round(t_topk, 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args(argv)
    import vllm

    result: dict[str, Any] = {
        "kind": "topk_order_repro",
        "command": command(),
        "revision": git_revision(),
        "base": {"vllm": vllm.__version__, "vllm_path": str(Path(vllm.__file__).parent)},
        "machine": {
            "hostname": platform.node(),
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "order": [],
        "attention": [],
        "fix": [],
        "errors": [],
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    cases = [
        ("prefill", 1024, 4096, 512, False),
        ("prefill", 4096, 8192, 512, False),
        ("prefill", 8192, 32768, 2048, False),
        ("prefill", 4096, 8192, 512, True),
        ("decode", 64, 8192, 512, False),
        ("decode", 64, 32768, 2048, False),
        ("decode", 64, 8192, 512, True),
    ]
    for case in cases:
        try:
            r = order_case(*case, calls=args.calls)
            print("order", r, flush=True)
            result["order"].append(r)
        except Exception as e:  # noqa: BLE001 - recorded as evidence
            result["errors"].append(f"order {case}: {type(e).__name__}: {e}")
        save()
    for batch, heads in ((1, 16), (8, 64)):
        try:
            r = attention_order_case(batch, heads, 2048)
            print("attention", r, flush=True)
            result["attention"].append(r)
        except Exception as e:  # noqa: BLE001
            result["errors"].append(f"attention {batch}x{heads}: {type(e).__name__}: {e}")
        save()
    for rows, ctx, k in ((8192, 32768, 512), (8192, 32768, 2048)):
        try:
            r = fix_case(rows, ctx, k, args.calls)
            print("fix", r, flush=True)
            result["fix"].append(r)
        except Exception as e:  # noqa: BLE001
            result["errors"].append(f"fix {rows}x{ctx}x{k}: {type(e).__name__}: {e}")
        save()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    print("wrote", args.out)
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
