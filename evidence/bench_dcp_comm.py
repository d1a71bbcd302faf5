# SPDX-License-Identifier: Apache-2.0
"""GPU evidence: per-layer DCP communication time and wire bytes per rank (vLLM 0.33.0).

One sparse-MLA prefill layer at GLM-5 attention geometry (64 query heads at TP1, so
H_local = 64 / N per rank; absorbed q/k 576, V latent 512; top-k 2048; fp8_ds_mla records of
656 B) on N GPUs with torch.distributed (NCCL), for the last chunk of a cold prompt of L
tokens (the chunk's rows attend over the whole accumulated context). Transports:

* ``query-a2a``: 0.33's GLM default on CUDA (``dcp_comm_backend="a2a"``; its
  ``dcp_q_replicate=True`` is not honoured by the CUDA DSA layer, so the query is gathered):
  bf16 query all-gather, one bf16 all-to-all of outputs with the fp32 LSE in two slots;
* ``query-ag_rs``: bf16 query all-gather, fp32 LSE all-gather, bf16 output reduce-scatter;
* ``query-fp8``: patch 0008's fp8 wire: 656-B e4m3 query rows (pack, all-gather, unpack),
  one all-to-all of 532-B e4m3 partials + LSE, float32 merge (codec work included);
* ``ckv``: patch 0007's packed-CKV route: Triton pack of this rank's records, one
  all-gather of the sections, vLLM's prefill-workspace remap of the rows' global top-k.

Attention itself is not timed (it is the same work on both routes: T x H_local x 2048 on
ckv, T x N*H_local x 2048 over 1/N of the keys on the query route); ``bench_dcp_prefill.py``
measures end to end. Phases are timed with the shipped ledger (patch 0009, CUDA events); the
wire bytes are the byte model's (patch 0007's dcp_wire_model.py, exact for these buffers)
and are checked against the buffers' sizes. The cores are loaded by path from the patched
tree (``--vllm-tree``); the remap comes from the installed vLLM (unchanged by the series).

Run (N GPUs; the second line gives a PCIe-like fabric):

    torchrun --nproc-per-node 2 evidence/bench_dcp_comm.py --vllm-tree build/vllm
    NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 evidence/bench_dcp_comm.py \\
        --vllm-tree build/vllm

Rank 0 writes ``results/bench_dcp_comm-<fabric>-<UTC time>.json`` (command, git revisions,
base version, machine, per-context figures, ratios against query-a2a). Without GPUs:

    python evidence/bench_dcp_comm.py --byte-model --vllm-tree build/vllm

prints the byte model's tables (no torch.distributed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from provenance import git_revision, load_module, write_result
from provenance import machine as provenance_machine

REPO = Path(__file__).resolve().parent.parent
BASE_VERSION = "0.33.0"
LEAVES = {
    "ckv": "vllm/v1/attention/ops/dcp_packed_ckv.py",
    "model": "vllm/v1/attention/ops/dcp_wire_model.py",
    "fp8": "vllm/v1/attention/ops/dcp_fp8_wire.py",
    "ledger": "vllm/v1/attention/ops/dcp_comm_ledger.py",
}
ROUTES = ("query-a2a", "query-ag_rs", "query-fp8", "ckv")
HEADS_TP1 = 64
QK_DIM = 576
V_DIM = 512
TOPK = 2048
BLOCK_SIZE = 64


def load_leaf(tree: Path, rel: str) -> ModuleType:
    path = tree / rel
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass --vllm-tree (the patched vLLM 0.33 tree)")
    return load_module(path, "bench_leaf_" + path.stem)


def machine() -> dict[str, Any]:
    return provenance_machine(topology=True)


def last_chunk_bytes(
    model: ModuleType, ckv: ModuleType, context: int, rows: int, n: int, interleave: int
) -> dict[str, int]:
    """Bytes each rank receives per layer for the last chunk of a cold prompt."""
    hl = HEADS_TP1 // n
    rank_rows = ckv.packed_ckv_layout([context], n, interleave).rank_rows
    return {
        "query-a2a": model.query_route_bytes(rows, hl, n, "a2a").total,
        "query-ag_rs": model.query_route_bytes(rows, hl, n, "ag_rs").total,
        "query-fp8": model.query_route_bytes(rows, hl, n, "a2a", wire_dtype="fp8").total,
        "ckv": model.ckv_route_bytes(rank_rows, n).total,
    }


class Layer:
    """Buffers of one layer for one (context, chunk) point on this rank."""

    def __init__(self, ckv, n, rank, context, rows, interleave, seed, dev) -> None:
        import torch

        g = torch.Generator(device=dev).manual_seed(seed + rank)
        self.n, self.rank, self.rows, self.hl = n, rank, rows, HEADS_TP1 // n
        self.q = torch.randn(rows, self.hl, QK_DIM, device=dev, generator=g).to(torch.bfloat16)
        self.out = torch.randn(rows, n * self.hl, V_DIM, device=dev, generator=g).to(torch.bfloat16)
        self.lse = torch.randn(rows, n * self.hl, device=dev, generator=g)
        # this rank's paged cache holding its shard of the prompt (random bytes: the comm
        # phases never interpret records)
        blocks = -(-ckv.dcp_local_len(context, n, interleave, 0) // BLOCK_SIZE)
        self.kv = torch.randint(
            0, 256, (blocks + 1, BLOCK_SIZE, 656), dtype=torch.uint8, device=dev, generator=g
        )
        self.block_table = (
            torch.randperm(blocks + 1, device=dev, generator=g)[:blocks]
            .to(torch.int32)[None, :]
            .contiguous()
        )
        self.seq_lens = torch.tensor([context], dtype=torch.int32, device=dev)
        self.layout = ckv.packed_ckv_layout([context], n, interleave)
        self.starts = torch.tensor(self.layout.starts, dtype=torch.int32, device=dev)
        self.section = torch.empty(self.layout.rank_rows, 656, dtype=torch.uint8, device=dev)
        self.gathered = torch.empty(n * self.layout.rank_rows, 656, dtype=torch.uint8, device=dev)
        self.req_id = torch.zeros(rows, dtype=torch.int32, device=dev)
        causal = torch.arange(context - rows, context, device=dev) + 1
        topk = torch.randint(0, context, (rows, TOPK), device=dev, generator=g)
        self.topk = torch.minimum(topk, causal[:, None] - 1).to(torch.int32)


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from vllm.v1.attention.backends.mla.sparse_utils import (
        triton_convert_req_index_to_global_index,
    )

    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    tree = Path(args.vllm_tree).resolve()
    ckv, model, fp8, ledger_mod = (load_leaf(tree, LEAVES[k]) for k in LEAVES)
    group = dist.group.WORLD

    def query_a2a(layer, ledger, li):
        b = model.query_route_bytes(layer.rows, layer.hl, n, "a2a")
        gathered = torch.empty(n * layer.rows, layer.hl, QK_DIM, dtype=torch.bfloat16, device=dev)
        with ledger.phase(li, "q_gather", b.query_gather):
            dist.all_gather_into_tensor(gathered, layer.q, group=group)
        send = torch.empty(n, layer.rows, layer.hl, V_DIM + 2, dtype=torch.bfloat16, device=dev)
        recv = torch.empty_like(send)
        assert send.nbytes // n * (n - 1) == b.combine
        with ledger.phase(li, "combine", b.combine):
            send[..., :V_DIM] = layer.out.view(layer.rows, n, layer.hl, V_DIM).transpose(0, 1)
            send[..., V_DIM:] = (
                layer.lse.view(layer.rows, n, layer.hl)
                .transpose(0, 1)
                .contiguous()[..., None]
                .view(torch.bfloat16)
            )
            dist.all_to_all_single(recv.view(-1), send.view(-1), group=group)

    def query_ag_rs(layer, ledger, li):
        b = model.query_route_bytes(layer.rows, layer.hl, n, "ag_rs")
        gathered = torch.empty(n * layer.rows, layer.hl, QK_DIM, dtype=torch.bfloat16, device=dev)
        with ledger.phase(li, "q_gather", b.query_gather):
            dist.all_gather_into_tensor(gathered, layer.q, group=group)
        lses = torch.empty(n * layer.rows, n * layer.hl, dtype=torch.float32, device=dev)
        merged = torch.empty(layer.rows, layer.hl, V_DIM, dtype=torch.bfloat16, device=dev)
        with ledger.phase(li, "combine", b.combine):
            dist.all_gather_into_tensor(lses, layer.lse, group=group)
            send = layer.out.view(layer.rows, n, layer.hl, V_DIM).transpose(0, 1).contiguous()
            dist.reduce_scatter_tensor(
                merged, send.view(n * layer.rows, layer.hl, V_DIM), group=group
            )

    def query_fp8(layer, ledger, li):
        b = model.query_route_bytes(layer.rows, layer.hl, n, "a2a", wire_dtype="fp8")
        with ledger.phase(li, "q_gather", b.query_gather):
            rows_w = fp8.pack_query(layer.q)
            gathered = torch.empty(
                layer.rows, n * layer.hl, rows_w.shape[-1], dtype=torch.uint8, device=dev
            )
            parts = torch.empty(
                n * layer.rows, layer.hl, rows_w.shape[-1], dtype=torch.uint8, device=dev
            )
            dist.all_gather_into_tensor(parts, rows_w, group=group)
            gathered.copy_(
                parts.view(n, layer.rows, layer.hl, -1).transpose(0, 1).reshape(gathered.shape)
            )
            fp8.unpack_query(gathered)
        with ledger.phase(li, "combine", b.combine):
            send = fp8.pack_partials(layer.out, layer.lse, n)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv.view(-1), send.view(-1), group=group)
            heads = slice(rank * layer.hl, (rank + 1) * layer.hl)
            fp8.merge_partials(
                recv, rank=rank, own_out=layer.out[:, heads], own_lse=layer.lse[:, heads]
            )

    def ckv_route(layer, ledger, li):
        b = model.ckv_route_bytes(layer.layout.rank_rows, n)
        assert layer.section.nbytes * (n - 1) == b.record_gather
        with ledger.phase(li, "ckv_pack"):
            kv_rows = layer.kv.view(-1, 656)
            ckv.pack_local_records(
                kv_rows,
                BLOCK_SIZE,
                BLOCK_SIZE,
                layer.block_table,
                layer.seq_lens,
                layer.starts,
                layer.section,
                layer.layout,
                dcp_size=n,
                dcp_rank=rank,
                interleave=args.interleave,
            )
        with ledger.phase(li, "ckv_gather", b.record_gather):
            dist.all_gather_into_tensor(layer.gathered, layer.section, group=group)
        with ledger.phase(li, "ckv_remap"):
            triton_convert_req_index_to_global_index(
                layer.req_id,
                layer.block_table,
                layer.topk,
                BLOCK_SIZE=BLOCK_SIZE,
                NUM_TOPK_TOKENS=TOPK,
                HAS_PREFILL_WORKSPACE=True,
                prefill_workspace_request_ids=layer.req_id,
                prefill_workspace_starts=layer.starts,
                prefill_workspace_rank_stride=layer.layout.rank_rows,
                dcp_size=n,
                dcp_rank=rank,
                cp_kv_cache_interleave_size=args.interleave,
                return_valid_counts=True,
            )

    fns = {
        "query-a2a": query_a2a,
        "query-ag_rs": query_ag_rs,
        "query-fp8": query_fp8,
        "ckv": ckv_route,
    }
    points = []
    for context in args.contexts:
        rows = min(args.chunk, context)
        layer = Layer(ckv, n, rank, context, rows, args.interleave, args.seed, dev)
        point: dict[str, Any] = {"context": context, "rows": rows, "routes": {}}
        for name in args.routes:
            ledger = ledger_mod.DcpCommLedger(args.iters)
            li = ledger.register_layer(name)
            warm = ledger_mod.DcpCommLedger(1)
            wl = warm.register_layer(name)
            for _ in range(args.warmup):
                fns[name](layer, warm, wl)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                with ledger.phase(li, "total"):
                    fns[name](layer, ledger, li)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) * 1e3 / args.iters
            phases = ledger.summary()["layers"][name]
            point["routes"][name] = {
                "phases": phases,
                "comm_ms_per_layer": sum(v["mean_ms"] for k, v in phases.items() if k != "total"),
                "total_ms_per_layer": phases["total"]["mean_ms"],
                "wall_ms_per_layer": wall_ms,
                "wire_bytes_per_rank": sum(
                    v["wire_bytes_per_call"] for k, v in phases.items() if k != "total"
                ),
            }
        base = point["routes"].get("query-a2a")
        if base is not None:
            point["over_query_a2a"] = {
                name: {
                    "comm_ms": r["comm_ms_per_layer"] / base["comm_ms_per_layer"],
                    "wire_bytes": r["wire_bytes_per_rank"] / base["wire_bytes_per_rank"],
                }
                for name, r in point["routes"].items()
            }
        point["byte_model"] = last_chunk_bytes(model, ckv, context, rows, n, args.interleave)
        points.append(point)
        if rank == 0:
            print(
                f"L={context:>7} rows={rows}: "
                + ", ".join(
                    f"{k} {v['comm_ms_per_layer']:.3f} ms" for k, v in point["routes"].items()
                ),
                flush=True,
            )
        del layer
        torch.cuda.empty_cache()
    if rank == 0:
        fabric = "pcie-like" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "p2p"
        record = {
            "script": "evidence/bench_dcp_comm.py",
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "git_revision": git_revision(REPO),
            "base_version": BASE_VERSION,
            "vllm_tree": str(tree),
            "vllm_tree_revision": git_revision(tree),
            "machine": machine(),
            "fabric": fabric,
            "dcp_size": n,
            "geometry": {
                "heads_tp1": HEADS_TP1,
                "heads_local": HEADS_TP1 // n,
                "qk_dim": QK_DIM,
                "v_dim": V_DIM,
                "topk": TOPK,
                "record_bytes": 656,
                "interleave": args.interleave,
                "chunk": args.chunk,
            },
            "warmup": args.warmup,
            "iters": args.iters,
            "points": points,
        }
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = (
            Path(args.out)
            if args.out
            else REPO / "results" / f"bench_dcp_comm-{fabric}-{stamp}.json"
        )
        write_result(out, record)
        print(f"wrote {out}")
    dist.destroy_process_group()


def byte_model_table(args: argparse.Namespace) -> str:
    """Markdown tables of the byte model (no GPU): per-rank bytes per layer of the last
    chunk at each context, and over a whole cold prompt chunked by ``--chunk``."""
    tree = Path(args.vllm_tree).resolve()
    ckv, model = load_leaf(tree, LEAVES["ckv"]), load_leaf(tree, LEAVES["model"])
    mib = 2**20
    lines = []
    for n in args.dcp_sizes:
        hl = HEADS_TP1 // n
        lines += [
            f"DCP={n} (H_local={hl}), chunk={args.chunk} rows, interleave={args.interleave}; "
            "MiB received per rank per layer",
            "",
            "| context | last chunk: query a2a (0.33 GLM default) | query ag_rs | query fp8 | ckv"
            " | a2a/ckv | whole prompt: query a2a | query fp8 | ckv | a2a/ckv |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for context in args.contexts:
            rows = min(args.chunk, context)
            last = last_chunk_bytes(model, ckv, context, rows, n, args.interleave)
            whole = {"query-a2a": 0, "query-fp8": 0, "ckv": 0}
            done = 0
            while done < context:
                step = min(args.chunk, context - done)
                done += step
                b = last_chunk_bytes(model, ckv, done, step, n, args.interleave)
                for k in whole:
                    whole[k] += b[k]
            lines.append(
                f"| {context:,} | {last['query-a2a'] / mib:,.1f} | {last['query-ag_rs'] / mib:,.1f}"
                f" | {last['query-fp8'] / mib:,.1f} | {last['ckv'] / mib:,.2f}"
                f" | {last['query-a2a'] / last['ckv']:,.1f}x"
                f" | {whole['query-a2a'] / mib:,.0f} | {whole['query-fp8'] / mib:,.0f}"
                f" | {whole['ckv'] / mib:,.0f} | {whole['query-a2a'] / whole['ckv']:,.1f}x |"
            )
        for wire_dtype in ("auto", "fp8"):
            q = model.query_route_bytes(args.chunk, hl, n, "a2a", wire_dtype=wire_dtype).total
            cross = n * (q // ((n - 1) * 656))
            lines.append(
                f"\nauto returns to the query route ({wire_dtype} wire) past ~{cross:,} "
                f"accumulated tokens for a {args.chunk}-row chunk."
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-tree", default=str(REPO / "build" / "vllm"))
    p.add_argument(
        "--contexts", type=int, nargs="+", default=[8192, 16384, 32768, 55296, 65536, 131072]
    )
    p.add_argument("--chunk", type=int, default=8192, help="rows of the prefill chunk")
    p.add_argument("--interleave", type=int, default=1)
    p.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--byte-model",
        action="store_true",
        help="print the byte model's tables (no GPU, no torch.distributed)",
    )
    p.add_argument("--dcp-sizes", type=int, nargs="+", default=[2, 4, 8])
    args = p.parse_args(argv)
    if args.byte_model:
        print(byte_model_table(args))
        return 0
    run_worker(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
