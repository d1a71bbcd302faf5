# SPDX-License-Identifier: Apache-2.0
"""GPU benchmark (vLLM 0.34.0 + patch 0004): the series' Triton and torch DCP top-k merges
against 0.34's CuTe DSL merge and its symmetric-memory direct exchange, on one H200.

    python bench_dcp_topk_034.py --out results.json [--quick] [--ranks 2 4] [--budget-s 240]
                                 [--stages local multirank]

The defaults fit one 10-minute device call (stage 1 stops starting cases after --budget-s, each
multirank DCP size is killed after --multirank-timeout-s); when cut short, run the stages in two
calls (``--stages local``, then ``--stages multirank --out results-multirank.json``).

Needs the patched vLLM importable (``VARIANT=patched source .gpu/device-env.sh`` after
``device-overlay.sh``), nvidia-cutlass-dsl and quack-kernels, one CUDA GPU. Exit 1 when any
case selects a different set (or a stage failed); the JSON is rewritten after every case, so a
killed run keeps what it measured.

Two stages:

1. ``local`` (one process, no communication: the compute the merge backends differ in). Per
   case (top-k x DCP size x rows x key bits) every rank's local logits and local top-k are made
   on the GPU, packed by 0.34's pack (``pack_dcp_topk_candidates_cutedsl``, a Triton kernel) and
   by the leaf's Triton and torch packs (bit-identical required), laid out rank-major
   ``[world, rows, topk, 2]`` (what the dim-0 all-gather returns) and row-major in the direct
   exchange's ping-pong inbox ``[2, max_rows, world * topk, 2]``. Selected by:
   ``cutedsl`` (0.34's all-gather selector, rank-major), ``cutedsl_direct`` (0.34's ping-pong
   selector that the direct exchange runs, on the inbox), ``triton`` and ``torch`` (the leaf's,
   rank-major), and ``triton_rowmajor`` (the leaf's Triton selector on the inbox's row-major
   rows, for reference). Same set on every row required (the CuTe DSL kernels write in atomic
   order; rows are compared sorted). Times, median of CUDA events, eager and CUDA-graph
   replayed (up to ``--graph-calls`` calls per graph): ``select`` and ``merge`` (one rank's pack
   plus the selection; no exchange). ``time_over_cutedsl`` = CUDA-graph merge time over
   ``cutedsl``'s. Key bits: ``fp32`` (32/32, float32 indexer logits) and ``bf16`` (16 score
   bits, id bits of a 163840-token context: what 0.34 uses with bfloat16 indexer logits).
   Cases where 0.34 has no CuTe DSL merge (top-k 256 and 4096) time triton and torch alone.

2. ``multirank`` (the real exchange, several ranks as processes on ONE GPU). Per DCP size N,
   N processes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK=0``, ``NCCL_HOSTID=bench-host-<r>``,
   ``NCCL_SOCKET_IFNAME=lo``) init NCCL; each merges its own shard with ``cutedsl`` (pack, NCCL
   ``all_gather_into_tensor`` rank-major, CuTe DSL select: 0.34's all-gather path),
   ``cutedsl_direct`` (0.34's ``DirectDCPTopKWorkspace.merge``: pack, symmetric-memory push,
   publish/wait, ping-pong select), ``triton`` and ``torch`` (pack, the same NCCL all-gather,
   the leaf's selector on the rank-major buffer). Checks: every backend's rows hold the same set
   and every rank got the same rows. Times (eager; and the direct exchange replayed from a CUDA
   graph) per rank, reported as the max over ranks. ONE-GPU EMULATION: NCCL talks over host
   sockets and the ranks' kernels time-slice one GPU (the direct exchange's wait spins until
   its peers' contexts run), so these times are not NVLink figures; what they show is that the
   paths run and agree under a real exchange. A direct-exchange set-up that fails (symmetric
   memory between processes on one device) is recorded, not fatal.

Written for the dcp-series move to vLLM 0.34.0 (patch 0004); ``auto``'s choice is to be
re-timed from stage 1's decode rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_timing import capture_graph, event_times
from provenance import command

TOPKS = (512, 1024, 2048)
NO_CUTEDSL_TOPKS = (256, 4096)
WORLDS = (2, 4, 8)
ROWS = (1, 8, 32, 64, 256)
QUICK_ROWS = (1, 8, 64)
INBOX_ROWS = max(ROWS)
# Context length whose positions set the id bits of the "bf16" key (GLM-5 / V3.2 max length).
BF16_CONTEXT = 163840
SELECTORS = ("cutedsl", "cutedsl_direct", "triton", "torch", "triton_rowmajor")
MULTI_BACKENDS = ("cutedsl", "cutedsl_direct", "triton", "torch")


def modules():
    from vllm.model_executor.kernels.attention.dsa import dcp_indexer_cutedsl as cute
    from vllm.model_executor.kernels.attention.dsa import dcp_topk_merge as leaf
    from vllm.model_executor.kernels.attention.dsa import dcp_topk_pingpong_cutedsl as pp

    return cute, leaf, pp


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {
        "hostname": platform.node(),
        "gpu": props.name,
        "gpu_count": torch.cuda.device_count(),
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        **{
            n: package_version(n)
            for n in ("triton", "vllm", "nvidia-cutlass-dsl", "quack-kernels", "flashinfer-python")
        },
    }


def key_bits(name: str, leaf) -> tuple[int, int]:
    if name == "fp32":
        return 32, 32
    return leaf.dcp_topk_score_bits(torch.bfloat16), leaf.dcp_topk_id_bits(BF16_CONTEXT)


def rank_inputs(rank: int, rows: int, topk: int, bits: str, seed: int, device="cuda"):
    """One rank's (logits, local top-k, row_starts): random scores with boundary ties (a
    rounded row), a short row, padding; upcast bf16 values for the bf16 key."""
    gen = torch.Generator(device=device).manual_seed(seed * 131 + rank)
    width, pad = topk + 777, 8
    logits = torch.randn((rows, width + pad), generator=gen, device=device)
    logits[rows // 2] = (logits[rows // 2] * 4).round()
    if bits == "bf16":
        logits = logits.bfloat16().float()
    row_starts = torch.randint(0, pad, (rows,), generator=gen, device=device, dtype=torch.int32)
    cols = row_starts.long().view(-1, 1) + torch.arange(width, device=device)
    local = logits.gather(1, cols).topk(topk, dim=1).indices.to(torch.int32)
    if rows > 1:
        local[-1, topk // 3 :] = -1
    return logits, local, row_starts


def eager_ms(fn: Callable[[], object], iters: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_times(fn, iters))


def repetitions(fn: Callable[[], object], args) -> tuple[int, int]:
    ms = max(eager_ms(fn, 3, warm=1), 1e-3)
    calls = max(1, min(args.graph_calls, int(1.0 / ms)))
    iters = max(5, min(args.iters, int(args.target_ms / (calls * ms))))
    return calls, iters


def graph_ms(fn: Callable[[], object], iters: int, calls: int) -> float:
    return eager_ms(capture_graph(fn, calls).replay, iters) / calls


def sorted_rows(t: torch.Tensor) -> torch.Tensor:
    return t.sort(dim=1).values


# ----------------------------------------------------------------------------- stage 1


def local_case(topk: int, world: int, rows: int, bits: str, seed: int, args) -> dict[str, Any]:
    cute, leaf, pp = modules()
    score_bits, id_bits = key_bits(bits, leaf)
    has_cute = topk in TOPKS
    packers = {"triton": leaf.pack_dcp_topk_candidates_triton}
    packers["torch"] = leaf.pack_dcp_topk_candidates_torch
    if has_cute:
        packers["cutedsl"] = cute.pack_dcp_topk_candidates_cutedsl
    packs_equal, packed, inputs = True, [], []
    for rank in range(world):
        logits, local, starts = rank_inputs(rank, rows, topk, bits, seed)
        out = {}
        for name, pack in packers.items():
            out[name] = torch.empty((rows, topk, 2), device="cuda")
            pack(logits, local, out[name], rank, world, 1, starts)
        ref = out["cutedsl" if has_cute else "torch"]
        for p in out.values():
            packs_equal &= torch.equal(ref.view(torch.int32), p.view(torch.int32))
        packed.append(ref)
        inputs.append((logits, local, starts))
    rank_major = torch.stack(packed)
    row_major = torch.cat(packed, dim=1).contiguous()
    # One inbox size for every row count, as the workspace has (and one ping-pong selector
    # compile per top-k, DCP size and key).
    inboxes = torch.full((2, INBOX_ROWS, world * topk, 2), float("nan"), device="cuda")
    inboxes[0, :rows] = row_major
    write_seq = torch.ones((1,), dtype=torch.int64, device="cuda")  # epoch 1 -> slot 0
    use_pdl = torch.cuda.get_device_capability(0)[0] >= 9
    kw = dict(score_bits=score_bits, id_bits=id_bits)

    def sel(name: str) -> Callable[[torch.Tensor], None]:
        if name == "cutedsl":
            return lambda o: cute.stable_topk_from_gathered_candidates_cutedsl(
                rank_major, topk, out=o, **kw
            )
        if name == "cutedsl_direct":
            return lambda o: pp.stable_topk_from_pingpong_candidates_cutedsl(
                inboxes, write_seq, topk, out=o, use_pdl=use_pdl, **kw
            )
        if name == "triton":
            return lambda o: leaf.stable_topk_from_gathered_candidates_triton(
                rank_major, topk, out=o, **kw
            )
        if name == "triton_rowmajor":
            return lambda o: leaf.stable_topk_from_gathered_candidates_triton(
                inboxes[0, :rows], topk, out=o, **kw
            )
        return lambda o: leaf.stable_topk_from_gathered_candidates_torch(
            rank_major, topk, out=o, **kw
        )

    names = [n for n in SELECTORS if has_cute or not n.startswith("cutedsl")]
    selected = {}
    for name in names:
        o = torch.full((rows, topk), -7, dtype=torch.int32, device="cuda")
        sel(name)(o)
        selected[name] = sorted_rows(o)
    base = selected[names[0]]
    rows_differing = {n: int((selected[n] != base).any(dim=1).sum()) for n in names}
    # The full 64-bit key must select the same set on these inputs (bf16 upcast, ids in range).
    if bits == "bf16":
        full = leaf.stable_topk_from_gathered_candidates_torch(rank_major, topk)
        rows_differing["torch_full_key"] = int((sorted_rows(full) != base).any(dim=1).sum())

    logits0, local0, starts0 = inputs[0]
    pack_out = torch.empty((rows, topk, 2), device="cuda")
    sel_out = torch.empty((rows, topk), dtype=torch.int32, device="cuda")
    timings = {}
    for name in names:
        select = sel(name)
        pack = packers["cutedsl" if name.startswith("cutedsl") else name.split("_")[0]]

        def select_only(select=select) -> None:
            select(sel_out)

        def merge(pack=pack, select=select) -> None:
            pack(logits0, local0, pack_out, 0, world, 1, starts0)
            select(sel_out)

        s_calls, s_iters = repetitions(select_only, args)
        m_calls, m_iters = repetitions(merge, args)
        timings[name] = {
            "select_eager_ms": eager_ms(select_only, s_iters),
            "merge_eager_ms": eager_ms(merge, m_iters),
            "select_graph_ms": graph_ms(select_only, s_iters, s_calls),
            "merge_graph_ms": graph_ms(merge, m_iters, m_calls),
        }
    case = {
        "topk": topk,
        "dcp": world,
        "rows": rows,
        "key_bits": bits,
        "score_bits": score_bits,
        "id_bits": id_bits,
        "candidates_per_row": world * topk,
        "cutedsl_runs": has_cute,
        "packs_bit_identical": packs_equal,
        "rows_with_different_set": rows_differing,
        "identical": packs_equal and not any(rows_differing.values()),
        "timings": timings,
    }
    if has_cute:
        for key, out_key in (
            ("merge_graph_ms", "time_over_cutedsl"),
            ("merge_eager_ms", "time_over_cutedsl_eager"),
            ("select_graph_ms", "select_time_over_cutedsl"),
        ):
            b = timings["cutedsl"][key]
            case[out_key] = {n: timings[n][key] / b for n in names if n != "cutedsl"}
    return case


def local_cases(args) -> list[tuple[int, int, int, str]]:
    """The QUICK_ROWS cases of every (top-k, DCP, key) first, then the top-k sizes without a
    CuTe DSL merge, then the other row counts, so a budget cut loses the least."""

    def grid(rows):
        return [
            (topk, world, r, bits)
            for topk in TOPKS
            for world in WORLDS
            for bits in ("fp32", "bf16")
            for r in rows
        ]

    out = grid(QUICK_ROWS)
    out += [
        (topk, world, r, "fp32")
        for topk in NO_CUTEDSL_TOPKS
        for world in (2, 4)
        for r in QUICK_ROWS
        if topk * world <= 16384
    ]
    if not args.quick:
        out += grid(tuple(r for r in ROWS if r not in QUICK_ROWS))
    return out


# ----------------------------------------------------------------------------- stage 2


def multirank_case(topk, rows, bits, workspace, direct, report, args) -> dict[str, Any]:
    """One (top-k, rows, key bits) case of a multirank worker: every backend's merge of this
    rank's shard, checked and timed."""
    import torch.distributed as dist

    cute, leaf, _ = modules()
    device = torch.device("cuda:0")
    rank, world = dist.get_rank(), dist.get_world_size()
    score_bits, id_bits = key_bits(bits, leaf)
    logits, local, starts = rank_inputs(rank, rows, topk, bits, 1000 + rows)
    packed = torch.empty((rows, topk, 2), device=device)
    gathered = torch.empty((world, rows, topk, 2), device=device)
    out = torch.empty((rows, topk), dtype=torch.int32, device=device)
    kw = dict(score_bits=score_bits, id_bits=id_bits)

    def gather_merge(pack, select):
        def run() -> None:
            out.copy_(local)
            pack(logits, out, packed, rank, world, 1, starts)
            dist.all_gather_into_tensor(gathered, packed)
            select(gathered, topk, out=out, **kw)

        return run

    runs = {
        "cutedsl": gather_merge(
            cute.pack_dcp_topk_candidates_cutedsl,
            cute.stable_topk_from_gathered_candidates_cutedsl,
        ),
        "triton": gather_merge(
            leaf.pack_dcp_topk_candidates_triton,
            leaf.stable_topk_from_gathered_candidates_triton,
        ),
        "torch": gather_merge(
            leaf.pack_dcp_topk_candidates_torch,
            leaf.stable_topk_from_gathered_candidates_torch,
        ),
    }
    if direct:

        def direct_run() -> None:
            out.copy_(local)
            workspace.merge(logits, out, 1, starts, score_bits, id_bits)

        runs["cutedsl_direct"] = direct_run
    results, times = {}, {}
    for name, run in runs.items():
        run()
        results[name] = sorted_rows(out.clone())
        dist.barrier()
        times[name] = {"eager_ms": eager_ms(run, args.multirank_iters)}
        dist.barrier()
    if direct:
        try:
            times["cutedsl_direct"]["graph_ms"] = graph_ms(
                runs["cutedsl_direct"], args.multirank_iters, 10
            )
        except Exception as exc:
            report["errors"].append(f"direct graph rows={rows}: {exc!r}"[:400])
        dist.barrier()
    base = results["cutedsl"]
    differing = {n: int((r != base).any(dim=1).sum()) for n, r in results.items()}
    peers = [torch.empty_like(base) for _ in range(world)]
    dist.all_gather(peers, base)
    ranks_agree = all(torch.equal(p, base) for p in peers)
    all_times = [None] * world
    dist.all_gather_object(all_times, times)
    return {
        "topk": topk,
        "rows": rows,
        "key_bits": bits,
        "rows_with_different_set": differing,
        "ranks_agree": ranks_agree,
        "identical": ranks_agree and not any(differing.values()),
        "direct_exchange_ran": direct,
        "max_over_ranks_ms": {
            name: {k: max(t[name][k] for t in all_times if k in t[name]) for k in times[name]}
            for name in times
        },
    }


