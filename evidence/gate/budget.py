#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a gate run needs before it runs, from its checkpoint's geometry (pure Python: no
vLLM, no torch): the KV-cache bytes each rank must reserve, and an estimate of its time on one
H100 with every rank of the run sharing it (one-GPU emulation).

**KV cache** (vLLM 0.34.0's layouts, as docs/memory.md counts them): per token and layer one
MLA record (``fp8_ds_mla``: 656 bytes; ``nvfp4_ds_mla``: 352; ``auto``: 576 bf16 values, 1152
bytes) plus, on every layer that builds an indexer (``indexer_types`` "full", which 0.34
honours; every layer without the pattern), the indexer's key: 128 fp8 values and one fp32
scale, 132 bytes, whatever the MLA record. Both caches are DCP-sharded, so a rank holds
ceil(max_model_len / DCP) tokens, in blocks of BLOCK_SIZE. vLLM refuses to start unless the
pool holds one request of max_model_len; the plan adds KV_SLACK and rounds up to MiB.

**Time** (an estimate, not a measurement; H100 below): a run is its engine start, then per pass
and prompt one chunked prefill and ``max_tokens`` decode steps. A prefill chunk of ``r`` rows at
context ``c`` costs, summed over all ranks of the run (they share one GPU and the host's sockets):

* the indexer's scores, 2 x 64 heads x 128 x r x (c - r/2) / DCP flop per rank and indexer
  layer (every rank of a TP = 4 DCP = 1 run scores the whole context: 4x the work of TP = 1; at
  DCP = 4 each rank scores its quarter of the keys), plus their fp32 logits written and read;
* the bytes of every collective through NCCL's socket transport: the TP all-reduces (two per
  layer and the embedding's), the DCP top-k merge (each rank's top-k candidates, 8 bytes each)
  and per attention layer the DCP route: the query route's query all-gather and LSE combine, or
  the packed-CKV route's gathered 656-byte records of the whole context, whichever is fewer bytes
  (dcp_wire_model.select_prefill_route of patch 0007, re-implemented here);
* a fixed cost per multi-rank step.

With the prefix cache on, a repeat prefill computes only the part past the cached blocks. A
batch (requests sent together) costs each request's prefill work, one step cost per step the
requests share (``max_num_batched_tokens`` rows each) and one decode of ``max_tokens`` steps.
Decode steps are eager figures also for runs under CUDA graphs: emulated multi-rank decode is
bound by the sockets and the host, and the graphs runs measured no faster (0.33.0, one H200:
TP 4 DCP 4 1.1 tok/s under graphs, 1.6 eager).

With several runs at once the queue's wall time lies between the longest run and their sum;
``queue_estimate`` schedules them as the launcher does and shares the GPU and the sockets.

    python evidence/gate/budget.py --suites long --max-ranks 9    # one row per run, markdown
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: evidence/ importable
    sys.path.insert(0, str(HERE.parent))

from gate import plan  # noqa: E402

BLOCK_SIZE = 64  # the fp8_ds_mla cache's block (FlashMLA-sparse and the Triton backend)
# nvfp4_ds_mla: 256 bytes of e2m1 NoPE, 64 of e4m3 RoPE, 32 e4m3 scales (patch 0013's layout)
MLA_RECORD_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352, "auto": 1152}
INDEXER_KEY_BYTES = 128 + 4  # 128 fp8 values + one fp32 scale per 128, whatever the MLA record
KV_SLACK = 1.2
MIB = 1 << 20
QK_DIM, V_DIM = 576, 512  # the absorbed MLA query and the latent output
CANDIDATE_BYTES = 8  # the DCP top-k merge ships (score, id) as two fp32 per candidate


def checkpoint_config(argv: list[str]) -> dict[str, Any]:
    """The config.json make_dsa_gate_ckpt.py writes for these arguments (no tensors)."""
    import make_dsa_gate_ckpt as ck

    args = ck.parser().parse_args([*argv, "--out", "/nonexistent"])
    return ck.make_config(args.arch, args.layers, args.heads, args.max_position_embeddings)


def indexer_layers(ckpt: dict[str, Any]) -> int:
    """Layers that build an indexer (and its key cache): "full" ones of ``indexer_types``."""
    types = ckpt.get("indexer_types") or ["full"] * ckpt["num_hidden_layers"]
    return sum(t == "full" for t in types)


