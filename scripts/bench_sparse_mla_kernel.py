# SPDX-License-Identifier: Apache-2.0
"""Benchmark the Triton sparse-MLA kernel (fp8_ds_mla records) against FlashMLA-sparse.

Runs on one GPU with the pinned vLLM wheel importable (0.33.0 today; FlashMLA's sparse fp8
decode kernel from vllm.v1.attention.ops.flashmla, called as FlashMLASparseImpl calls it) and
the patched kernel file loaded by path (--kernel-path), so the shipped file is what runs. On
0.33 the kernel imports Triton through vllm.triton_utils, so vLLM must be importable.

Reviewer command (one H200, patched tree at $TREE, from the dcp-series checkout):
    python scripts/bench_sparse_mla_kernel.py \
        --kernel-path $TREE/vllm/v1/attention/ops/triton_sparse_mla.py \
        --git-rev $(git rev-parse --short HEAD) --out results/kernel-bench-h200-0.33.0.json
Not yet run on 0.33.0: results/kernel-bench-h200.json is the vLLM 0.26.0 run.

Same inputs, same run, for both kernels:
  * decode: batch 1..64 rows, 16 and 64 heads, top-k 2048 over a 1M-token cache
    (random slots, so the record reads are scattered like real decode);
  * extend: 4096 rows, each with its own top-k 2048 over a 32k-token context.
Times are medians of triton.testing.do_bench (L2 flushed before every repetition).
For the Triton kernel the default call (no tiling arguments: what a backend gets) is
timed, plus a small grid of tilings and split-KV factors (every point is kept in the
JSON); for decode both kernels are re-timed three more times, interleaved, to show the
run-to-run spread, and speed_ratio_default uses the medians of those four timings.
Figures: time, FlashMLA/Triton ratio (>1 = Triton faster), record-read bandwidth =
selected records x 656 B / time and its share of the H200's 4.8 TB/s, and numerical
agreement (max |diff| of out and LSE between the kernels, and of each against an fp32
torch reference on the smaller shapes).

Writes one JSON file (command, git revision, kernel sha256, machine, figures).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

HBM_BYTES_PER_S = 4.8e12  # H200 datasheet
RECORD_BYTES = 656
TOPK = 2048


def load_kernel(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_sparse_mla_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(fn, warmup: int, rep: int) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second)."""
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 10, 100)
    return 2 * 2 * 1024**3 / (ms * 1e-3)


def reference(kern, q, records, indices, sm_scale):
    """fp32 attention over dequantised records; out [T,H,512], lse [T,H]."""
    kv = kern.dequantize_fp8_ds_mla(records)
    mask = indices >= 0
    gathered = kv[indices.clamp(min=0).long()]
    scores = torch.einsum("thd,tkd->thk", q.float(), gathered) * sm_scale
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None])
    return torch.einsum("thk,tkd->thd", probs, gathered[..., :512]), lse


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.any()):
        return float("nan")
    return float((a.float()[finite] - b.float()[finite]).abs().max())


class FlashMLA:
    """FlashMLA sparse fp8 decode, as FlashMLASparseImpl calls it (heads padded to 64/128)."""

    def __init__(self) -> None:
        from vllm.v1.attention.ops import flashmla

        ok, reason = flashmla.is_flashmla_sparse_supported()
        if not ok:
            raise RuntimeError(reason)
        self.fm = flashmla

    def prepare(self, q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, scale: float):
        """q [B, s_q, H, 576], indices [B, s_q, topk]; returns a no-arg callable."""
        heads = q.shape[2]
        padded = 64 if heads <= 64 else 128
        if heads < padded:
            qp = q.new_zeros(q.shape[0], q.shape[1], padded, q.shape[3])
            qp[:, :, :heads] = q
            q = qp
        sched, _ = self.fm.get_mla_metadata()
        k_cache = cache.view(torch.uint8).unsqueeze(-2)

        def call():
            return self.fm.flash_mla_with_kvcache(
                q=q,
                k_cache=k_cache,
                block_table=None,
                cache_seqlens=None,
                head_dim_v=512,
                tile_scheduler_metadata=sched,
                is_fp8_kvcache=True,
                indices=indices,
                softmax_scale=scale,
            )

        call()  # first call builds the tile-scheduler metadata
        return call


