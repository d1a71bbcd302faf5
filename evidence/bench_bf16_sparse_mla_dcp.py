# SPDX-License-Identifier: Apache-2.0
"""GPU benchmark (vLLM 0.34.0 + the series): the two sparse-MLA kernels that can serve decode
context parallelism on a bf16 KV cache on Hopper, on the same inputs, each WITH its softmax
LSE (what the DCP merge needs):

- ``fa3``: FLASH_ATTN_MLA_SPARSE as patch 0005 calls it: ``FlashAttnMLASparseImpl.
  _forward_mqa_kernel`` of the patched tree (FA3 paged varlen, page size 1, the local top-k as
  block table, ``seqused_k`` = local count, ``return_softmax_lse=True``, then
  ``dcp_partial_from_fa3_varlen``: LSE to ``[T, H]``, empty rows to (0, -inf));
- ``flashmla``: FLASHMLA_SPARSE as 0.34.0 calls it on a bf16 cache under DCP:
  ``FlashMLASparseImpl._bf16_flash_mla_kernel`` (``flash_mla_sparse_fwd`` with
  ``topk_length``; heads padded to 64 unless its SM90 small-head rule takes 8/16/32 heads
  unpadded), then what ``_forward_bf16_kv`` does with the result under DCP (LSE of empty rows
  to -inf, ``attn_out.contiguous()``).

Both get one rank's DCP partial problem: the query of the DCP-gathered heads ``[T, H, 576]``
(512 latent + 64 RoPE), the rank's bf16 KV rows, and per token the rank's share of the global
top-k already localised (valid slots first, ``-1`` after, ``count`` about top-k / DCP; one row
with nothing on this rank when T >= 4). The localisation itself (``triton_filter_and_convert_
dcp_index`` for FlashMLA, ``SparseMLACommonImpl.forward_mqa`` for FA3) is not timed: it is the
same work on either side. Outputs are compared with each other and with an fp32 reference
(max |d out|, max |d LSE| over rows that own something; empty rows must be exactly (0, -inf)),
so the times compare equal work.

Grid: gathered heads 16, 32, 64, 128 (GLM-5: 64 heads, V3.2: 128 heads, over TP 2/4/8 with
DCP 2/4; ``GEOMETRIES`` lists which configuration gives which count), global top-k 2048 and
512, DCP 2 and 4, decode rows 1..64 and one extend shape (``EXTEND_ROWS`` tokens). Per case and
backend: eager times (cuda events, rounds interleaving the two backends) and CUDA-graph
replayed times (vLLM decodes under graphs), each as median with p10/p90/min/max; ratios
``flashmla_over_fa3`` (> 1: FA3 faster). The JSON also records each backend's SM coverage: the
compute capabilities its selector accepts, evaluated from the imported classes.

    python3 evidence/bench_bf16_sparse_mla_dcp.py --out OUT.json --deadline-s 150

Needs one SM90 GPU (FA3 is SM90-only) and the patched tree importable (``--vllm-tree`` puts a
tree first on sys.path; the device's ``VARIANT=patched`` environment does the same). The JSON
is rewritten after every case and by a watchdog at ``--deadline-s`` (the process then exits
124), so a killed run keeps what it measured. Exit 1 when a case's outputs disagree beyond
``--atol`` or a case failed. Expected: about 60-90 s on one H200 (no JIT: both kernels ship
compiled in the wheel).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_timing import (  # noqa: E402
    Deadline,
    capture_graph,
    event_times,
    ratio,
    repetitions,
    spread,
)  # noqa: E402

KV_LORA_RANK = 512
ROPE_DIM = 64
HEAD_DIM = KV_LORA_RANK + ROPE_DIM
# DeepSeek-V3.2 and GLM-5: qk_nope_head_dim 128 (V3.2) / 192 (GLM-5) + RoPE 64. The scale only
# sets how peaked the softmax is; both backends get the same one.
SOFTMAX_SCALE = (128 + ROPE_DIM) ** -0.5
BLOCK_SIZE = 64
KV_POOL_ROWS = 1 << 16  # one rank's KV rows the indices point into
TOPKS = (2048, 512)
DCPS = (2, 4)
DECODE_ROWS = (1, 4, 16, 64, 2, 8, 32)
EXTEND_ROWS = 2048
# (model, attention heads, TP, DCP): the kernel sees heads / TP * DCP gathered heads.
GEOMETRIES = (
    ("GLM-5", 64, 8, 2),
    ("GLM-5", 64, 4, 2),
    ("GLM-5", 64, 8, 4),
    ("GLM-5", 64, 4, 4),
    ("DeepSeek-V3.2", 128, 8, 2),
    ("DeepSeek-V3.2", 128, 8, 4),
    ("DeepSeek-V3.2", 128, 4, 4),
)
BACKENDS = ("fa3", "flashmla")
SM_PROBE = ((8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))


# ----------------------------------------------------------------------------- pure parts


def gathered_heads(num_heads: int, tp: int, dcp: int) -> int:
    """Query heads one rank's kernel sees under DCP: its TP share, all-gathered over DCP."""
    if tp <= 0 or dcp <= 0 or num_heads % tp or tp % dcp:
        raise ValueError(f"invalid heads={num_heads} tp={tp} dcp={dcp}")
    return num_heads // tp * dcp