def kv_bytes_per_token(ckpt: dict[str, Any], kv_cache_dtype: str) -> int:
    """One token's KV bytes over every layer: the MLA record plus the indexer keys."""
    if kv_cache_dtype not in MLA_RECORD_BYTES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}; valid: {', '.join(MLA_RECORD_BYTES)}")
    return (
        ckpt["num_hidden_layers"] * MLA_RECORD_BYTES[kv_cache_dtype]
        + indexer_layers(ckpt) * INDEXER_KEY_BYTES
    )


def kv_cache_bytes_needed(
    ckpt: dict[str, Any], kv_cache_dtype: str, max_model_len: int, dcp: int
) -> int:
    """The least pool one rank must hold for one request of ``max_model_len`` tokens (what
    vLLM checks at start: its 1/DCP share of them, in whole blocks)."""
    tokens = -(-max_model_len // dcp)
    blocks = -(-tokens // BLOCK_SIZE)
    return blocks * BLOCK_SIZE * kv_bytes_per_token(ckpt, kv_cache_dtype)


def kv_cache_bytes_planned(
    ckpt: dict[str, Any], kv_cache_dtype: str, max_model_len: int, dcp: int
) -> int:
    """``kv_cache_memory_bytes`` for a run: the need plus KV_SLACK, rounded up to MiB."""
    need = kv_cache_bytes_needed(ckpt, kv_cache_dtype, max_model_len, dcp)
    return math.ceil(need * KV_SLACK / MIB) * MIB


@dataclass(frozen=True)
class Machine:
    """The rates the time estimate assumes (a stated model, see each figure's note)."""

    name: str
    indexer_flops: float  # fp8 indexer scores, all ranks together
    hbm_bytes_s: float  # the indexer's fp32 logits, written and read
    socket_bytes_s: float  # every rank's collective bytes together, NCCL socket transport
    step_overhead_s: float  # per multi-rank prefill step, beyond its bytes
    decode_step_s: dict[int, float]  # per generated token, by ranks of the run
    engine_start_s: float  # a warm start (JIT caches filled by the queue's first engines)


H100 = Machine(
    name="one H100 (one-GPU emulation)",
    # ~20 % of the H100's dense fp8 peak (1979 TFLOP/s): assumed, not measured
    indexer_flops=400e12,
    # ~60 % of 3.35 TB/s: assumed
    hbm_bytes_s=2.0e12,
    # calibrated: socket_calibration() of the TP 2 DCP 2 run of results/dcp-gate-runs/
    # base034-ledger (the 1024- and 8192-token prompts' first-token latencies; an H200
    # machine of 16 cores: the socket transport is host-bound, assumed alike on the H100's)
    socket_bytes_s=3.7e9,
    step_overhead_s=0.21,
    # TP 1: 84 tok/s, TP 2 DCP 2: 20 tok/s (0.33.0 gate runs: git show
    # ec36160:results/dcp-gate-decode-rates.json; the ledger record); 4 ranks: 1.6-3 tok/s
    # measured beside 8 ranks alive, the slow end taken
    decode_step_s={1: 0.02, 2: 0.05, 4: 0.6},
    # 0.34.0 eager TP 4 starts on one H100/H200: 29-121 s (results/); a cold machine's first
    # engines: 295-327 s (design/dcp-gates.md), paid once per lease, not counted here
    engine_start_s=60.0,
)


def comm_backend(ckpt: dict[str, Any]) -> str:
    """The DCP combine vLLM picks: all-to-all for GLM-5, AG + RS for DeepSeek-V3.2 (the run
    logs' dcp_comm_backend, design/dcp-gates.md)."""
    return "a2a" if ckpt["architectures"] == ["GlmMoeDsaForCausalLM"] else "ag_rs"


def query_route_bytes(rows: int, local_heads: int, dcp: int, backend: str) -> int:
    """Bytes one rank receives for one layer on the query route (0007's wire model)."""
    gather = (dcp - 1) * rows * local_heads * QK_DIM * 2
    if backend == "a2a":  # [N, T, H_l, 512 + 2] bf16, the fp32 LSE in two slots
        combine = (dcp - 1) * rows * local_heads * (V_DIM + 2) * 2
    else:  # fp32 LSE all-gather, then a reduce-scatter of the bf16 partials
        combine = (dcp - 1) * rows * dcp * local_heads * 4 + (
            dcp - 1
        ) * rows * local_heads * V_DIM * 2
    return gather + combine


def packed_route_bytes(context: int, dcp: int) -> int:
    """Bytes one rank receives for one layer on the packed-CKV route: the peers' sections of
    the request's records (its rank-0 shard each, interleave 1)."""
    return (dcp - 1) * -(-context // dcp) * MLA_RECORD_BYTES["fp8_ds_mla"]


def chunk_cost(ckpt: dict[str, Any], cfg: plan.GateConfig, rows: int, context: int) -> dict:
    """The work of one prefill step of ``rows`` new rows ending at ``context`` tokens, summed
    over the run's ranks: indexer flop, logits bytes, socket bytes, and the DCP route taken."""
    tp, dcp, layers = cfg.tp, cfg.dcp, ckpt["num_hidden_layers"]
    idx = indexer_layers(ckpt)
    pairs = rows * (context - rows / 2) / dcp  # causal (query, key) pairs per rank
    flop = tp * idx * 2 * ckpt["index_n_heads"] * ckpt["index_head_dim"] * pairs
    logits = tp * idx * pairs * 4 * 2
    sockets = 0.0
    route = None
    if tp > 1:  # ring all-reduce of [rows, hidden] bf16: 2 (N - 1) / N of it per rank
        size = rows * ckpt["hidden_size"] * 2
        sockets += tp * (2 * layers + 1) * 2 * (tp - 1) / tp * size
    if dcp > 1:
        local_heads = ckpt["num_attention_heads"] // tp
        query = query_route_bytes(rows, local_heads, dcp, comm_backend(ckpt))
        packed = packed_route_bytes(context, dcp)
        wants_packed = cfg.engine_extra.get("dcp_prefill_route") == "packed_ckv"
        route = "packed_ckv" if wants_packed and packed < query else "query"
        sockets += tp * layers * (packed if route == "packed_ckv" else query)
        sockets += tp * idx * (dcp - 1) * rows * ckpt["index_topk"] * CANDIDATE_BYTES
    return {"flop": flop, "logits_bytes": logits, "socket_bytes": sockets, "route": route}


def prefill_estimate(
    ckpt: dict[str, Any], cfg: plan.GateConfig, prompt_len: int, cached: int = 0, m=H100
) -> dict[str, Any]:
    """One prompt's chunked prefill (its first ``cached`` tokens from the prefix cache)."""
    steps, flop, logits, sockets, routes = 0, 0.0, 0.0, 0.0, set()
    done = cached
    while done < prompt_len:
        rows = min(cfg.max_num_batched_tokens, prompt_len - done)
        done += rows
        c = chunk_cost(ckpt, cfg, rows, done)
        steps += 1
        flop += c["flop"]
        logits += c["logits_bytes"]
        sockets += c["socket_bytes"]
        routes.add(c["route"])
    gpu_s = flop / m.indexer_flops + logits / m.hbm_bytes_s
    socket_s = sockets / m.socket_bytes_s
    fixed_s = steps * m.step_overhead_s if cfg.world_size > 1 else 0.0
    return {
        "steps": steps,
        "indexer_flop": flop,
        "logits_bytes": logits,
        "socket_bytes": sockets,
        "routes": sorted(r for r in routes if r),
        "gpu_s": gpu_s,
        "socket_s": socket_s,
        "fixed_s": fixed_s,
        "seconds": gpu_s + socket_s + fixed_s,
    }


def cached_prefix(cfg: plan.GateConfig, prompt_len: int) -> int:
    """Prompt tokens a repeat serves from the prefix cache: whole blocks of every DCP rank
    (BLOCK_SIZE x DCP tokens), short of the last token, which is always recomputed."""
    span = BLOCK_SIZE * cfg.dcp
    return (prompt_len - 1) // span * span


def _prompt_len(key: str) -> int:
    """A prompt key's length: ``single/<n>``, ``single/<n>~p<pos>``, ``batch/<i>/<n>``."""
    return int(key.rsplit("/", 1)[1].partition("~")[0])


def group_estimate(
    ckpt: dict[str, Any], cfg: plan.GateConfig, keys: list[str], cached: bool, m=H100
) -> dict[str, float]:
    """One generate() call of the prompts ``keys`` sent together (a single prompt or a batch):
    each prompt's prefill work (its own chunks and contexts), one step cost per step the
    prompts share, then ``max_tokens`` decode steps; ``cached``: a prefix-cache hit."""
    lengths = [_prompt_len(k) for k in keys]
    prefills = [
        prefill_estimate(ckpt, cfg, n, cached_prefix(cfg, n) if cached else 0, m) for n in lengths
    ]
    if len(prefills) == 1:
        fixed = prefills[0]["fixed_s"]
    else:  # the requests' chunks share steps of max_num_batched_tokens rows
        rows = sum(n - (cached_prefix(cfg, n) if cached else 0) for n in lengths)
        steps = -(-rows // cfg.max_num_batched_tokens)
        fixed = steps * m.step_overhead_s if cfg.world_size > 1 else 0.0
    decode = cfg.max_tokens * m.decode_step_s[cfg.world_size]
    gpu = sum(p["gpu_s"] for p in prefills)
    sockets = sum(p["socket_s"] for p in prefills)
    return {"gpu_s": gpu, "socket_s": sockets, "fixed_s": fixed + decode}


def run_estimate(ckpt: dict[str, Any], cfg: plan.GateConfig, m: Machine = H100) -> dict:
    """The run's estimated seconds: its engine start and, per pass, each generate() call's
    prefill and decode (group_estimate: single prompts and the batch)."""
    if cfg.world_size not in m.decode_step_s:
        raise ValueError(
            f"{cfg.name}: no decode rate for {cfg.world_size} ranks; "
            f"valid: {', '.join(map(str, sorted(m.decode_step_s)))}"
        )
    passes = {}
    parts = {"gpu_s": 0.0, "socket_s": 0.0, "fixed_s": 0.0}
    for pass_name in cfg.passes:
        seconds = 0.0
        hit = pass_name == "repeat" and cfg.enable_prefix_caching
        for keys in plan.pass_groups(cfg, pass_name):
            est = group_estimate(ckpt, cfg, keys, hit, m)
            seconds += sum(est.values())
            for part, value in est.items():
                parts[part] += value
        passes[pass_name] = seconds
    return {
        "engine_start_s": m.engine_start_s,
        "passes_s": passes,
        "parts": parts,  # where the passes' time goes: the GPU, the sockets, neither
        "total_s": m.engine_start_s + sum(passes.values()),
    }


def suite_rows(suite: dict[str, Any], m: Machine = H100) -> list[dict[str, Any]]:
    """Per run of a resolved suite (plans.SUITES / merge_suites): ranks, longest prompt,
    passes, the KV pool planned and needed per rank, the estimated seconds."""
    rows = []
    for run in suite["runs"]:
        ckpt = checkpoint_config(suite["checkpoints"][run["model"].removeprefix("@")])
        cfg = plan.GateConfig.from_json(run)
        dtype = cfg.kv_cache_dtype or "auto"
        est = run_estimate(ckpt, cfg, m)
        rows.append(
            {
                "run": cfg.name,
                "ranks": cfg.world_size,
                "prompt": max(cfg.lens + cfg.batch_lens),
                "passes": list(cfg.passes),
                "kv_per_rank": cfg.kv_cache_memory_bytes,
                "kv_needed": kv_cache_bytes_needed(ckpt, dtype, cfg.max_model_len, cfg.dcp),
                "seconds": round(est["total_s"]),
                "warmup": cfg.warmup,
                "parts": est["parts"],
            }
        )
    return rows


def queue_estimate(
    rows: list[dict[str, Any]],
    max_ranks: int,
    m: Machine = H100,
    cold_start_s: float = 300.0,
    warmup_hold_s: float = 240.0,
    step_s: float = 1.0,
) -> dict[str, float]:
    """When each run of a queue (suite_rows, in queue order) would end, started as
    dcp_gate.run_many starts them: in order, while the ranks fit ``max_ranks``, the others
    held back until the warm-up engines are up (or ``warmup_hold_s``). The engines that start
    before any is up take ``cold_start_s`` (JIT caches), later ones ``m.engine_start_s``. Runs
    beside each other share the GPU and the sockets: a run spends the share ``gpu_s / work``
    of its work on the GPU, which takes n times as long while n runs use it, likewise the
    sockets; the rest (decode steps, step costs) is not shared."""
    if max_ranks < max((r["ranks"] for r in rows), default=1):
        raise ValueError(f"max_ranks {max_ranks} is below a run's ranks")
    pending = [dict(r) for r in rows]
    active: list[dict[str, Any]] = []
    ends: dict[str, float] = {}
    t, any_up = 0.0, False
    while pending or active:
        while pending:
            warming = t < warmup_hold_s and any(a["warmup"] and a["starting"] > 0 for a in active)
            busy = sum(a["ranks"] for a in active)
            if (active and busy + pending[0]["ranks"] > max_ranks) or (
                warming and not pending[0]["warmup"]
            ):
                break
            run = pending.pop(0)
            run["starting"] = m.engine_start_s if any_up else cold_start_s
            run["left"] = sum(run["parts"].values())
            active.append(run)
        working = [a for a in active if a["starting"] <= 0]
        users = {
            part: sum(1 for a in working if a["parts"][part] > 0) for part in ("gpu_s", "socket_s")
        }
        for a in active:
            if a["starting"] > 0:
                a["starting"] -= step_s
                continue
            work = sum(a["parts"].values())
            slowdown = (
                sum(a["parts"][p] * max(users.get(p, 1), 1) for p in a["parts"]) / work
                if work
                else 1.0
            )
            a["left"] -= step_s / slowdown
        t += step_s
        for a in list(active):
            if a["starting"] <= 0:
                any_up = True
                if a["left"] <= 0:
                    ends[a["run"]] = t
                    active.remove(a)
    return ends


def markdown(rows: list[dict[str, Any]], max_ranks: int) -> list[str]:
    """The rows as the README's table: KV in MiB; each run's time alone (a warm start
    included) and when it would end in the queue at ``max_ranks`` (queue_estimate)."""
    ends = queue_estimate(rows, max_ranks)
    out = [
        "| run | ranks | prompt | passes | KV per rank (needed), MiB | alone, s | "
        f"ends in the queue (`--max-ranks {max_ranks}`), s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| `{r['run']}` | {r['ranks']} | {r['prompt']:,} | {', '.join(r['passes'])} | "
            f"{r['kv_per_rank'] // MIB:,} ({math.ceil(r['kv_needed'] / MIB):,}) | "
            f"{r['seconds']:,} | {round(ends[r['run']]):,} |"
        )
    total = sum(r["seconds"] for r in rows)
    out.append(f"| all | | | | | {total:,} | {round(max(ends.values())):,} |")
    return out


def socket_calibration(record: dict[str, Any], short: int = 1024, long: int = 8192) -> dict:
    """The socket rate and the per-step cost a multi-rank run record implies: its clean pass's
    first-token latencies of two single prompts, each a one-step prefill, against their
    modelled socket bytes (latency = step cost + bytes / rate, two points)."""
    cfg = plan.GateConfig.from_json({**record["config"], "name": "calibration"})
    ckpt = checkpoint_config(record["checkpoint"]["argv"])  # its own --out is overridden
    clean = record["passes"]["clean"]
    points = []
    for n in (short, long):
        rec = clean[f"single/{n}"]
        if rec["prompt_len"] != n or n > cfg.max_num_batched_tokens:
            raise ValueError(f"single/{n} is not a one-step prefill of {n} tokens")
        sockets = chunk_cost(ckpt, cfg, n, n)["socket_bytes"]
        points.append((sockets, rec["timing"]["first_token_latency"]))
    (b1, t1), (b2, t2) = points
    rate = (b2 - b1) / (t2 - t1)
    return {"socket_bytes_s": rate, "step_overhead_s": t1 - b1 / rate}


def main(argv: list[str] | None = None) -> int:
    from gate import plans

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--suites",
        default="long",
        help=f"a queue ({', '.join(plans.QUEUES)}) or comma-separated suites, run as one queue",
    )
    ap.add_argument("--max-ranks", type=int, default=9, help="as dcp_gate.py start takes it")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    args = ap.parse_args(argv)
    names = plans.QUEUES.get(args.suites) or args.suites.split(",")
    unknown = [n for n in names if n not in plans.SUITES]
    if unknown:
        raise SystemExit(
            f"unknown suites {unknown}; valid: a queue ({', '.join(plans.QUEUES)}) or suites"
        )
    rows = suite_rows(plans.merge_suites([plans.SUITES[n] for n in names]))
    if args.json:
        ends = queue_estimate(rows, args.max_ranks)
        print(json.dumps([{**r, "ends_in_queue": round(ends[r["run"]])} for r in rows], indent=1))
    else:
        print("\n".join(markdown(rows, args.max_ranks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