def triton_configs(heads: int) -> list[dict[str, Any]]:
    """(block_h, block_n, num_warps, num_stages) points to time besides the default.

    An earlier sweep on this machine (16 warps, BLOCK_N 16/32, scales folded into
    the scores) found none faster than these; see design/triton-sparse-mla.md.
    """
    if heads <= 16:
        points = [(16, 64, 4, 2), (16, 64, 8, 2), (16, 128, 8, 2)]
    else:
        points = [(64, 64, 8, 2), (64, 64, 8, 3), (64, 128, 8, 1)]
    return [dict(block_h=bh, block_n=bn, num_warps=w, num_stages=st) for bh, bn, w, st in points]


def split_candidates(programs: int, num_sms: int) -> list[int | None]:
    cands: list[int | None] = [None, 1]
    s = 2
    while s <= 64 and programs * s <= 4 * num_sms:
        cands.append(s)
        s *= 2
    return cands


def bench_triton(kern, q, cache, indices, scale, heads, num_sms, args, record_errors):
    best: dict[str, Any] | None = None
    points = []
    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    for cfg in triton_configs(heads):
        bh = cfg["block_h"]
        programs = q.shape[0] * math.ceil(heads / bh)
        for splits in split_candidates(programs, num_sms):
            kw = dict(cfg, num_splits=splits)

            def call(kw=kw):
                return kern.sparse_mla_fp8_ds_mla_attention(
                    q, cache, indices, scale, out=out, lse=lse, **kw
                )

            try:
                call()
                torch.cuda.synchronize()
                ms = median_ms(call, args.warmup, args.rep)
            except Exception as exc:  # a tiling that does not compile or fit
                record_errors.append(f"{kw}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            point = dict(kw, ms=ms)
            points.append(point)
            if best is None or ms < best["ms"]:
                best = point
    return best, points


def decode_case(kern, fm, batch, heads, cache, num_slots, num_sms, args, errors, check_ref):
    gen = torch.Generator(device="cuda").manual_seed(1000 * heads + batch)
    q = torch.randn(batch, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    indices = torch.randint(
        0, num_slots, (batch, TOPK), device="cuda", generator=gen, dtype=torch.int32
    )
    scale = 576**-0.5
    row: dict[str, Any] = dict(kind="decode", batch=batch, heads=heads, topk=TOPK)
    best, points = bench_triton(kern, q, cache, indices, scale, heads, num_sms, args, errors)
    row["triton_points"] = points
    if best is not None:
        row["triton_ms"] = best["ms"]
        row["triton_best"] = {k: v for k, v in best.items() if k != "ms"}
    record_bytes = batch * TOPK * RECORD_BYTES
    row["record_bytes"] = record_bytes
    ours_out = ours_lse = None
    if best is not None:
        kw = {k: v for k, v in best.items() if k != "ms"}
        ours_out, ours_lse = kern.sparse_mla_fp8_ds_mla_attention(q, cache, indices, scale, **kw)
        row["triton_record_TBps"] = record_bytes / (best["ms"] * 1e-3) / 1e12
        row["triton_pct_hbm"] = 100 * record_bytes / (best["ms"] * 1e-3) / HBM_BYTES_PER_S
    out_d = torch.empty(batch, heads, 512, dtype=q.dtype, device=q.device)
    lse_d = torch.empty(batch, heads, dtype=torch.float32, device=q.device)

    def default_call():  # what a caller gets without tiling arguments
        return kern.sparse_mla_fp8_ds_mla_attention(q, cache, indices, scale, out=out_d, lse=lse_d)

    default_call()
    row["triton_default_ms"] = median_ms(default_call, args.warmup, args.rep)
    if fm is not None:
        try:
            call = fm.prepare(q.unsqueeze(1), cache, indices.unsqueeze(1), scale)
            # Interleaved re-timing of both kernels: the spread between runs.
            row["recheck_triton_default_ms"] = []
            row["recheck_flashmla_ms"] = []
            for _ in range(3):
                row["recheck_triton_default_ms"].append(
                    median_ms(default_call, args.warmup, args.rep)
                )
                row["recheck_flashmla_ms"].append(median_ms(call, args.warmup, args.rep))
            fm_ms = median_ms(call, args.warmup, args.rep)
            fm_out, fm_lse = call()
            fm_out = fm_out[:, 0, :heads]
            fm_lse = fm_lse[:, :heads, 0]
            row["flashmla_ms"] = fm_ms
            row["flashmla_record_TBps"] = record_bytes / (fm_ms * 1e-3) / 1e12
            row["flashmla_pct_hbm"] = 100 * record_bytes / (fm_ms * 1e-3) / HBM_BYTES_PER_S
            all_fm = [fm_ms, *row["recheck_flashmla_ms"]]
            all_default = [row["triton_default_ms"], *row["recheck_triton_default_ms"]]
            row["speed_ratio_default"] = statistics.median(all_fm) / statistics.median(all_default)
            if best is not None:
                row["speed_ratio_flashmla_over_triton"] = fm_ms / best["ms"]
                row["speed_over_flashmla"] = row["speed_ratio_flashmla_over_triton"]
                row["maxdiff_out_triton_vs_flashmla"] = max_diff(ours_out, fm_out)
                row["maxdiff_lse_triton_vs_flashmla"] = max_diff(ours_lse, fm_lse)
                row["maxdiff_lse_triton_log2e_vs_flashmla"] = max_diff(
                    ours_lse * math.log2(math.e), fm_lse
                )
            if check_ref:
                rec = cache.view(-1, RECORD_BYTES)
                ref_out, ref_lse = reference(kern, q, rec, indices, scale)
                row["maxdiff_out_flashmla_vs_ref"] = max_diff(fm_out, ref_out)
                row["maxdiff_lse_flashmla_vs_ref"] = max_diff(fm_lse, ref_lse)
        except Exception as exc:
            errors.append(f"flashmla decode b={batch} h={heads}: {exc!r}")
    if check_ref and ours_out is not None:
        rec = cache.view(-1, RECORD_BYTES)
        ref_out, ref_lse = reference(kern, q, rec, indices, scale)
        row["maxdiff_out_triton_vs_ref"] = max_diff(ours_out, ref_out)
        row["maxdiff_lse_triton_vs_ref"] = max_diff(ours_lse, ref_lse)
    return row


def extend_case(kern, fm, heads, args, errors):
    rows, ctx = 4096, 32768
    gen = torch.Generator(device="cuda").manual_seed(7 + heads)
    kv = torch.randn(ctx, 576, device="cuda", generator=gen)
    records = kern.quantize_fp8_ds_mla(kv)
    cache = records.view(ctx // 64, 64, RECORD_BYTES)
    q = torch.randn(rows, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)
    # Row t is the (ctx - rows + t)-th token: its top-k lies in its causal prefix.
    prefix = torch.arange(ctx - rows, ctx, device="cuda")[:, None] + 1
    indices = (torch.rand(rows, TOPK, device="cuda", generator=gen) * prefix).to(torch.int32)
    scale = 576**-0.5
    row: dict[str, Any] = dict(kind="extend", rows=rows, context=ctx, heads=heads, topk=TOPK)
    out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(rows, heads, dtype=torch.float32, device="cuda")
    points = []
    for cfg in triton_configs(heads):

        def call(cfg=cfg):
            return kern.sparse_mla_fp8_ds_mla_attention(
                q, cache, indices, scale, out=out, lse=lse, num_splits=1, **cfg
            )

        try:
            call()
            points.append(dict(cfg, ms=median_ms(call, args.warmup, args.rep)))
        except Exception as exc:
            errors.append(f"extend {cfg}: {type(exc).__name__}: {str(exc)[:200]}")
    row["triton_points"] = points

    def default_call():
        return kern.sparse_mla_fp8_ds_mla_attention(q, cache, indices, scale, out=out, lse=lse)

    default_call()
    row["triton_default_ms"] = median_ms(default_call, args.warmup, args.rep)
    logical = rows * TOPK * RECORD_BYTES
    row["record_bytes_logical"] = logical
    row["record_bytes_unique"] = ctx * RECORD_BYTES
    if points:
        best = min(points, key=lambda p: p["ms"])
        row["triton_ms"] = best["ms"]
        row["triton_best"] = {k: v for k, v in best.items() if k != "ms"}
        row["triton_logical_record_TBps"] = logical / (best["ms"] * 1e-3) / 1e12
        kw = {k: v for k, v in best.items() if k != "ms"}
        ours_out, ours_lse = kern.sparse_mla_fp8_ds_mla_attention(
            q, cache, indices, scale, num_splits=1, **kw
        )
    if fm is not None:
        try:
            # Mixed-batch path of FlashMLASparseImpl: all rows as one batch, s_q = rows.
            call = fm.prepare(q.unsqueeze(0), cache, indices.unsqueeze(0), scale)
            fm_ms = median_ms(call, args.warmup, args.rep)
            fm_out, fm_lse = call()
            row["flashmla_fp8_mixed_ms"] = fm_ms
            row["speed_ratio_default"] = fm_ms / row["triton_default_ms"]
            if points:
                row["speed_ratio_flashmla_over_triton"] = fm_ms / row["triton_ms"]
                row["maxdiff_out_triton_vs_flashmla"] = max_diff(ours_out, fm_out[0, :, :heads])
                row["maxdiff_lse_triton_vs_flashmla"] = max_diff(
                    ours_lse, fm_lse[0, :heads, :].transpose(0, 1)
                )
        except Exception as exc:
            errors.append(f"flashmla extend h={heads}: {exc!r}")
        try:
            # The bf16 prefill kernel on an already upconverted workspace (the separate
            # prefill path for >= 32 heads; the upconversion itself is not timed).
            ws = kern.dequantize_fp8_ds_mla(records).to(torch.bfloat16).unsqueeze(1)
            padded = 64 if heads <= 64 else 128
            qp = q.new_zeros(rows, padded, 576)
            qp[:, :heads] = q
            idx3 = indices.unsqueeze(1)
            bf16_call = lambda: fm.fm.flash_mla_sparse_fwd(qp, ws, idx3, scale)  # noqa: E731
            bf16_call()
            row["flashmla_bf16_prefill_ms"] = median_ms(bf16_call, args.warmup, args.rep)
        except Exception as exc:
            errors.append(f"flashmla bf16 prefill h={heads}: {exc!r}")
    return row


def codec_vs_writer(kern) -> dict[str, Any]:
    """quantize_fp8_ds_mla against vLLM's fp8_ds_mla writer (concat_and_cache_mla)."""
    from vllm import _custom_ops as ops

    n = 8192
    gen = torch.Generator(device="cuda").manual_seed(3)
    kv_c = (torch.randn(n, 512, device="cuda", generator=gen) * 2).to(torch.bfloat16)
    k_pe = torch.randn(n, 64, device="cuda", generator=gen).to(torch.bfloat16)
    kv_c[7, :128] = 0
    cache = torch.zeros(n // 64, 64, RECORD_BYTES, dtype=torch.uint8, device="cuda")
    slots = torch.arange(n, device="cuda")
    ops.concat_and_cache_mla(
        kv_c, k_pe, cache, slots, kv_cache_dtype="fp8_ds_mla", scale=torch.ones((), device="cuda")
    )
    theirs = cache.view(n, RECORD_BYTES)
    ours = kern.quantize_fp8_ds_mla(torch.cat([kv_c, k_pe], dim=-1))
    diff = ours != theirs
    res: dict[str, Any] = dict(
        records=n,
        records_differ=int(diff.any(dim=1).sum()),
        bytes_differ_nope=int(diff[:, :512].sum()),
        bytes_differ_scales=int(diff[:, 512:528].sum()),
        bytes_differ_rope=int(diff[:, 528:].sum()),
    )
    # The same math with a Python-scalar divisor (reciprocal multiply on CUDA).
    amax = kv_c.float().view(n, 4, 128).abs().amax(-1)
    scalar_scale = torch.clamp(amax / 448.0, min=torch.finfo(torch.float32).tiny)
    theirs_scale = theirs[:, 512:528].contiguous().view(torch.float32)
    res["scales_differ_if_scalar_divisor"] = int((scalar_scale != theirs_scale).sum())
    d = (kern.dequantize_fp8_ds_mla(ours) - kern.dequantize_fp8_ds_mla(theirs)).abs()
    res["dequant_max_abs_diff"] = float(d.max())
    bad = diff[:, :512].nonzero()[:5].tolist()
    res["first_nope_mismatches"] = [
        dict(
            row=r,
            col=c,
            ours=int(ours[r, c]),
            theirs=int(theirs[r, c]),
            x=float(kv_c[r, c]),
            scale=float(theirs_scale[r, c // 128]),
        )
        for r, c in bad
    ]
    return res


def empty_row_conventions(kern, fm) -> dict[str, Any]:
    """What each kernel returns for a row with no valid index."""
    q = torch.randn(2, 64, 576, device="cuda").to(torch.bfloat16)
    records = kern.quantize_fp8_ds_mla(torch.randn(128, 576, device="cuda"))
    cache = records.view(2, 64, RECORD_BYTES)
    indices = torch.randint(0, 128, (2, TOPK), device="cuda", dtype=torch.int32)
    indices[0] = -1
    out, lse = kern.sparse_mla_fp8_ds_mla_attention(q, cache, indices, 0.05)
    res: dict[str, Any] = dict(
        triton_empty_lse=float(lse[0, 0]), triton_empty_out_absmax=float(out[0].abs().max())
    )
    if fm is not None:
        fo, fl = fm.prepare(q.unsqueeze(1), cache, indices.unsqueeze(1), 0.05)()
        res["flashmla_empty_lse"] = float(fl[0, 0, 0])
        res["flashmla_empty_out_absmax"] = float(fo[0].abs().max())
    # Duplicates: a row with every index equal to one slot vs one index and -1 elsewhere.
    dup = torch.full((2, TOPK), -1, device="cuda", dtype=torch.int32)
    dup[0, :] = 5
    dup[1, 0] = 5
    q[1] = q[0]
    _, lse_d = kern.sparse_mla_fp8_ds_mla_attention(q, cache, dup, 0.05)
    res["triton_dup_lse_gap"] = float((lse_d[0] - lse_d[1]).mean())
    res["log_topk"] = math.log(TOPK)
    if fm is not None:
        _, fl = fm.prepare(q.unsqueeze(1), cache, dup.unsqueeze(1), 0.05)()
        res["flashmla_dup_lse_gap"] = float((fl[0, :, 0] - fl[1, :, 0]).mean())
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel-path", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--git-rev", default="unknown", help="revision of dcp-series")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--heads", default="16,64")
    parser.add_argument("--warmup", type=int, default=10, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=int, default=60, help="do_bench repetition, ms")
    parser.add_argument("--no-extend", action="store_true")
    args = parser.parse_args(argv)

    import triton

    kern = load_kernel(args.kernel_path)
    props = torch.cuda.get_device_properties(0)
    result: dict[str, Any] = dict(
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        git_revision=args.git_rev,
        kernel_path=str(args.kernel_path),
        kernel_sha256=hashlib.sha256(args.kernel_path.read_bytes()).hexdigest(),
        machine=dict(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            torch=torch.__version__,
            triton=triton.__version__,
            cuda=torch.version.cuda,
            python=platform.python_version(),
        ),
        hbm_datasheet_Bps=HBM_BYTES_PER_S,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        decode=[],
        extend=[],
        errors=[],
    )
    errors: list[str] = result["errors"]

    def flush() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")

    try:
        import vllm

        result["machine"]["vllm"] = vllm.__version__
        result["base"] = f"vllm {vllm.__version__}"
        fm: FlashMLA | None = FlashMLA()
    except Exception as exc:
        errors.append(f"FlashMLA unavailable: {exc!r}")
        fm = None

    result["copy_Bps_measured"] = copy_bandwidth()
    num_sms = props.multi_processor_count
    num_slots = 1 << 20
    gen = torch.Generator(device="cuda").manual_seed(0)
    records = torch.empty(num_slots, RECORD_BYTES, dtype=torch.uint8, device="cuda")
    for start in range(0, num_slots, 1 << 18):
        chunk = torch.randn(1 << 18, 576, device="cuda", generator=gen)
        records[start : start + (1 << 18)] = kern.quantize_fp8_ds_mla(chunk)
    cache = records.view(num_slots // 64, 64, RECORD_BYTES)

    try:
        result["conventions"] = empty_row_conventions(kern, fm)
    except Exception:
        errors.append("conventions: " + traceback.format_exc()[-400:])
    try:
        result["codec_vs_writer"] = codec_vs_writer(kern)
    except Exception:
        errors.append("codec: " + traceback.format_exc()[-400:])
    flush()

    for heads in [int(h) for h in args.heads.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            try:
                row = decode_case(
                    kern, fm, batch, heads, cache, num_slots, num_sms, args, errors, batch <= 8
                )
                result["decode"].append(row)
            except Exception:
                errors.append(f"decode b={batch} h={heads}: " + traceback.format_exc()[-600:])
            flush()
    del records, cache
    torch.cuda.empty_cache()
    if not args.no_extend:
        for heads in [int(h) for h in args.heads.split(",")]:
            try:
                result["extend"].append(extend_case(kern, fm, heads, args, errors))
            except Exception:
                errors.append(f"extend h={heads}: " + traceback.format_exc()[-600:])
            flush()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    flush()

    print(
        f"{'case':<22}{'triton ms':>10}{'flashmla ms':>12}{'FM/T':>7}{'T %HBM':>8}"
        f"{'FM %HBM':>8}{'d_out':>9}{'d_lse':>9}{'dflt ms':>9}{'FM/d':>6}  best"
    )
    for row in result["decode"] + result["extend"]:
        name = (
            f"decode b={row['batch']} h={row['heads']}"
            if row["kind"] == "decode"
            else f"extend {row['rows']} h={row['heads']}"
        )
        fm_ms = row.get("flashmla_ms", row.get("flashmla_fp8_mixed_ms", float("nan")))
        print(
            f"{name:<22}{row.get('triton_ms', float('nan')):>10.4f}{fm_ms:>12.4f}"
            f"{row.get('speed_ratio_flashmla_over_triton', float('nan')):>7.2f}"
            f"{row.get('triton_pct_hbm', float('nan')):>8.1f}"
            f"{row.get('flashmla_pct_hbm', float('nan')):>8.1f}"
            f"{row.get('maxdiff_out_triton_vs_flashmla', float('nan')):>9.4f}"
            f"{row.get('maxdiff_lse_triton_vs_flashmla', float('nan')):>9.4f}"
            f"{row.get('triton_default_ms', float('nan')):>9.4f}"
            f"{row.get('speed_ratio_default', float('nan')):>6.2f}"
            f"  {row.get('triton_best')}"
        )
    print("conventions:", result.get("conventions"))
    print("codec vs writer:", result.get("codec_vs_writer"))
    print("errors:", len(errors))
    for e in errors[:20]:
        print("  ", e[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
