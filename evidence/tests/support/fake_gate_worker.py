# SPDX-License-Identifier: Apache-2.0
"""A stand-in for evidence/gate/worker.py with no vLLM: the CPU tests launch it through
evidence/dcp_gate.py (GATE_WORKER_MODULE) to drive the launcher, the rank records and the
report end to end. Its "model" is a hash of the prompt: log-probs depend on every prompt
token, TP/DCP add a small deterministic reordering noise (GATE_FAKE_NOISE), the fault pass
moves every log-prob by 0.5, and GATE_FAKE_BROKEN=<run name> makes that run wrong.
GATE_FAKE_SHIFT=<run>:<delta> shifts that run's log-probs from step 1 on, GATE_FAKE_FLIP=<run>
changes one greedy token of its clean pass, an fp8 wire adds GATE_FAKE_WIRE_NOISE.
A ``memory_probe`` run writes a memory record whose largest prefill step fits only with the
reservation (GATE_DROP_DCP_RESERVATION=alloc: over budget; =all: refused at start-up).
GATE_FAKE_HANG=<run>:<pass>:<group>[,...] stops that run in that generate() group of that pass (the
suite's deadline kills it), GATE_FAKE_CRASH=<run>:<pass>:<group> raises there. The rank record
is the real worker's (gate.worker.RankRecord): rewritten after every pass whose groups all
returned, so a killed run leaves its finished passes. It imports
``vllm`` from whatever tree the launcher put first on PYTHONPATH and records where from; with
the ledger on it writes a ledger per pass, a speculative run writes spec-decode counters."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from gate import plan
from gate.worker import RankRecord


def _unit(*parts: object) -> float:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _steps(cfg: plan.GateConfig, digest: str, fault: bool) -> tuple[list[int], list[dict]]:
    noise = float(os.environ.get("GATE_FAKE_NOISE", "0.002"))
    if cfg.engine_extra.get("dcp_wire_dtype") == "fp8":
        noise += float(os.environ.get("GATE_FAKE_WIRE_NOISE", "0.0"))
    wrong = os.environ.get("GATE_FAKE_BROKEN") == cfg.name
    run, _, delta = os.environ.get("GATE_FAKE_SHIFT", "").partition(":")
    shift = float(delta) if run == cfg.name else 0.0
    tokens, steps = [], []
    for i in range(cfg.max_tokens):
        top = []
        for j in range(cfg.logprobs):
            lp = -1.0 - 2.0 * j - _unit(digest, i, j)
            if cfg.tp > 1:  # a reordered reduction: the same small noise at any TP/DCP
                lp += noise * (_unit(cfg.name, digest, i, j) - 0.5)
            lp += 0.5 * j * fault + (0.3 * j if wrong else 0.0) + (shift if i >= 1 else 0.0)
            top.append([1000 + int(_unit(digest, i, "id", j) * 30000), round(lp, 6)])
        top.sort(key=lambda x: -x[1])
        tokens.append(top[0][0])
        steps.append({"token": top[0][0], "top": top})
    return tokens, steps


def main(config_path: str, out_dir: str) -> int:
    cfg = plan.GateConfig.from_json(json.loads(Path(config_path).read_text()))
    rank = int(os.environ.get("RANK", "0"))
    prompts = plan.make_prompts(cfg)
    import time

    import vllm  # the stand-in tree the launcher chose for this variant

    time.sleep(float(os.environ.get("GATE_FAKE_SLEEP", "0")))
    print(f"[{cfg.name} r{rank}] engine up in 0.0 s", flush=True)  # what the launcher waits for
    time.sleep(float(os.environ.get("GATE_FAKE_PASS_SLEEP", "0")))

    rec = RankRecord(Path(out_dir), cfg.name, rank)
    rec.data.update(
        machine={
            "vllm": vllm.__version__,
            "vllm_path": str(Path(vllm.__file__).parent),
            "gpus": ["none"],
        },
        env={k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "NCCL_HOSTID", "WORLD_SIZE")},
        attention_layers=[
            {
                "backend": cfg.backend or "AUTO",
                "impl": "FakeImpl",
                "kv_cache_dtype": str(cfg.kv_cache_dtype),
                "layer": "l0",
            }
        ],
    )
    if cfg.memory_probe:
        drop = cfg.env.get(plan.DROP_RESERVATION_ENV)
        if drop == "all":  # what the series' start-up check does without a reservation
            rec.fail("ValueError: DCP headroom check: the profiling forward reserved 0 rows", "")
            return 1
        gib = 1 << 30
        # the reservation raises the profiled peak by 1 GiB; a step peaks at 3.5 GiB + pool;
        # the profile starts at 1 GiB, the steps at 1 GiB + pool (a step transient of 2.5 GiB
        # against the profile's 3 GiB, 2 GiB without the reservation)
        profiled = 4 * gib if drop is None else 3 * gib
        kv = cfg.kv_cache_memory_bytes
        rec.data["memory"] = {
            "profile": {
                "allocated_before_bytes": gib,
                "peak_bytes": profiled,
                "kv_cache_bytes": kv,
            },
            "steps": {
                "prefill": {
                    "steps": 2,
                    "peak_bytes": gib * 7 // 2 + kv,
                    "peak_step_start_bytes": gib + kv,
                },
                "decode": {"steps": 31, "peak_bytes": gib + kv, "peak_step_start_bytes": gib + kv},
            },
            "engine": {"num_gpu_blocks": 1000 - cfg.dcp, "block_size": 64},
        }
    rec.write()
    fault = {"kind": "fake", "dcp_rank": cfg.fault_rank % cfg.dcp} if "fault" in cfg.passes else {}
    stop = {  # comma-separated <run>:<pass>:<group> triples
        kind: {tuple(x.split(":")) for x in os.environ.get(f"GATE_FAKE_{kind}", "").split(",")}
        for kind in ("HANG", "CRASH")
    }
    passes: dict[str, dict] = {}
    extras: dict[str, dict] = {}
    try:
        for name in cfg.passes:
            records = {}
            for g, keys in enumerate(plan.pass_groups(cfg, name)):
                here = (cfg.name, name, str(g))
                if here in stop["HANG"]:
                    print(f"[{cfg.name} r{rank}] hanging in {name} group {g}", flush=True)
                    time.sleep(600)
                if here in stop["CRASH"]:
                    raise RuntimeError(f"fake crash in {name} group {g}")
                for key in keys:
                    ids = plan.prompt_for(key, prompts)
                    digest = plan.prompt_digest(ids)
                    tokens, steps = _steps(cfg, digest, name == "fault")
                    if name == "clean" and os.environ.get("GATE_FAKE_FLIP") == cfg.name:
                        tokens = tokens[:-1] + [tokens[-1] + 1]
                    records[key] = {
                        "prompt_len": len(ids),
                        "prompt_sha256": digest,
                        "tokens": tokens,
                        "steps": steps,
                    }
            passes[name] = records
            if cfg.engine_extra.get("dcp_comm_ledger_size", 0) > 0:
                per_row = 656 if cfg.engine_extra.get("dcp_wire_dtype") == "fp8" else 1152
                rows = sum(r["prompt_len"] for r in records.values())
                extras.setdefault("ledger", {})[name] = {
                    "armed": True,
                    "layers": {
                        f"l{i}": {"q_gather": {"calls": 3, "wire_bytes": rows * per_row}}
                        for i in range(2)
                    },
                }
            if cfg.speculative and name == "clean":
                extras["spec"] = {
                    "clean": {"metrics": {"vllm:spec_decode_num_drafts": 7}, "depths": [2, 2]}
                }
            rec.pass_done(passes, extras, fault, keep_tokens=rank == 0)
    except RuntimeError as e:
        rec.fail(f"{type(e).__name__}: {e}", "")
        return 1
    rec.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