def heads_by_geometry() -> dict[int, list[str]]:
    """Gathered head count -> the configurations that give it."""
    out: dict[int, list[str]] = {}
    for model, heads, tp, dcp in GEOMETRIES:
        out.setdefault(gathered_heads(heads, tp, dcp), []).append(
            f"{model} ({heads} heads) TP{tp} DCP{dcp}"
        )
    return dict(sorted(out.items()))


def local_topk_counts(rows: int, topk: int, dcp: int, seed: int) -> list[int]:
    """How many of each token's global top-k a rank owns: about topk / dcp, varied by up to
    1/8 either way (deterministic in ``seed``), capped to [1, topk]; the middle row of a batch
    of >= 4 rows owns nothing (the merge-identity case)."""
    if rows <= 0 or topk <= 0 or dcp <= 0:
        raise ValueError(f"invalid rows={rows} topk={topk} dcp={dcp}")
    base = topk // dcp
    jitter = max(1, base // 8)
    counts = []
    state = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    for _ in range(rows):
        state = (state * 1103515245 + 12345) & 0x7FFFFFFF
        offset = state % (2 * jitter + 1) - jitter
        counts.append(min(topk, max(1, base + offset)))
    if rows >= 4:
        counts[rows // 2] = 0
    return counts


def cases(quick: bool) -> list[dict[str, Any]]:
    """Decode cases first (the row counts of DECODE_ROWS in that order, so a deadline cut loses
    the least informative ones), then the extend shape."""
    heads = sorted(heads_by_geometry())
    rows = DECODE_ROWS[:3] if quick else DECODE_ROWS
    out = [
        {"kind": "decode", "heads": h, "topk": k, "dcp": d, "rows": r}
        for r in rows
        for k in TOPKS
        for d in DCPS
        for h in heads
    ]
    out += [
        {"kind": "extend", "heads": h, "topk": k, "dcp": d, "rows": EXTEND_ROWS}
        for k in TOPKS
        for d in DCPS
        for h in heads
        if not quick or h == 32
    ]
    return out


def case_key(case: dict[str, Any]) -> str:
    return f"{case['kind']} h{case['heads']} topk{case['topk']} dcp{case['dcp']} rows{case['rows']}"


def summarize(done: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (kind, heads): the range of the CUDA-graph ratio flashmla / fa3 over the cases that
    agreed; and overall counts."""
    by: dict[str, list[float]] = {}
    for c in done:
        r = c.get("ratios", {}).get("flashmla_over_fa3_graph")
        if r is None or not c.get("agree"):
            continue
        by.setdefault(f"{c['kind']} h{c['heads']}", []).append(r)
    return {
        "cases": len(done),
        "cases_agree": sum(1 for c in done if c.get("agree")),
        "flashmla_over_fa3_graph": {
            k: {"min": min(v), "median": sorted(v)[len(v) // 2], "max": max(v), "n": len(v)}
            for k, v in sorted(by.items())
        },
        "reading": "ratio > 1: FA3 (patch 0005) faster than FlashMLA-sparse bf16 at that shape",
    }


# ----------------------------------------------------------------------------- GPU parts


def import_backends(vllm_tree: str | None):
    if vllm_tree:
        sys.path.insert(0, vllm_tree)
    from vllm.v1.attention.backends.mla import flashattn_mla_sparse as fa
    from vllm.v1.attention.backends.mla import flashmla_sparse as fm

    if not getattr(fa.FlashAttnMLASparseImpl, "can_return_lse_for_decode", False):
        raise SystemExit(
            f"{fa.__file__} is stock 0.34.0 (no FA3 LSE for DCP): run with the patched tree "
            "(patch 0005) first on sys.path (--vllm-tree)"
        )
    return fa, fm


def sm_coverage(fa, fm) -> dict[str, Any]:
    """Which compute capabilities each backend's selector accepts (evaluated), and what else
    gates it (read from the sources)."""
    from vllm.platforms.interface import DeviceCapability

    def probe(cls) -> dict[str, bool]:
        return {
            f"{a}.{b}": bool(cls.supports_compute_capability(DeviceCapability(a, b)))
            for a, b in SM_PROBE
        }

    return {
        "FLASH_ATTN_MLA_SPARSE": {
            "supports_compute_capability": probe(fa.FlashAttnMLASparseBackend),
            "also_requires": "flash_attn_supports_mla(): FA3 importable and device "
            "capability family 90 (fa_utils.py); kv cache auto/bfloat16/float16 only",
            "dcp": "with patch 0005 only (stock 0.34.0 refuses DCP>1)",
        },
        "FLASHMLA_SPARSE": {
            "supports_compute_capability": probe(fm.FlashMLASparseBackend),
            "also_requires": "head_size 512 (NoPE) only on SM90; nvfp4_ds_mla only on SM100",
            "dcp": "stock 0.34.0 on a bf16 cache (the bf16 kernel returns the LSE for every "
            "token); fp8_ds_mla only on the mixed-batch path",
        },
    }


def make_inputs(case: dict[str, Any], seed: int, dev: str = "cuda", pool_rows: int = KV_POOL_ROWS):
    """The query, this rank's KV rows (whole blocks), its localised top-k (valid first, -1
    after) and counts."""
    import torch

    if pool_rows % BLOCK_SIZE:
        raise ValueError(f"pool_rows {pool_rows} is not a whole number of {BLOCK_SIZE}-row blocks")
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows, heads, topk = case["rows"], case["heads"], case["topk"]
    q = torch.randn((rows, heads, HEAD_DIM), generator=gen, device=dev).to(torch.bfloat16)
    kv = torch.randn((pool_rows, HEAD_DIM), generator=gen, device=dev).to(torch.bfloat16)
    counts = torch.tensor(
        local_topk_counts(rows, topk, case["dcp"], seed), dtype=torch.int32, device=dev
    )
    idx = torch.empty((rows, topk), dtype=torch.int32, device=dev)
    for start in range(0, rows, 256):
        stop = min(rows, start + 256)
        keys = torch.rand((stop - start, pool_rows), generator=gen, device=dev)
        idx[start:stop] = keys.topk(topk, dim=1).indices.to(torch.int32)
    cols = torch.arange(topk, device=dev).view(1, -1)
    idx.masked_fill_(cols >= counts.view(-1, 1), -1)
    return q, kv, idx, counts


def reference(q, kv, idx, counts, chunk_rows: int = 64):
    """fp32 attention over each row's valid entries: out [T, H, 512], natural-log LSE [T, H]."""
    import torch

    outs, lses = [], []
    cols = torch.arange(idx.shape[1], device=idx.device).view(1, -1)
    for s in range(0, q.shape[0], chunk_rows):
        e = min(q.shape[0], s + chunk_rows)
        valid = cols < counts[s:e].view(-1, 1)
        rows = kv[idx[s:e].clamp(min=0).long()].float()  # [t, k, 576]
        scores = torch.einsum("thd,tkd->thk", q[s:e].float(), rows) * SOFTMAX_SCALE
        scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
        outs.append(torch.einsum("thk,tkd->thd", p, rows[..., :KV_LORA_RANK]))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def fa3_runner(fa, q, kv, idx, counts):
    """patch 0005's FA3 call on this rank's partial (the impl's method on a bare instance)."""
    import torch

    impl = object.__new__(fa.FlashAttnMLASparseImpl)
    impl.kv_lora_rank = KV_LORA_RANK
    impl.qk_rope_head_dim = ROPE_DIM
    impl.scale = SOFTMAX_SCALE
    impl.dcp_world_size, impl.dcp_rank = 2, 0
    impl.need_to_return_lse_for_decode = True
    impl.cu_seqlens_q_buffer = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    cache = kv.view(-1, BLOCK_SIZE, HEAD_DIM)

    def run():
        return impl._forward_mqa_kernel(
            q, cache, idx, counts, layer=None, block_size=BLOCK_SIZE, is_decode=True
        )

    return run


def flashmla_runner(fm, q, kv, idx, counts):
    """0.34.0's FlashMLA-sparse bf16 call under DCP (``_bf16_flash_mla_kernel`` on a bare
    instance, then ``_forward_bf16_kv``'s DCP epilogue)."""
    import torch

    impl = object.__new__(fm.FlashMLASparseImpl)
    impl.softmax_scale = SOFTMAX_SCALE
    impl.prefill_padding = 64
    # (132 = an H100/H200's SMs, for the CPU test's stand-in only)
    impl._sm_count = (
        torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    )
    heads = q.shape[1]

    def run():
        out, lse = impl._bf16_flash_mla_kernel(q, kv, idx, counts, heads)
        lse.masked_fill_((counts == 0).view(-1, 1), float("-inf"))
        return out.contiguous(), lse

    return run


def compare(results: dict[str, Any], ref_out, ref_lse, counts) -> dict[str, Any]:
    import torch

    owned = counts > 0
    empty = ~owned
    report: dict[str, Any] = {}
    for name, (out, lse) in results.items():
        o, l_ = out.float(), lse.float()
        report[name] = {
            "max_abs_out_vs_ref": float((o[owned] - ref_out[owned]).abs().max()),
            "max_abs_lse_vs_ref": float((l_[owned] - ref_lse[owned]).abs().max()),
            # A base-2 LSE would match ref / ln 2 instead.
            "max_abs_lse_vs_ref_log2": float(
                (l_[owned] - ref_lse[owned] / math.log(2.0)).abs().max()
            ),
            "empty_rows_identity": bool(
                torch.all(o[empty] == 0) and torch.all(l_[empty] == float("-inf"))
            ),
            "finite": bool(torch.isfinite(o).all()),
            "out_shape": list(out.shape),
            "lse_shape": list(lse.shape),
            "out_contiguous": bool(out.is_contiguous()),
        }
    (fo, fl), (mo, ml) = results["fa3"], results["flashmla"]
    report["fa3_vs_flashmla"] = {
        "max_abs_out": float((fo.float()[owned] - mo.float()[owned]).abs().max()),
        "max_abs_lse": float((fl.float()[owned] - ml.float()[owned]).abs().max()),
    }
    return report


def graph_samples(fn, iters: int, calls: int) -> list[float]:
    import torch

    graph = capture_graph(fn, calls, warmup=2)
    graph.replay()
    torch.cuda.synchronize()
    return [t / calls for t in event_times(graph.replay, iters)]


def run_case(fa, fm, case: dict[str, Any], seed: int, args) -> dict[str, Any]:
    import torch

    t0 = time.monotonic()
    q, kv, idx, counts = make_inputs(case, seed)
    runners = {
        "fa3": fa3_runner(fa, q, kv, idx, counts),
        "flashmla": flashmla_runner(fm, q, kv, idx, counts),
    }
    results = {n: tuple(t.clone() for t in r()) for n, r in runners.items()}
    ref_out, ref_lse = reference(q, kv, idx, counts)
    check = compare(results, ref_out, ref_lse, counts)
    agree = all(
        check[n]["max_abs_out_vs_ref"] <= args.atol
        and check[n]["max_abs_lse_vs_ref"] <= args.atol
        and check[n]["empty_rows_identity"]
        and check[n]["finite"]
        for n in BACKENDS
    )
    del results, ref_out, ref_lse
    # Repetitions from a first eager call of the slower backend; eager rounds interleave the
    # two backends so that clock drift hits both.
    first = max(spread(event_times(r, 3))["median"] for r in runners.values())
    iters = repetitions(first, args.target_ms, 10, args.iters)
    calls = repetitions(first, 2.0, 1, args.graph_calls)
    eager: dict[str, list[float]] = {n: [] for n in BACKENDS}
    for _ in range(args.rounds):
        for n in BACKENDS:
            runners[n]()
            torch.cuda.synchronize()
            eager[n] += event_times(runners[n], max(1, iters // args.rounds))
    graph = {n: graph_samples(runners[n], iters, calls) for n in BACKENDS}
    timings = {
        n: {"eager_ms": spread(eager[n]), "graph_ms": spread(graph[n]), "graph_calls": calls}
        for n in BACKENDS
    }
    return {
        **case,
        "seed": seed,
        "local_count_mean": float(counts.float().mean()),
        "rows_owning_nothing": int((counts == 0).sum()),
        "check": check,
        "agree": agree,
        "timings": timings,
        "ratios": {
            "flashmla_over_fa3_graph": ratio(
                timings["flashmla"]["graph_ms"]["median"], timings["fa3"]["graph_ms"]["median"]
            ),
            "flashmla_over_fa3_eager": ratio(
                timings["flashmla"]["eager_ms"]["median"], timings["fa3"]["eager_ms"]["median"]
            ),
        },
        "case_s": round(time.monotonic() - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline-s", type=float, default=150.0, help="hard wall-clock bound")
    ap.add_argument("--quick", action="store_true", help="rows 1/4/16 and one extend head count")
    ap.add_argument("--vllm-tree", help="a patched vLLM tree to import first")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--graph-calls", type=int, default=10)
    ap.add_argument("--target-ms", type=float, default=30.0)
    ap.add_argument("--atol", type=float, default=2e-2, help="vs the fp32 reference")
    args = ap.parse_args(argv)
    deadline = Deadline(args.deadline_s)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    fa, fm = import_backends(args.vllm_tree)
    import vllm
    from provenance import command, git_revision, machine, write_json_atomic

    todo = cases(args.quick)
    lock = threading.Lock()
    done: list[dict[str, Any]] = []
    errors: list[str] = []
    record: dict[str, Any] = {
        "kind": "bf16_sparse_mla_dcp_kernels",
        "base": f"vllm {vllm.__version__}",
        "what": "one rank's DCP partial (out + LSE) on a bf16 cache: patch 0005's FA3 call vs "
        "0.34.0's FlashMLA-sparse bf16 call, same inputs; localisation not timed",
        "command": command(),
        "git_revision": git_revision(),
        "machine": machine(),
        "fa_module": fa.__file__,
        "flashmla_module": fm.__file__,
        "softmax_scale": SOFTMAX_SCALE,
        "kv_pool_rows": KV_POOL_ROWS,
        "heads_by_geometry": {str(k): v for k, v in heads_by_geometry().items()},
        "sm_coverage": sm_coverage(fa, fm),
        "atol": args.atol,
        "deadline_s": args.deadline_s,
        "cases_planned": len(todo),
    }

    def write(state: str) -> None:
        with lock:
            record.update(
                state=state,
                wall_s=round(deadline.elapsed(), 1),
                cases=list(done),
                not_run=[case_key(c) for c in todo[len(done) + len(errors) :]],
                errors=list(errors),
                summary=summarize(done),
            )
            write_json_atomic(args.out, record)

    def on_deadline() -> None:
        write("killed_by_deadline")
        print(f"deadline {args.deadline_s}s reached; partial results in {args.out}", flush=True)
        os._exit(124)

    deadline.arm(on_deadline)
    write("running")
    last_s = 5.0
    for i, case in enumerate(todo):
        if not deadline.allows(2 * last_s, margin_s=3.0):
            break
        try:
            result = run_case(fa, fm, case, 1000 + i, args)
        except Exception as exc:  # recorded; the run goes on and exits 1
            with lock:
                errors.append(f"{case_key(case)}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"ERROR {case_key(case)}: {exc!r}"[:400], flush=True)
            torch.cuda.empty_cache()
            continue
        last_s = result["case_s"]
        with lock:
            done.append(result)
        write("running")
        r = result["ratios"]
        print(
            f"[{deadline.elapsed():5.1f}s] {case_key(case)} agree={result['agree']} "
            f"fa3 {result['timings']['fa3']['graph_ms']['median'] * 1e3:.1f}us "
            f"flashmla {result['timings']['flashmla']['graph_ms']['median'] * 1e3:.1f}us "
            f"flashmla/fa3 graph x{r['flashmla_over_fa3_graph']:.2f}",
            flush=True,
        )
    deadline.disarm()
    ok = not errors and all(c["agree"] for c in done)
    write("finished" if len(done) + len(errors) == len(todo) else "stopped_for_deadline")
    print(f"agree={ok}; {len(done)}/{len(todo)} cases; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
