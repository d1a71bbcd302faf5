#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The KV pool each gate run's engine logged, against the record arithmetic.

A gate run gives every rank the same fixed KV budget (``kv_cache_memory_bytes``), so the pool
vLLM logs (``GPU KV cache size: N tokens``, rank 0) measures what one token costs in the KV
cache of that format. This script reads a lease's run records and rank logs (the folders or
the archives ``evidence/dev/gpu_lease.sh land`` keeps: ``gate-runs.tgz``, ``gate-ranks.tgz``)
and writes, per run, the logged pool, the bytes per token it implies, and the pool the record
arithmetic predicts: per attention layer one MLA record, per indexer layer one indexer key
(evidence/gate/budget.py), divided over the DCP ranks, floored to whole blocks. Pairs of runs
that differ only in ``kv_cache_dtype`` get the ratio of their pools.

    python3 evidence/kv_pool.py --runs build/leases/STAMP/gate-runs.tgz \\
        --logs build/leases/STAMP/gate-ranks.tgz --out results/kv-pool-nvfp4-h100-0.34.0.json

A run whose log has no pool line is listed under ``missing``; the script fails when no run has
one, or when ``--require-prediction`` is given and a logged pool differs from the prediction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import provenance  # noqa: E402
from gate.budget import (  # noqa: E402
    BLOCK_SIZE,
    INDEXER_KEY_BYTES,
    MLA_RECORD_BYTES,
    kv_bytes_per_token,
)

POOL_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
# what two runs of a pair must share: everything the pool depends on except the format
PAIR_KEYS = ("tp", "dcp", "kv_cache_memory_bytes", "graphs", "model")


def logged_pool(log: str) -> int | None:
    """The first ``GPU KV cache size`` of a rank log, in tokens, or None."""
    m = POOL_LINE.search(log)
    return int(m.group(1).replace(",", "")) if m else None


def predicted_pool(
    budget: int, kv_cache_dtype: str, layers: int, indexer_layers: int, dcp: int
) -> int:
    """Tokens a ``budget``-byte pool holds: whole blocks of BLOCK_SIZE tokens per rank, each
    token ``budget.kv_bytes_per_token`` of a checkpoint with these layers (one MLA record per
    layer, one indexer key per indexer layer); a DCP rank stores one token in ``dcp``, so the
    engine reports ``dcp`` times its own slots."""
    ckpt = {
        "num_hidden_layers": layers,
        "indexer_types": ["full"] * indexer_layers + ["shared"] * (layers - indexer_layers),
    }
    per_token = kv_bytes_per_token(ckpt, kv_cache_dtype)
    return budget // (per_token * BLOCK_SIZE) * BLOCK_SIZE * dcp


def _folder(path: Path, scratch: Path) -> Path:
    """``path`` itself, or a ``.tgz`` unpacked under ``scratch``."""
    if path.is_dir():
        return path
    dest = scratch / path.name
    dest.mkdir()
    with tarfile.open(path) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pool_row(record: dict[str, Any], log: str | None) -> dict[str, Any]:
    """One run: its configuration, the logged and the predicted pool."""
    cfg = record["config"]
    layers = record["attention_layers"][0]["layers"]
    n_idx = sum(bool(layer.get("has_indexer")) for layer in layers)
    row: dict[str, Any] = {
        "run": record["name"],
        "kv_cache_dtype": cfg["kv_cache_dtype"],
        "tp": cfg["tp"],
        "dcp": cfg["dcp"],
        "graphs": cfg["graphs"],
        "model": cfg["model"],
        "kv_cache_memory_bytes": cfg["kv_cache_memory_bytes"],
        "attention_layers": len(layers),
        "indexer_layers": n_idx,
        "predicted_tokens": predicted_pool(
            cfg["kv_cache_memory_bytes"], cfg["kv_cache_dtype"], len(layers), n_idx, cfg["dcp"]
        ),
        "logged_tokens": logged_pool(log) if log is not None else None,
        "gpu": (record.get("machine", {}).get("gpus") or [{}])[0].get("name"),
        "series": record.get("revision", {}).get("series"),
        "vllm": record.get("base", {}).get("vllm"),
    }
    if row["logged_tokens"]:
        row["bytes_per_token_per_rank"] = round(
            row["kv_cache_memory_bytes"] * row["dcp"] / row["logged_tokens"], 1
        )
    row["matches_prediction"] = row["logged_tokens"] == row["predicted_tokens"]
    return row


