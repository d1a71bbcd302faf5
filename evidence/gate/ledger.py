# SPDX-License-Identifier: Apache-2.0
"""The DCP communication ledger of gate runs, side by side: bytes per rank per layer (exact)
and per-call times, per phase, for one pass of each run.

The comm ledger (``dcp_comm_ledger_size > 0``: patch 0009 on the 0.33 series, the harness's
``gate/comm_ledger.py`` since 0.34.0) counts every MLA DCP collective's wire bytes exactly and
times the last ``capacity`` calls of each phase with CUDA events; the gate worker stores its
summary per pass in each rank's record (``ledger``). Runs compared here must
have served the same prompts in the compared passes (the prompts are seeded per prompt, so a
light run's ``clean`` pass and a full run's ``repeat`` pass, both the 1k and 8k singles and the
batch, are the same requests); the output records each run's prompt digests so that this can be
checked, and refuses runs whose prompts differ.

Times come from ranks sharing one GPU and talking over host sockets when the run says so
(``transport``): they are labelled with it and are never fabric figures.

    python3 evidence/gate/ledger.py --work <gate work folder> --out results/dcp-ledger-X.json \\
        query=p-glmn-tp2-dcp2:repeat ckv=p-glmn-tp2-dcp2-ckv:clean fp8=p-glmn-tp2-dcp2-fp8wire:clean

``--control RUN:PASS`` adds the observer check: the first entry's tokens and log-probs against
the same configuration served without a ledger.

Beside the bytes moved, each entry carries what each rank held on the GPU outside torch's
allocator once its engine was up (``non_torch_bytes``, from NVML's per-process figure less
torch's reserved bytes) and its difference to the first entry's: the memory a transport
allocates for itself (the b12x channel's IPC slab, 0015) shows there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def phase_sums(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One rank's ledger summary of one pass, per phase: calls and wire bytes summed over the
    layers, the number of layers, and each layer's own calls, bytes and timed-call mean."""
    phases: dict[str, dict[str, Any]] = {}
    for layer, per_phase in sorted((summary.get("layers") or {}).items()):
        for phase, v in per_phase.items():
            calls, wire = int(v.get("calls", 0)), int(v.get("wire_bytes", 0))
            p = phases.setdefault(
                phase, {"calls": 0, "wire_bytes": 0, "layers": 0, "per_layer": {}}
            )
            p["calls"] += calls
            p["wire_bytes"] += wire
            p["layers"] += 1
            p["per_layer"][layer] = {
                "calls": calls,
                "wire_bytes": wire,
                "mean_ms": v.get("mean_ms"),
                "timed_calls": v.get("timed_calls"),
            }
    return phases


def pass_ledger(run: dict[str, Any], pass_name: str) -> dict[str, Any]:
    """One run's ledger for one pass: per rank, per phase, the totals over layers (calls,
    wire bytes) and the per-layer figures (bytes per call, mean ms of the timed calls)."""
    ranks = run.get("ledger") or []
    if not ranks:
        raise ValueError(f"run {run.get('name')!r} has no ledger (dcp_comm_ledger_size 0?)")
    out: dict[str, Any] = {}
    for rank in ranks:
        summary = (rank.get("passes") or {}).get(pass_name)
        if summary is None:
            raise ValueError(f"run {run.get('name')!r} rank {rank.get('rank')}: no {pass_name!r}")
        if not summary.get("armed", True):
            raise ValueError(
                f"run {run.get('name')!r} rank {rank.get('rank')}: the ledger was disarmed "
                f"({summary.get('disarm_reason')})"
            )
        phases = phase_sums(summary)
        layers = max((p["layers"] for p in phases.values()), default=0)
        for p in phases.values():
            p["wire_bytes_per_layer"] = p["wire_bytes"] / max(p["layers"], 1)
        out[str(rank.get("rank"))] = {
            "layers": layers,
            "phases": phases,
            "wire_bytes": sum(p["wire_bytes"] for p in phases.values()),
            "wire_bytes_per_layer": sum(p["wire_bytes"] for p in phases.values()) / max(layers, 1),
        }
    return out


def non_torch_bytes(run: dict[str, Any]) -> dict[str, int | None]:
    """Per rank, the GPU memory the rank process held outside torch's allocator once its
    engine was up (the run's ``device_memory``; empty for a run recorded without it)."""
    return {str(m["rank"]): m.get("non_torch_bytes") for m in run.get("device_memory") or []}


def prompt_digests(run: dict[str, Any], pass_name: str) -> dict[str, str]:
    records = (run.get("passes") or {}).get(pass_name) or {}
    return {key: rec["prompt_sha256"] for key, rec in sorted(records.items())}


