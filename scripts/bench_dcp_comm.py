# SPDX-License-Identifier: Apache-2.0
"""GPU evidence: per-layer DCP communication time and wire bytes per rank, both routes.

One sparse-MLA prefill layer at GLM-5 attention geometry (64 query heads at TP1, so
H_local = 64 / N per rank; absorbed q/k 576, V latent 512; top-k 2048; fp8_ds_mla records
of 656 B) on N GPUs with torch.distributed (NCCL), for the last chunk of a cold prompt of L
tokens (the chunk's rows attend over the whole accumulated context):

* ``query-bf16``: stock query route: bf16 query all-gather, LSE all-gather (fp32),
  output reduce-scatter (bf16).
* ``query-fp8``: the same with the fp8 wire of patch 0009: e4m3 + fp32 scale per 128
  query all-gather (own slice exact), one all-to-all of e4m3 partials + fp32 LSE, fp32
  merge.
* ``ckv``: packed-CKV route of patch 0008: pack this rank's records of the prompt
  (Triton), one all-gather of the section (records + fill bytes), remap of the rows'
  global top-k (Triton).

Attention itself is not timed here (it is the same work on both routes: T x H_local x
2048 on ckv, T x N*H_local x 2048/N on the query route); ``bench_dcp_prefill.py`` measures
end-to-end throughput. Phases are timed with the shipped ledger (patch 0010, CUDA events);
the wire bytes are the bytes each rank receives, counted from the buffers the collectives
move. The cores are loaded by path from the patched tree (``--vllm-tree``), so only torch
and triton are needed.

Run (2 GPUs; the second line gives a PCIe-like fabric):

    torchrun --nproc-per-node 2 scripts/bench_dcp_comm.py --vllm-tree build/vllm
    NCCL_P2P_DISABLE=1 torchrun --nproc-per-node 2 scripts/bench_dcp_comm.py \
        --vllm-tree build/vllm

or both fabrics in one run (one JSON, ratios side by side):

    python scripts/bench_dcp_comm.py --launch --nproc 2 --vllm-tree build/vllm

Rank 0 writes ``results/bench_dcp_comm-<fabric>-<UTC time>.json`` (``--launch``:
``results/bench_dcp_comm-<UTC time>.json``) with the command, git revision, machine,
per-context figures and the query/ckv ratios.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from evidence import git_revision

REPO = Path(__file__).resolve().parent.parent
LEAVES = {
    "ckv": "vllm/v1/attention/ops/dcp_packed_ckv.py",
    "wire": "vllm/v1/attention/ops/dcp_fp8_wire.py",
    "ledger": "vllm/v1/attention/ops/dcp_comm_ledger.py",
}
HEADS_TP1 = 64
QK_DIM = 576
V_DIM = 512
TOPK = 2048
BLOCK_SIZE = 64


def load_leaf(tree: Path, rel: str) -> ModuleType:
    path = tree / rel
    if not path.is_file():
        raise SystemExit(f"{path} not found: pass --vllm-tree (the patched vLLM tree)")
    name = "bench_leaf_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "NCCL_P2P_DISABLE": os.environ.get("NCCL_P2P_DISABLE"),
    }
    if torch.cuda.is_available():
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    try:
        topo = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True
        )
        info["nvidia_smi_topo"] = topo.stdout
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


class Layer:
    """Buffers of one layer for one (context, chunk) point on this rank."""

    def __init__(
        self,
        ckv: ModuleType,
        n: int,
        rank: int,
        context: int,
        rows: int,
        interleave: int,
        seed: int,
        dev: torch.device,
    ) -> None:
        g = torch.Generator(device=dev).manual_seed(seed + rank)
        self.n, self.rank, self.rows = n, rank, rows
        self.hl = HEADS_TP1 // n
        self.q = torch.randn(rows, self.hl, QK_DIM, device=dev, generator=g).to(torch.bfloat16)
        self.out = torch.randn(rows, n * self.hl, V_DIM, device=dev, generator=g).to(torch.bfloat16)
        self.lse = torch.randn(rows, n * self.hl, device=dev, generator=g)
        # this rank's paged cache holding its shard of the prompt (random bytes: the
        # comm phases never interpret records)
        local = ckv.dcp_local_len(context, n, interleave, rank)
        blocks = -(-ckv.dcp_local_len(context, n, interleave, 0) // BLOCK_SIZE)
        self.kv = torch.randint(
            0,
            256,
            (blocks + 1, BLOCK_SIZE, ckv.FP8_DS_MLA_RECORD_BYTES),
            dtype=torch.uint8,
            device=dev,
            generator=g,
        )
        self.block_table = (
            torch.randperm(blocks + 1, device=dev, generator=g)[:blocks]
            .to(torch.int32)[None, :]
            .contiguous()
        )
        self.seq_lens = torch.tensor([context], dtype=torch.int32, device=dev)
        self.plan = ckv.plan_chunk([context], n, interleave)
        self.req_base = ckv.request_page_base(self.seq_lens, n, interleave)
        self.section = torch.empty(self.plan.section_bytes, dtype=torch.uint8, device=dev)
        self.gathered = torch.empty(n * self.plan.section_bytes, dtype=torch.uint8, device=dev)
        # the chunk's rows are the last `rows` positions of the prompt
        self.req_id = torch.zeros(rows, dtype=torch.int32, device=dev)
        qsl = torch.tensor([0, rows], dtype=torch.int32, device=dev)
        self.causal = ckv.row_causal_lens(self.seq_lens, qsl, self.req_id)
        topk = torch.randint(0, context, (rows, TOPK), device=dev, generator=g)
        self.topk = torch.minimum(topk, (self.causal[:, None] - 1).long()).to(torch.int32)
        self.slots = torch.empty(rows, TOPK, dtype=torch.int32, device=dev)
        self.counts = torch.empty(rows, dtype=torch.int32, device=dev)
        self.missing = torch.zeros(1, dtype=torch.int32, device=dev)
        assert local <= blocks * BLOCK_SIZE


def query_bf16(layer: Layer, ledger: Any, li: int, group: Any) -> None:
    n, rows, hl = layer.n, layer.rows, layer.hl
    dev = layer.q.device
    gathered = torch.empty(n * rows, hl, QK_DIM, dtype=torch.bfloat16, device=dev)
    with ledger.phase(li, "q_gather", (n - 1) * layer.q.numel() * 2):
        dist.all_gather_into_tensor(gathered, layer.q, group=group)
        gathered.view(n, rows, hl, QK_DIM).permute(1, 0, 2, 3).reshape(rows, n * hl, QK_DIM)
    lses = torch.empty(n * rows, n * hl, dtype=torch.float32, device=dev)
    merged = torch.empty(rows, hl, V_DIM, dtype=torch.bfloat16, device=dev)
    wire = (n - 1) * (rows * n * hl * 4 + rows * hl * V_DIM * 2)
    with ledger.phase(li, "merge", wire):
        dist.all_gather_into_tensor(lses, layer.lse, group=group)
        send = layer.out.view(rows, n, hl, V_DIM).transpose(0, 1).contiguous()
        dist.reduce_scatter_tensor(merged, send.view(n * rows, hl, V_DIM), group=group)


def query_fp8(wire: ModuleType, layer: Layer, ledger: Any, li: int, group: Any) -> None:
    n, rows, hl = layer.n, layer.rows, layer.hl
    dev = layer.q.device
    with ledger.phase(li, "q_gather", (n - 1) * rows * hl * wire.wire_row_bytes(QK_DIM)):
        rows_w = wire.pack_fp8_wire(layer.q)
        gathered = torch.empty(n * rows, *rows_w.shape[1:], dtype=torch.uint8, device=dev)
        dist.all_gather_into_tensor(gathered, rows_w, group=group)
        wire.assemble_gathered_queries(gathered.view(n, *rows_w.shape), layer.rank, layer.q)
    with ledger.phase(li, "merge", (n - 1) * rows * hl * (wire.wire_row_bytes(V_DIM) + 4)):
        send = wire.pack_partials(layer.out, layer.lse, n)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        heads = slice(layer.rank * hl, (layer.rank + 1) * hl)
        wire.merge_partials(recv, layer.rank, layer.out[:, heads], layer.lse[:, heads], V_DIM)


def ckv_route(
    ckv: ModuleType, layer: Layer, ledger: Any, li: int, group: Any, interleave: int
) -> None:
    plan = layer.plan
    with ledger.phase(li, "pack"):
        ckv.pack_local_records(
            layer.kv,
            layer.block_table,
            layer.seq_lens,
            layer.req_base,
            layer.section,
            plan,
            dcp_size=layer.n,
            dcp_rank=layer.rank,
            interleave=interleave,
        )
    with ledger.phase(li, "gather", (layer.n - 1) * plan.section_bytes):
        dist.all_gather_into_tensor(layer.gathered, layer.section, group=group)
    with ledger.phase(li, "remap"):
        ckv.remap_topk_to_gathered(
            layer.topk,
            layer.req_id,
            layer.causal,
            layer.req_base,
            layer.gathered,
            plan,
            dcp_size=layer.n,
            interleave=interleave,
            out=layer.slots,
            counts=layer.counts,
            missing=layer.missing,
        )


class _WallEvent:
    """CPU stand-in for torch.cuda.Event (``--cpu-smoke`` only)."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _WallEvent) -> float:
        return (end.t - self.t) * 1e3