def format_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pair of logged runs alike in PAIR_KEYS but for the format: pool of one over the
    other (the larger over the smaller)."""
    out = []
    logged = [r for r in rows if r["logged_tokens"]]
    for i, a in enumerate(logged):
        for b in logged[i + 1 :]:
            if a["kv_cache_dtype"] == b["kv_cache_dtype"]:
                continue
            if any(a[k] != b[k] for k in PAIR_KEYS):
                continue
            big, small = sorted((a, b), key=lambda r: -r["logged_tokens"])
            out.append(
                {
                    "larger": big["run"],
                    "smaller": small["run"],
                    "formats": f"{big['kv_cache_dtype']} vs {small['kv_cache_dtype']}",
                    "tokens": [big["logged_tokens"], small["logged_tokens"]],
                    "ratio": round(big["logged_tokens"] / small["logged_tokens"], 4),
                    "predicted_ratio": round(
                        big["predicted_tokens"] / small["predicted_tokens"], 4
                    ),
                }
            )
    return out


def collect(runs_dir: Path, logs_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for every run record under ``runs_dir`` (``runs/*.json`` or ``*.json``) with its
    rank-0 log from ``logs_dir`` (``logs/<run>.rank0.log``); the runs without a pool line."""
    records = sorted((runs_dir / "runs").glob("*.json")) or sorted(runs_dir.glob("*.json"))
    log_root = logs_dir / "logs" if (logs_dir / "logs").is_dir() else logs_dir
    rows, missing = [], []
    for f in records:
        record = json.loads(f.read_text())
        if record.get("kind") != "dcp_gate_run":
            continue
        log_file = log_root / f"{record['name']}.rank0.log"
        log = log_file.read_text(errors="replace") if log_file.is_file() else None
        row = pool_row(record, log)
        if row["logged_tokens"] is None:
            missing.append(record["name"])
        rows.append(row)
    return rows, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="run records: folder or .tgz")
    ap.add_argument("--logs", type=Path, required=True, help="rank logs: folder or .tgz")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--require-prediction",
        action="store_true",
        help="fail when a logged pool differs from the record arithmetic",
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows, missing = collect(_folder(args.runs, Path(tmp)), _folder(args.logs, Path(tmp)))
    logged = [r for r in rows if r["logged_tokens"]]
    if not logged:
        print("no run logged its KV pool", file=sys.stderr)
        return 1
    off = [r["run"] for r in logged if not r["matches_prediction"]]
    series = sorted({r["series"] for r in rows if r["series"]})
    bases = sorted({r["vllm"] for r in rows if r["vllm"]})
    if len(series) > 1 or len(bases) > 1:
        print(f"runs of several revisions or bases: {series} {bases}", file=sys.stderr)
        return 1
    doc = {
        "schema_version": 1,
        "kind": "kv_pool",
        "what": "KV pool logged by each gate run's engine at a fixed per-rank budget, "
        "against one MLA record per layer plus one indexer key per indexer layer",
        "command": provenance.command(None if argv is None else [__file__, *argv]),
        "revision": {"series": series[0] if series else None},
        "base": {"vllm": bases[0] if bases else None},
        "machine": {"gpus": sorted({r["gpu"] for r in rows if r["gpu"]})},
        "record_bytes": MLA_RECORD_BYTES,
        "indexer_key_bytes": INDEXER_KEY_BYTES,
        "block_size": BLOCK_SIZE,
        "sources": {p.name: _sha256(p) for p in (args.runs, args.logs) if p.is_file()},
        "runs": rows,
        "ratios": format_ratios(rows),
        "missing": missing,
        "off_prediction": off,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['run']}: logged {r['logged_tokens']} predicted {r['predicted_tokens']} "
            f"({r['kv_cache_dtype']}, dcp {r['dcp']})"
        )
    for p in doc["ratios"]:
        print(f"{p['formats']}: {p['ratio']}x (predicted {p['predicted_ratio']}x)")
    if off and args.require_prediction:
        print(f"logged pool differs from the arithmetic: {', '.join(off)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
