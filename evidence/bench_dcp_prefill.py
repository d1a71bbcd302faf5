# SPDX-License-Identifier: Apache-2.0
"""GPU evidence: cold prefill throughput of the DCP prefill transports, end to end in vLLM 0.33.

Model: ``evidence/models/glm5-attn-tiny`` (GLM-5 attention geometry: 64 heads at TP1,
MLA 512 + 64 -> 576, V latent 512, DSA top-k 2048; 4 small dense layers; served by 0.33's CUDA
DSA layer ``DeepseekV32Attention``) with dummy weights, fp8_ds_mla KV cache, prefix caching off,
so every prompt is prefilled cold. Configurations (TP=``--tp`` GPUs, DCP=``--dcp``):

* ``dcp1``: DCP=1 (the ceiling: no DCP traffic, 1/N of the KV capacity per rank);
* ``query``: 0.33's GLM default transport (``dcp_comm_backend="a2a"``; the CUDA DSA layer
  does not honour ``dcp_q_replicate``), stock query route (``dcp_prefill_route="query"``);
* ``query-fp8``: the query route with patch 0008's fp8 wire (``dcp_wire_dtype="fp8"``);
* ``ckv``: patch 0007's packed-CKV route (``dcp_prefill_route="ckv"``);
* ``auto``: ``dcp_prefill_route="auto"``;
* ``ckv-fp8``: ``ckv`` with the fp8 wire for the decode rows' collectives.

For each prompt length (default 8k / 32k / 64k) it times ``generate`` of ``--prompts`` random
prompts with ``max_tokens=1`` (prefill tok/s), then generates ``--greedy-tokens`` greedy tokens
for one 8k and one 32k prompt so the driver can compare every DCP configuration's tokens with
DCP=1's (with dummy weights that shows the transports run, not equivalence). The DCP ledger
(patch 0009, ``dcp_comm_ledger_size``) is on and its per-layer summary is stored.

One configuration under torchrun (vLLM's ``external_launcher``, one process per GPU):

    torchrun --nproc-per-node 2 evidence/bench_dcp_prefill.py --worker --config ckv

All configurations on both fabrics in one run (it launches torchrun per configuration, once
with NVLink P2P and once with ``NCCL_P2P_DISABLE=1``), ratios from the same run:

    python evidence/bench_dcp_prefill.py

Writes ``results/bench_dcp_prefill-<UTC time>.json`` (command, git revision, base version,
machine, figures, ratios, token comparison). Needs vLLM 0.33.0 with the series (0002, 0007-0009)
installed, e.g. the overlay wheel. Without GPUs, ``--byte-model --vllm-tree <patched tree>``
prints the per-layer bytes each configuration moves for the same prompts (no vLLM engine).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import git_revision, load_module, write_result
from provenance import machine as provenance_machine

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "evidence" / "models" / "glm5-attn-tiny"
BASE_VERSION = "0.33.0"
CONFIGS: dict[str, dict[str, Any]] = {
    "dcp1": {"dcp": 1},
    "query": {"dcp": 2, "dcp_prefill_route": "query", "dcp_wire_dtype": "auto"},
    "query-fp8": {"dcp": 2, "dcp_prefill_route": "query", "dcp_wire_dtype": "fp8"},
    "ckv": {"dcp": 2, "dcp_prefill_route": "ckv", "dcp_wire_dtype": "auto"},
    "auto": {"dcp": 2, "dcp_prefill_route": "auto", "dcp_wire_dtype": "auto"},
    "ckv-fp8": {"dcp": 2, "dcp_prefill_route": "ckv", "dcp_wire_dtype": "fp8"},
}
FABRICS = {"p2p": {}, "pcie-like": {"NCCL_P2P_DISABLE": "1"}}
GREEDY_LENGTHS = (8192, 32768)


def machine() -> dict[str, Any]:
    return provenance_machine(topology=True)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``LLM(...)`` arguments of one configuration.

    The DCP transport settings are plain engine arguments (patches 0007-0009 add them to
    EngineArgs), so a vLLM without those patches refuses them instead of ignoring them.
    """
    cfg = CONFIGS[args.config]
    kwargs: dict[str, Any] = dict(
        model=str(args.model),
        skip_tokenizer_init=True,
        load_format="dummy",
        tensor_parallel_size=args.tp,
        decode_context_parallel_size=args.dcp if cfg["dcp"] > 1 else 1,
        distributed_executor_backend="external_launcher",
        kv_cache_dtype="fp8_ds_mla",
        max_model_len=max(args.lengths) + 256,
        max_num_batched_tokens=args.chunk,
        max_num_seqs=args.max_num_seqs,
        enable_prefix_caching=False,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        seed=0,
    )
    if args.attention_backend:
        kwargs["attention_backend"] = args.attention_backend
    if cfg["dcp"] > 1:
        kwargs.update(
            dcp_comm_backend="a2a",  # 0.33's GLM default, set explicitly
            dcp_prefill_route=cfg["dcp_prefill_route"],
            dcp_wire_dtype=cfg["dcp_wire_dtype"],
            dcp_comm_ledger_size=args.ledger_size,
        )
    return kwargs