def run_worker(args: argparse.Namespace) -> None:
    smoke = args.cpu_smoke
    dist.init_process_group("gloo" if smoke else "nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    if smoke:
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dev = torch.device("cuda")

    def sync() -> None:
        if not smoke:
            torch.cuda.synchronize()

    tree = Path(args.vllm_tree).resolve()
    ckv = load_leaf(tree, LEAVES["ckv"])
    wire = load_leaf(tree, LEAVES["wire"])
    ledger_mod = load_leaf(tree, LEAVES["ledger"])
    group = dist.group.WORLD
    points = []
    for context in args.contexts:
        rows = min(args.chunk, context)
        layer = Layer(ckv, n, rank, context, rows, args.interleave, args.seed, dev)
        routes = {
            "query-bf16": functools.partial(query_bf16, layer, group=group),
            "query-fp8": functools.partial(query_fp8, wire, layer, group=group),
            "ckv": functools.partial(
                ckv_route, ckv, layer, group=group, interleave=args.interleave
            ),
        }
        point: dict[str, Any] = {"context": context, "rows": rows, "routes": {}}
        for name, fn in routes.items():
            factory = {"event_factory": _WallEvent} if smoke else {}
            ledger = ledger_mod.DcpCommLedger(args.iters, **factory)
            li = ledger.register_layer(name)
            warm = ledger_mod.DcpCommLedger(1, **factory)
            wl = warm.register_layer(name)
            for _ in range(args.warmup):
                fn(warm, wl)
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                with ledger.phase(li, "total"):
                    fn(ledger, li)
            sync()
            wall_ms = (time.perf_counter() - start) * 1e3 / args.iters
            summary = ledger.summary()["layers"][name]
            comm_ms = sum(
                v["mean_ms"] for k, v in summary.items() if isinstance(v, dict) and k != "total"
            )
            point["routes"][name] = {
                "phases": summary,
                "comm_ms_per_layer": comm_ms,
                "wall_ms_per_layer": wall_ms,
                "wire_bytes_per_rank": sum(
                    v["wire_bytes_per_call"]
                    for k, v in summary.items()
                    if isinstance(v, dict) and k != "total"
                ),
            }
        r = point["routes"]
        point["ratios"] = {
            "query_bf16_over_ckv_comm_ms": r["query-bf16"]["comm_ms_per_layer"]
            / r["ckv"]["comm_ms_per_layer"],
            "query_fp8_over_ckv_comm_ms": r["query-fp8"]["comm_ms_per_layer"]
            / r["ckv"]["comm_ms_per_layer"],
            "query_bf16_over_query_fp8_comm_ms": r["query-bf16"]["comm_ms_per_layer"]
            / r["query-fp8"]["comm_ms_per_layer"],
            "query_bf16_over_ckv_wire_bytes": r["query-bf16"]["wire_bytes_per_rank"]
            / r["ckv"]["wire_bytes_per_rank"],
        }
        point["byte_model"] = {
            "query_bf16": ckv.query_route_bytes(rows, HEADS_TP1 // n, n),
            "ckv": ckv.ckv_route_bytes(layer.plan, n),
        }
        points.append(point)
        if rank == 0:
            print(
                f"L={context:>7} rows={rows}: comm/layer query-bf16 "
                f"{r['query-bf16']['comm_ms_per_layer']:.3f} ms, query-fp8 "
                f"{r['query-fp8']['comm_ms_per_layer']:.3f} ms, ckv "
                f"{r['ckv']['comm_ms_per_layer']:.3f} ms "
                f"(x{point['ratios']['query_bf16_over_ckv_comm_ms']:.1f})",
                flush=True,
            )
        del layer
        if not smoke:
            torch.cuda.empty_cache()
    if rank == 0:
        fabric = "pcie-like" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "p2p"
        if smoke:
            fabric = "cpu-smoke"
        record = {
            "script": "scripts/bench_dcp_comm.py",
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "git_revision": git_revision(REPO),
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
                "record_bytes": ckv.FP8_DS_MLA_RECORD_BYTES,
                "interleave": args.interleave,
                "chunk": args.chunk,
            },
            "warmup": args.warmup,
            "iters": args.iters,
            "points": points,
        }
        out = (
            Path(args.out)
            if args.out
            else (
                REPO
                / "results"
                / f"bench_dcp_comm-{fabric}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
            )
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"wrote {out}")
    dist.destroy_process_group()


def byte_model_table(args: argparse.Namespace) -> str:
    """Markdown tables of the byte model (no GPU): per-rank wire bytes per layer of the
    last chunk at each context, and over a whole cold prompt chunked by ``--chunk``."""
    ckv = load_leaf(Path(args.vllm_tree).resolve(), LEAVES["ckv"])
    wire = load_leaf(Path(args.vllm_tree).resolve(), LEAVES["wire"])
    lines = []
    for n in args.dcp_sizes:
        hl = HEADS_TP1 // n
        fp8 = (wire.wire_row_bytes(QK_DIM) / QK_DIM) * 2 / 2  # bytes per element
        lines += [
            f"DCP={n} (H_local={hl}), chunk={args.chunk} rows, interleave="
            f"{args.interleave}; bytes received per rank per layer",
            "",
            "| context | last chunk: query bf16 | query fp8 | ckv | bf16/ckv |"
            " whole prompt: query bf16 | ckv | bf16/ckv |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for context in args.contexts:
            rows = min(args.chunk, context)
            q_last = ckv.query_route_bytes(rows, hl, n)
            q8_last = (
                ckv.query_route_bytes(
                    rows,
                    hl,
                    n,
                    q_elem_bytes=fp8,
                    out_elem_bytes=(wire.wire_row_bytes(V_DIM) + 4) / V_DIM,
                )
                - (n - 1) * rows * n * hl * 4
            )  # fp8 merge carries its LSE in the rows
            c_last = ckv.ckv_route_bytes(ckv.plan_chunk([context], n, args.interleave), n)
            q_all = c_all = 0
            done = 0
            while done < context:
                step = min(args.chunk, context - done)
                done += step
                q_all += ckv.query_route_bytes(step, hl, n)
                c_all += ckv.ckv_route_bytes(ckv.plan_chunk([done], n, args.interleave), n)
            lines.append(
                f"| {context:,} | {q_last / 2**20:,.1f} MiB | {q8_last / 2**20:,.1f} MiB"
                f" | {c_last / 2**20:,.2f} MiB | {q_last / c_last:,.1f}x"
                f" | {q_all / 2**20:,.0f} MiB | {c_all / 2**20:,.0f} MiB"
                f" | {q_all / c_all:,.1f}x |"
            )
        cross = ckv.ckv_crossover_tokens(args.chunk, hl, n)
        lines += [
            "",
            f"Per-chunk crossover (auto returns to the query route): "
            f"~{cross:,} accumulated tokens.",
            "",
        ]
    return "\n".join(lines)


def run_launcher(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the worker once per fabric under torchrun and merge the records."""
    passthrough = [a for a in argv if a not in ("--launch",)]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fabric, env_extra in (("p2p", {}), ("pcie-like", {"NCCL_P2P_DISABLE": "1"})):
            out = Path(tmp) / f"{fabric}.json"
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nproc-per-node={args.nproc}",
                __file__,
                *passthrough,
                "--out",
                str(out),
            ]
            env = {**os.environ, **env_extra}
            print("+", " ".join(shlex.quote(c) for c in cmd), env_extra, flush=True)
            rc = subprocess.run(cmd, env=env, check=False).returncode
            if rc != 0:
                print(f"{fabric} run failed with exit code {rc}", file=sys.stderr)
                return rc
            runs[fabric] = json.loads(out.read_text())
    record = {
        "script": "scripts/bench_dcp_comm.py",
        "command": " ".join(shlex.quote(a) for a in [sys.argv[0], *argv]),
        "git_revision": git_revision(REPO),
        "runs": runs,
        "p2p_over_pcie_like_ckv_comm_ms": [
            a["routes"]["ckv"]["comm_ms_per_layer"] / b["routes"]["ckv"]["comm_ms_per_layer"]
            for a, b in zip(runs["p2p"]["points"], runs["pcie-like"]["points"], strict=True)
        ],
    }
    out = (
        REPO / "results" / (f"bench_dcp_comm-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-tree", default=str(REPO / "build" / "vllm"))
    p.add_argument(
        "--contexts", type=int, nargs="+", default=[8192, 16384, 32768, 55296, 65536, 131072]
    )
    p.add_argument(
        "--chunk", type=int, default=8192, help="rows of the prefill chunk (max_num_batched_tokens)"
    )
    p.add_argument("--interleave", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--launch",
        action="store_true",
        help="run under torchrun for both fabrics and merge the results",
    )
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--byte-model",
        action="store_true",
        help="print the byte model's tables (no GPU, no torch.distributed)",
    )
    p.add_argument("--dcp-sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="check the script on CPU (gloo, TRITON_INTERPRET=1, tiny "
        "contexts); its timings mean nothing",
    )
    args = p.parse_args(argv)
    if args.byte_model:
        print(byte_model_table(args))
        return 0
    if args.cpu_smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--cpu-smoke needs TRITON_INTERPRET=1 in the environment")
    if args.launch:
        return run_launcher(args, argv)
    run_worker(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
