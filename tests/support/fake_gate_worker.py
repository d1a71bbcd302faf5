# SPDX-License-Identifier: Apache-2.0
"""A stand-in for scripts/gate/worker.py with no vLLM: the CPU tests launch it through
scripts/dcp_gate.py (GATE_WORKER_MODULE) to drive the launcher, the rank records and the
report end to end. Its "model" is a hash of the prompt: log-probs depend on every prompt
token, TP/DCP add a small deterministic reordering noise (GATE_FAKE_NOISE), the fault pass
moves every log-prob by 0.5, and GATE_FAKE_BROKEN=<run name> makes that run wrong."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from gate import plan


def _unit(*parts: object) -> float:
    h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def _steps(cfg: plan.GateConfig, digest: str, fault: bool) -> tuple[list[int], list[dict]]:
    noise = float(os.environ.get("GATE_FAKE_NOISE", "0.002"))
    wrong = os.environ.get("GATE_FAKE_BROKEN") == cfg.name
    tokens, steps = [], []
    for i in range(cfg.max_tokens):
        top = []
        for j in range(cfg.logprobs):
            lp = -1.0 - 2.0 * j - _unit(digest, i, j)
            if cfg.tp > 1:  # a reordered reduction: the same small noise at any TP/DCP
                lp += noise * (_unit(cfg.name, digest, i, j) - 0.5)
            lp += 0.5 * j * fault + (0.3 * j if wrong else 0.0)
            top.append([1000 + int(_unit(digest, i, "id", j) * 30000), round(lp, 6)])
        top.sort(key=lambda x: -x[1])
        tokens.append(top[0][0])
        steps.append({"token": top[0][0], "top": top})
    return tokens, steps


def main(config_path: str, out_dir: str) -> int:
    cfg = plan.GateConfig.from_json(json.loads(Path(config_path).read_text()))
    rank = int(os.environ.get("RANK", "0"))
    prompts = plan.make_prompts(cfg)
    passes = {}
    for name in cfg.passes:
        records = {}
        for keys in plan.pass_groups(cfg, name):
            for key in keys:
                ids = plan.prompt_for(key, prompts)
                digest = plan.prompt_digest(ids)
                tokens, steps = _steps(cfg, digest, name == "fault")
                records[key] = {
                    "prompt_len": len(ids),
                    "prompt_sha256": digest,
                    "tokens": tokens,
                    "steps": steps,
                }
        passes[name] = records
    record = {
        "rank": rank,
        "ok": True,
        "machine": {"vllm": "fake", "gpus": ["none"]},
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "NCCL_HOSTID", "WORLD_SIZE")},
        "attention_layers": [
            {
                "backend": cfg.backend or "AUTO",
                "impl": "FakeImpl",
                "kv_cache_dtype": str(cfg.kv_cache_dtype),
                "layer": "l0",
            }
        ],
        "passes": passes if rank == 0 else {},
        "fault": {"kind": "fake", "dcp_rank": cfg.fault_rank % cfg.dcp}
        if "fault" in cfg.passes
        else {},
    }
    (Path(out_dir) / f"{cfg.name}.rank{rank}.json").write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