def run_worker(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import torch.distributed as dist
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    cfg = CONFIGS[args.config]
    llm = LLM(**engine_kwargs(args))
    rank = dist.get_rank() if dist.is_initialized() else 0
    gen = torch.Generator().manual_seed(1234)

    def prompts(length: int, count: int) -> list[TokensPrompt]:
        ids = torch.randint(2, 32000, (count, length), generator=gen)
        return [TokensPrompt(prompt_token_ids=row.tolist()) for row in ids]

    prefill = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.generate(prompts(4096, 1), prefill, use_tqdm=False)  # warm-up
    from vllm.v1.attention.ops.dcp import get_dcp_comm_ledger

    ledger = get_dcp_comm_ledger()  # this worker's (external_launcher: same process)
    figures = []
    for length in args.lengths:
        batch = prompts(length, args.prompts)
        if ledger is not None:
            ledger.reset()
        if dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        llm.generate(batch, prefill, use_tqdm=False)
        elapsed = time.perf_counter() - start
        point = {
            "prompt_len": length,
            "prompts": args.prompts,
            "seconds": elapsed,
            "prefill_tok_per_s": length * args.prompts / elapsed,
        }
        if ledger is not None:
            point["ledger"] = ledger.summary()
        figures.append(point)
        if rank == 0:
            print(
                f"{args.config}: {length} x {args.prompts}: {point['prefill_tok_per_s']:.0f} tok/s",
                flush=True,
            )
    greedy = {}
    if args.greedy_tokens > 0:
        gen.manual_seed(99)
        params = SamplingParams(max_tokens=args.greedy_tokens, temperature=0.0, ignore_eos=True)
        for length in GREEDY_LENGTHS:
            if length > max(args.lengths):
                continue
            out = llm.generate(prompts(length, 1), params, use_tqdm=False)
            greedy[str(length)] = list(out[0].outputs[0].token_ids)
    if rank == 0 and args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "config": args.config,
                    "settings": cfg,
                    "figures": figures,
                    "greedy_tokens": greedy,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )


def run_driver(args: argparse.Namespace, argv: list[str], passthrough: list[str]) -> int:
    runs: dict[str, dict[str, Any]] = {}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for fabric in args.fabrics:
            runs[fabric] = {}
            for config in args.configs:
                out = Path(tmp) / f"{fabric}-{config}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nproc-per-node={args.tp}",
                    __file__,
                    "--worker",
                    "--config",
                    config,
                    "--out",
                    str(out),
                    *passthrough,
                ]
                env = {**os.environ, **FABRICS[fabric]}
                print("+", FABRICS[fabric], " ".join(shlex.quote(c) for c in cmd), flush=True)
                rc = subprocess.run(cmd, env=env, check=False).returncode
                if rc != 0 or not out.is_file():
                    failures.append(f"{fabric}/{config}: exit code {rc}")
                    continue
                runs[fabric][config] = json.loads(out.read_text())
    ratios: dict[str, Any] = {}
    tokens: dict[str, Any] = {}
    for fabric, by_config in runs.items():
        base = by_config.get("query")
        ceiling = by_config.get("dcp1")
        ratios[fabric] = {}
        for config, rec in by_config.items():
            per_len = {}
            for i, point in enumerate(rec["figures"]):
                entry = {}
                if base is not None:
                    entry["over_query"] = (
                        point["prefill_tok_per_s"] / base["figures"][i]["prefill_tok_per_s"]
                    )
                if ceiling is not None:
                    entry["over_dcp1"] = (
                        point["prefill_tok_per_s"] / ceiling["figures"][i]["prefill_tok_per_s"]
                    )
                per_len[str(point["prompt_len"])] = entry
            ratios[fabric][config] = per_len
        if ceiling is not None:
            tokens[fabric] = {
                config: {
                    length: rec["greedy_tokens"].get(length) == ids
                    for length, ids in ceiling["greedy_tokens"].items()
                }
                for config, rec in by_config.items()
                if config != "dcp1"
            }
    record = {
        "script": "evidence/bench_dcp_prefill.py",
        "command": " ".join(shlex.quote(a) for a in [sys.argv[0], *argv]),
        "git_revision": git_revision(REPO),
        "base_version": BASE_VERSION,
        "machine": machine(),
        "model": str(args.model),
        "settings": {
            "tp": args.tp,
            "dcp": args.dcp,
            "chunk": args.chunk,
            "lengths": args.lengths,
            "prompts": args.prompts,
            "attention_backend": args.attention_backend,
            "enforce_eager": args.enforce_eager,
        },
        "runs": runs,
        "ratios": ratios,
        "greedy_tokens_equal_to_dcp1": tokens,
        "failures": failures,
    }
    out = (
        REPO
        / "results"
        / (f"bench_dcp_prefill-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    )
    write_result(out, record)
    print(f"wrote {out}")
    for fabric, by_config in ratios.items():
        for config, per_len in by_config.items():
            print(
                fabric,
                config,
                {k: {kk: round(vv, 3) for kk, vv in v.items()} for k, v in per_len.items()},
            )
    return 1 if failures else 0


def byte_model_report(args: argparse.Namespace) -> str:
    """Bytes each rank receives per layer over the timed prompts of every DCP
    configuration, from the shipped byte model and route choice (patches 0007/0008):
    the prompt is prefilled in chunks of ``--chunk`` rows, each chunk takes the route
    the configuration picks for it (the auto choice included)."""

    tree = Path(args.vllm_tree).resolve()
    mods = {}
    for key, rel in (
        ("model", "vllm/v1/attention/ops/dcp_wire_model.py"),
        ("ckv", "vllm/v1/attention/ops/dcp_packed_ckv.py"),
    ):
        path = tree / rel
        if not path.is_file():
            raise SystemExit(f"{path} not found: pass --vllm-tree (the patched vLLM tree)")
        mods[key] = load_module(path, f"bench_prefill_{key}")
    model, ckv = mods["model"], mods["ckv"]
    n, heads = args.dcp, 64 // args.tp
    capacity = ckv.packed_ckv_capacity_rows(max(args.lengths) + 256, args.max_num_seqs, n, 1)
    lines = [
        f"TP={args.tp} DCP={n} (H_local={heads}), chunk={args.chunk}, a2a combine; "
        "MiB received per rank per layer over one cold prompt (chunks on the route chosen)",
        "",
        "| prompt | " + " | ".join(c for c in CONFIGS if c != "dcp1") + " |",
        "|---:|" + "---:|" * (len(CONFIGS) - 1),
    ]
    for length in args.lengths:
        cells = []
        for name, cfg in CONFIGS.items():
            if name == "dcp1":
                continue
            total, done, ckv_chunks, chunks = 0, 0, 0, 0
            while done < length:
                rows = min(args.chunk, length - done)
                done += rows
                chunks += 1
                rank_rows = ckv.packed_ckv_layout([done], n, 1).rank_rows
                route = model.select_prefill_route(
                    cfg["dcp_prefill_route"],
                    rank_rows=rank_rows,
                    capacity_rows=capacity,
                    num_prefill_rows=rows,
                    num_decode_rows=0,
                    can_split_decode_rows=True,
                    num_local_heads=heads,
                    dcp_size=n,
                    comm_backend="a2a",
                    wire_dtype=cfg["dcp_wire_dtype"],
                )
                if route == "ckv":
                    ckv_chunks += 1
                    total += model.ckv_route_bytes(rank_rows, n).total
                else:
                    total += model.query_route_bytes(
                        rows, heads, n, "a2a", wire_dtype=cfg["dcp_wire_dtype"]
                    ).total
            cells.append(f"{total / 2**20:,.1f} ({ckv_chunks}/{chunks} ckv)")
        lines.append(f"| {length:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help="run one configuration (under torchrun)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="ckv")
    p.add_argument(
        "--configs",
        nargs="+",
        choices=sorted(CONFIGS),
        default=["dcp1", "query", "query-fp8", "ckv", "auto", "ckv-fp8"],
    )
    p.add_argument("--fabrics", nargs="+", choices=sorted(FABRICS), default=["p2p", "pcie-like"])
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument(
        "--dcp", type=int, default=2, help="DCP size of the DCP configurations (divides --tp)"
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 65536])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument(
        "--chunk", type=int, default=8192, help="max_num_batched_tokens (the prefill chunk)"
    )
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument(
        "--attention-backend",
        default=None,
        help="attention backend name (default: vLLM's choice for the GPU)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--greedy-tokens", type=int, default=16)
    p.add_argument("--ledger-size", type=int, default=64)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--byte-model",
        action="store_true",
        help="print the per-layer bytes of every configuration (CPU, no engine)",
    )
    p.add_argument("--vllm-tree", default=str(REPO / "build" / "vllm"))
    args = p.parse_args(argv)
    if args.byte_model:
        print(byte_model_report(args))
        return 0
    if args.worker:
        run_worker(args)
        return 0
    worker_argv = list(argv)
    for flag in ("--configs", "--fabrics"):
        if flag in worker_argv:  # driver-only options are not passed to workers
            i = worker_argv.index(flag)
            j = i + 1
            while j < len(worker_argv) and not worker_argv[j].startswith("--"):
                j += 1
            del worker_argv[i:j]
    return run_driver(args, argv, worker_argv)


if __name__ == "__main__":
    raise SystemExit(main())