def observer_check(
    measured: tuple[dict[str, Any], str], control: tuple[dict[str, Any], str]
) -> dict[str, Any]:
    """Does recording change what is served? The ledger run's pass against the same
    configuration without a ledger: per prompt, greedy tokens exact, and the largest
    |delta log-prob| over the ids in both top-k lists (compare it with the run-to-run noise
    floor of that configuration; it is not a verdict by itself)."""
    from gate import verdict  # verdict imports this module

    (run, pass_name), (ctl, ctl_pass) = measured, control
    if prompt_digests(run, pass_name) != prompt_digests(ctl, ctl_pass):
        raise ValueError(f"control {ctl.get('name')}:{ctl_pass} served other prompts")
    a, b = run["passes"][pass_name], ctl["passes"][ctl_pass]
    tokens = verdict.tokens_exact(b, a)
    diffs = []
    for key in sorted(a):
        at = verdict.largest_difference(b[key]["steps"], a[key]["steps"])["at"]
        if at is not None:
            diffs.append(abs(at["ref"] - at["cand"]))
    return {
        "control": f"{ctl.get('name')}:{ctl_pass}",
        "tokens_exact_prompts": sum(r["exact"] for r in tokens["prompts"].values()),
        "prompts": len(tokens["prompts"]),
        "max_abs_logprob_diff": max(diffs, default=None),
    }


def compare(
    entries: dict[str, tuple[dict[str, Any], str]],
    control: tuple[dict[str, Any], str] | None = None,
) -> dict[str, Any]:
    """Label -> (run record, pass): the ledgers side by side, wire bytes per rank as ratios
    to the first entry. Refuses entries whose prompts differ from the first one's. With
    ``control`` (the first entry's configuration without a ledger), the observer check."""
    if not entries:
        raise ValueError("nothing to compare")
    first_label = next(iter(entries))
    first_prompts = prompt_digests(*entries[first_label])
    rows: dict[str, Any] = {}
    for label, (run, pass_name) in entries.items():
        prompts = prompt_digests(run, pass_name)
        if prompts != first_prompts:
            raise ValueError(
                f"{label}: {run.get('name')}:{pass_name} served other prompts than "
                f"{first_label} ({sorted(prompts)} vs {sorted(first_prompts)})"
            )
        ledger = pass_ledger(run, pass_name)
        rows[label] = {
            "run": run.get("name"),
            "pass": pass_name,
            "dcp": (run.get("config") or {}).get("dcp"),
            "engine_extra": (run.get("config") or {}).get("engine_extra"),
            "transport": run.get("transport"),
            "per_rank": ledger,
            "non_torch_bytes": non_torch_bytes(run),
        }
    base = rows[first_label]["per_rank"]
    base_mem = rows[first_label]["non_torch_bytes"]
    for row in rows.values():
        row["wire_bytes_over_" + first_label] = {
            r: v["wire_bytes"] / base[r]["wire_bytes"]
            if base.get(r, {}).get("wire_bytes")
            else None
            for r, v in row["per_rank"].items()
        }
        row["non_torch_bytes_minus_" + first_label] = {
            r: v - base_mem[r] if v is not None and base_mem.get(r) is not None else None
            for r, v in row["non_torch_bytes"].items()
        }
    out = {
        "kind": "dcp_comm_ledger",
        "prompts": sorted(first_prompts),
        "reference": first_label,
        "entries": rows,
        "timing_label": "; ".join(sorted({str(r["transport"]) for r in rows.values()})),
        "note": "wire bytes are exact counts of the collectives' payloads per rank; times are "
        "means of the CUDA-event-timed calls (the ledger keeps the last `capacity` calls per "
        "phase) under the run's transport",
    }
    if control is not None:
        out["observer_check"] = observer_check(entries[first_label], control)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="gate work folder (runs/*.json)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("entries", nargs="+", help="label=run:pass (the first is the reference)")
    p.add_argument(
        "--control", default=None, help="run:pass, the first entry's configuration without a ledger"
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # evidence/: gate, provenance
    entries: dict[str, tuple[dict[str, Any], str]] = {}
    for spec in args.entries:
        label, _, rest = spec.partition("=")
        name, _, pass_name = rest.partition(":")
        if not (label and name and pass_name):
            p.error(f"entry {spec!r} is not label=run:pass")
        entries[label] = (json.loads((args.work / "runs" / f"{name}.json").read_text()), pass_name)
    control = None
    if args.control:
        name, _, pass_name = args.control.partition(":")
        if not (name and pass_name):
            p.error(f"--control {args.control!r} is not run:pass")
        control = (json.loads((args.work / "runs" / f"{name}.json").read_text()), pass_name)
    try:
        result = compare(entries, control)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    from provenance import write_result

    write_result(args.out, result, gpus=False)
    for label, row in result["entries"].items():
        r0 = row["per_rank"].get("0", {})
        phases = ", ".join(
            f"{ph} {v['wire_bytes_per_layer'] / 1e6:.1f} MB"
            for ph, v in r0.get("phases", {}).items()
        )
        mem = row["non_torch_bytes"].get("0")
        outside = "" if mem is None else f"; {mem / 2**20:.1f} MiB outside torch"
        print(
            f"{label}: rank 0 {r0.get('wire_bytes_per_layer', 0) / 1e6:.1f} MB/layer "
            f"({phases}){outside}"
        )
    if "observer_check" in result:
        print(f"observer check: {result['observer_check']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