def worker(args) -> int:
    """One rank of the multirank stage (re-executed by ``multirank``)."""
    import torch.distributed as dist
    from vllm.model_executor.kernels.attention.dsa.dcp_topk_direct import (
        DirectDCPTopKWorkspace,
    )

    torch.cuda.set_device(0)
    device = torch.device("cuda:0")
    dist.init_process_group(backend="nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    rows_list = QUICK_ROWS if args.quick else (1, 8, 32, 64)
    max_rows = max(rows_list)
    report: dict[str, Any] = {"dcp": world, "cases": [], "errors": []}

    for topk in (512, 2048):
        workspace, ws_error = None, None
        try:
            workspace = DirectDCPTopKWorkspace(dist.group.WORLD, device, max_rows, topk)
        except Exception as exc:  # recorded: symmetric memory of ranks on one device
            ws_error = f"{type(exc).__name__}: {str(exc)[:400]}"
            report["errors"].append(f"topk={topk} direct workspace: {ws_error}")
        errs = [None] * world
        dist.all_gather_object(errs, ws_error)
        direct = all(e is None for e in errs)
        for rows in rows_list:
            for bits in ("fp32", "bf16"):
                report["cases"].append(
                    multirank_case(topk, rows, bits, workspace, direct, report, args)
                )
    all_errors = [None] * world
    dist.all_gather_object(all_errors, report["errors"])
    report["errors"] = [f"rank {r}: {e}" for r, errs in enumerate(all_errors) for e in errs]
    if rank == 0:
        Path(args.worker_out).write_text(json.dumps(report))
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multirank(world: int, args) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rank0.json"
        port = free_port()
        procs, logs = [], []
        for r in range(world):
            env = dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE=str(world),
                LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                NCCL_HOSTID=f"bench-host-{r}",
                NCCL_SOCKET_IFNAME="lo",
                NCCL_NVLS_ENABLE="0",
            )
            log = open(Path(tmp) / f"rank{r}.log", "w+")
            cmd = [sys.executable, __file__, "--worker-out", str(report)]
            cmd += ["--multirank-iters", str(args.multirank_iters)]
            cmd += ["--quick"] if args.quick else []
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
            logs.append(log)
        deadline = time.time() + args.multirank_timeout_s
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                p.kill()
                rcs.append("timeout")
        tails = []
        for log in logs:
            log.seek(0)
            tails.append(log.read()[-3000:])
            log.close()
        result: dict[str, Any] = {"dcp": world, "exit_codes": rcs}
        if report.is_file():
            result.update(json.loads(report.read_text()))
        else:
            result["errors"] = [f"no report from rank 0; log tails: {tails}"]
        if any(rc != 0 for rc in rcs):
            result["log_tails"] = tails
        return result


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results.json"))
    ap.add_argument("--quick", action="store_true", help="fewer row counts")
    ap.add_argument("--ranks", type=int, nargs="*", default=[2, 4], help="multirank DCP sizes")
    ap.add_argument("--stages", nargs="+", default=["local", "multirank"])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--graph-calls", type=int, default=20)
    ap.add_argument("--target-ms", type=float, default=20.0)
    ap.add_argument("--budget-s", type=float, default=240.0, help="stage 1 time budget")
    ap.add_argument("--multirank-iters", type=int, default=20)
    ap.add_argument("--multirank-timeout-s", type=float, default=150.0, help="per DCP size")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if args.worker_out:
        return worker(args)

    started = time.time()
    import vllm

    cute, leaf, _ = modules()  # fails here when the patched tree is not importable
    info = machine()
    todo = local_cases(args) if "local" in args.stages else []
    local, skipped, errors, multi = [], [], [], []

    def write(final: bool) -> bool:
        ok = not errors and all(c["identical"] for c in local)
        ok = (
            ok
            and all(c["identical"] for m in multi for c in m.get("cases", []))
            and all(not m.get("errors") or m.get("cases") for m in multi)
        )
        decode = [c for c in local if c["cutedsl_runs"]]

        def worst(key: str, name: str, bits: str | None = None):
            vals = [
                c[key][name]
                for c in decode
                if name in c.get(key, {}) and (bits is None or c["key_bits"] == bits)
            ]
            return max(vals, default=None)

        result = {
            "kind": "dcp_topk_merge_034",
            "base": f"vllm {vllm.__version__}",
            "leaf": leaf.__file__,
            "command": command(),
            "machine": info,
            "wall_s": round(time.time() - started, 1),
            "finished": final,
            "identical": ok,
            "summary": {
                "local_cases": len(local),
                "local_cases_planned": len(todo),
                "local_identical": sum(c["identical"] for c in local),
                "max_time_over_cutedsl": {
                    bits: {n: worst("time_over_cutedsl", n, bits) for n in SELECTORS[1:]}
                    for bits in ("fp32", "bf16")
                },
                "min_time_over_cutedsl": {
                    bits: {
                        n: min(
                            (
                                c["time_over_cutedsl"][n]
                                for c in decode
                                if c["key_bits"] == bits and n in c["time_over_cutedsl"]
                            ),
                            default=None,
                        )
                        for n in SELECTORS[1:]
                    }
                    for bits in ("fp32", "bf16")
                },
                "multirank_note": "one-GPU emulation: NCCL over sockets, ranks time-slice one GPU",
            },
            "local": local,
            "local_skipped": skipped,
            "multirank": multi,
            "errors": errors,
        }
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        tmp.replace(args.out)
        return ok

    for i, (topk, world, rows, bits) in enumerate(todo):
        spec = dict(topk=topk, dcp=world, rows=rows, key_bits=bits)
        if time.time() - started > args.budget_s:
            skipped.append(spec)
            continue
        try:
            case = local_case(topk, world, rows, bits, i, args)
        except Exception as exc:  # recorded; the run goes on and exits 1
            errors.append(f"{spec}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"ERROR {spec}: {exc!r}"[:400], flush=True)
            write(False)
            continue
        local.append(case)
        write(False)
        r = case.get("time_over_cutedsl", {})
        print(
            f"[{time.time() - started:5.1f}s] topk={topk} dcp={world} rows={rows} {bits} "
            f"identical={case['identical']} " + " ".join(f"{n} x{v:.2f}" for n, v in r.items()),
            flush=True,
        )
    if "multirank" in args.stages:
        for world in args.ranks:
            print(f"[{time.time() - started:5.1f}s] multirank dcp={world}", flush=True)
            multi.append(multirank(world, args))
            write(False)
    ok = write(True)
    print(f"identical={ok}; {len(local)} local cases, {len(skipped)} skipped; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
