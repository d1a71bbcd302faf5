#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DCP equivalence gates: DCP > 1 must serve what DCP = 1 serves, on a checkpoint where
attention matters, within a tolerance derived from the measured noise floor, with a negative
control that the comparison must catch.

One command runs a suite of configurations, N ranks each, on however many GPUs the machine has:
one rank per GPU when there are N, else N processes on the GPUs with their own NCCL host
identities (one-GPU emulation over NCCL's socket transport). Every rank runs vLLM's
external_launcher; runs share the machine and run concurrently (fixed kv_cache_memory_bytes per
rank, at most --max-ranks processes at once)::

    python evidence/dcp_gate.py suite --suite needle-eager --work <work> --out results
    python evidence/dcp_gate.py suite --suite needle-graphs --work <work> --out results
    python evidence/dcp_gate.py suite --suite patched --backend TRITON_MLA_SPARSE_FP8_DS_MLA ...
    python evidence/dcp_gate.py run --name x --model DIR --tp 4 --dcp 2 --passes clean,fault
    python evidence/dcp_gate.py report --work <work> --suite needle-eager --out results
    # every gate as one priority queue, detached across short device calls
    python evidence/dcp_gate.py start --suites all --work <work> --deadline-s 1260
    python evidence/dcp_gate.py wait --work <work> --seconds 560 --dest $OUT/gate
    python evidence/dcp_gate.py collect --work <work> --dest $OUT/gate

Each run names its vLLM tree (``variant``: stock or patched); the launcher puts that tree first
on its ranks' PYTHONPATH, so stock and patched runs share one queue.

``suite`` writes the checkpoints (evidence/make_dsa_gate_ckpt.py, seeded), the run records
(``<work>/runs/<run>.json``: command, revision, base, machine, configuration, the backend/impl
of every attention layer on every rank, per prompt the tokens and top-k log-probs of every
step), then ``<out>/dcp-gate-noise-<ckpt>.json`` (noise floor, tolerance, sensitivity) and
``<out>/dcp-gate-<gate>.json`` per gate (evidence/gate/verdict.py says what they mean).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gate import memory, plan, plans, verdict  # noqa: E402
from provenance import command as command_line  # noqa: E402
from provenance import git_revision, write_result  # noqa: E402

REPO = HERE.parent
WORK = str(Path(tempfile.gettempdir()) / "dcp-gate")
"""--work's default: checkpoints, run records and logs."""


def revision() -> dict[str, Any]:
    """The series revision ($DCP_GIT_REV on the device copy, which has no .git)."""
    return {"series": git_revision()}


def overlay_manifest() -> Path:
    return Path(os.environ.get("GATE_OVERLAY", Path.cwd() / ".gpu-overlay")) / "MANIFEST"


def base_info(machine: dict[str, Any] | None, variant: str, tree: str | None) -> dict[str, Any]:
    """Which vLLM the run imported: version, variant, the tree its PYTHONPATH put first,
    the path vllm really came from, and for the patched tree the overlay manifest's digest."""
    info: dict[str, Any] = {
        "vllm": (machine or {}).get("vllm"),
        "variant": variant,
        "vllm_tree": tree,
        "vllm_path": (machine or {}).get("vllm_path"),
    }
    manifest = overlay_manifest()
    if variant == "patched":
        if manifest.is_file():
            info["overlay_manifest_sha256"] = hashlib.sha256(manifest.read_bytes()).hexdigest()
            info["overlay_files"] = len(manifest.read_text().splitlines())
        else:
            info["overlay_manifest_sha256"] = None
            info["overlay_manifest_missing"] = str(manifest)
    return info


def imported_from(tree: str | None, vllm_path: str | None) -> bool:
    """Whether the worker's vllm package lies inside the tree its variant names."""
    if not tree or not vllm_path:
        return False
    return Path(vllm_path).resolve().is_relative_to(Path(tree).resolve())


def gpu_count() -> int:
    if os.environ.get("GATE_GPUS"):
        return int(os.environ["GATE_GPUS"])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
        return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.CalledProcessError):
        return 0


# What one rank process of a gate engine may hold at its peak (one-GPU emulation): the 12 ranks
# of the TP 2 DCP 2 suite fit one 79 GiB H100 (2026-12-07 16:45Z lease); 16 ranks of TP 2 and
# TP 4 runs did not (19:17Z lease: CUDA OOM at warm-up, the processes holding 3.1-7.1 GiB each).
RANK_GIB = 6.5


def gpu_memory_gib() -> float | None:
    """The smallest visible GPU's memory in GiB (GATE_GPU_GIB overrides; None: unknown)."""
    if os.environ.get("GATE_GPU_GIB"):
        return float(os.environ["GATE_GPU_GIB"])
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        )
        mib = [float(line) for line in out.stdout.split()]
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    return min(mib) / 1024 if mib else None


def ranks_that_fit(max_ranks: int, gpus: int, gpu_gib: float | None, rank_gib: float) -> int:
    """The rank processes to run at once: max_ranks, fewer where gpus x gpu_gib does not hold
    that many ranks of rank_gib each (at least 1: a run larger than that still runs alone)."""
    if not gpu_gib or rank_gib <= 0:
        return max_ranks
    return max(1, min(max_ranks, int(gpus * gpu_gib // rank_gib)))


class Launch:
    """The rank processes of one run (each in its own process group)."""

    def __init__(self, cfg: plan.GateConfig, work: Path, port: int, gpus: int) -> None:
        self.cfg, self.work, self.port, self.gpus = cfg, work, port, gpus
        self.rank_dir = work / "ranks"
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.rank_dir / f"{cfg.name}.config.json"
        cfg_path.write_text(json.dumps(cfg.to_json(), indent=1))
        for old in self.rank_dir.glob(f"{cfg.name}.rank*.json*"):  # records and their temps
            old.unlink()
        self.tree = plan.vllm_tree(cfg.variant, dict(os.environ))
        pythonpath = plan.variant_pythonpath(cfg.variant, dict(os.environ))
        self.envs = [
            {**e, "PYTHONPATH": pythonpath, **cfg.env}
            for e in plan.rank_envs(cfg.world_size, gpus, port, cfg.name)
        ]
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        self.started = time.time()
        self.missing_tree = not Path(self.tree).is_dir()
        if self.missing_tree:  # fail closed: never run a variant from the wrong tree
            return
        for r, env in enumerate(self.envs):
            log = open(work / "logs" / f"{cfg.name}.rank{r}.log", "w")
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "dcp_gate.py"),
                        "_rank",
                        str(cfg_path),
                        str(self.rank_dir),
                    ],
                    env=dict(os.environ, **env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        # the rank process groups, so that a resumed suite can end those a killed one left
        self.pgid_file = self.rank_dir / f"{cfg.name}.pgids"
        self.pgid_file.write_text(" ".join(str(p.pid) for p in self.procs) + "\n")

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def engine_up(self) -> bool:
        """Rank 0 has built its engine (the worker logs "engine up"), or the run ended."""
        if self.done():
            return True
        log = self.work / "logs" / f"{self.cfg.name}.rank0.log"
        try:
            return "engine up in" in log.read_text(errors="replace")
        except OSError:
            return False

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()

    def collect(self, command: str, timed_out: bool) -> dict[str, Any]:
        for log in self.logs:
            log.close()
        if not self.missing_tree:
            self.pgid_file.unlink(missing_ok=True)
        ranks = []
        for r in range(self.cfg.world_size):
            path = self.rank_dir / f"{self.cfg.name}.rank{r}.json"
            ranks.append(json.loads(path.read_text()) if path.is_file() else None)
        r0 = ranks[0] or {}
        base = base_info(r0.get("machine"), self.cfg.variant, self.tree)
        if self.missing_tree:
            errors = [f"the {self.cfg.variant} vLLM tree {self.tree} does not exist; not started"]
        else:
            errors = []
        right_tree = imported_from(self.tree, base["vllm_path"])
        if not right_tree and (base["vllm_path"] or (ranks[0] and rank_complete(ranks[0]))):
            errors.append(
                f"rank 0 imported vllm from {base['vllm_path']}, not from the "
                f"{self.cfg.variant} tree {self.tree}"
            )
        for r, rec in enumerate(ranks):
            if self.missing_tree or (rec and rank_complete(rec)):
                continue
            end = f"exit code {self.procs[r].returncode}{', timed out' if timed_out else ''}"
            if not rec:
                errors.append(f"rank {r}: no record ({end})")
            elif rec.get("error"):
                errors.append(f"rank {r}: {rec['error']}")
            else:
                done = rec.get("passes_complete") or []
                errors.append(f"rank {r}: incomplete after passes {done} ({end})")
        # the passes rank 0 finished, each with every prompt its configuration names (a pass
        # is complete or absent); none from a run that imported the wrong vLLM
        passes = finished_passes(self.cfg, r0) if right_tree else {}
        dropped = sorted(set(r0.get("passes_complete") or []) - set(passes))
        if dropped and right_tree:
            errors.append(f"rank 0: passes {dropped} lack prompts their configuration names")
        complete = not errors
        return {
            "schema_version": verdict.SCHEMA_VERSION,
            "kind": "dcp_gate_run",
            "name": self.cfg.name,
            "command": command,
            "revision": revision(),
            "base": base,
            "variant": self.cfg.variant,
            "machine": r0.get("machine"),
            "gpus_visible": self.gpus,
            "transport": plan.transport(self.cfg.world_size, self.gpus),
            "rank_env": self.envs,
            "config": self.cfg.to_json(),
            "checkpoint": checkpoint_info(self.cfg.model),
            "engine_kwargs": r0.get("engine_kwargs"),
            "engine_start_s": r0.get("engine_start_s"),
            "started_at": round(self.started, 3),
            "wall_s": round(time.time() - self.started, 1),
            "cudagraph_mode": r0.get("cudagraph_mode"),
            "attention_layers": [
                {"rank": r, "layers": (rec or {}).get("attention_layers", [])}
                for r, rec in enumerate(ranks)
            ],
            "fault": r0.get("fault") or {},
            "ok": complete,
            "complete": complete,
            "passes_complete": [p for p in self.cfg.passes if p in passes],
            "rank_passes_complete": [(rec or {}).get("passes_complete", []) for rec in ranks],
            "error": "; ".join(errors) or None,
            "tracebacks": [rec.get("traceback") for rec in ranks if rec and rec.get("traceback")][
                :2
            ],
            "exit_codes": [p.returncode for p in self.procs],
            "timed_out": timed_out and not self.missing_tree,
            "passes": passes,
            "ledger": [
                {"rank": r, "passes": (rec or {}).get("ledger")}
                for r, rec in enumerate(ranks)
                if (rec or {}).get("ledger")
            ],
            "spec": r0.get("spec"),
            # DCP top-k merge backends each rank's indexer really called (worker's merge spy;
            # a run that asked for one and called another fails there)
            "merge_backends_seen": [(rec or {}).get("merge_backends_seen") for rec in ranks],
            # each rank's GPU memory once its engine was up (gate/memory_probe.process_memory)
            "device_memory": [
                {"rank": r, **rec["device_memory"]}
                for r, rec in enumerate(ranks)
                if (rec or {}).get("device_memory")
            ],
            # each rank's memory record (memory_probe runs; gate/memory.py judges them)
            "memory": [
                {"rank": r, **rec["memory"]}
                for r, rec in enumerate(ranks)
                if (rec or {}).get("memory")
            ],
        }


def rank_complete(rec: dict[str, Any]) -> bool:
    """A rank record that ran to the end (one written before ``complete`` existed: when ok)."""
    return bool(rec.get("ok")) and rec.get("complete", True) is not False


def finished_passes(cfg: plan.GateConfig, rec: dict[str, Any]) -> dict[str, dict]:
    """Rank 0's passes that it recorded as finished and that hold every prompt key the
    configuration names for them (plan.pass_groups)."""
    got = rec.get("passes") or {}
    done = rec.get("passes_complete")
    if done is None:  # a record written before partial records: all or nothing
        done = list(got) if rec.get("ok") else []
    out = {}
    for name in done:
        want = {k for keys in plan.pass_groups(cfg, name) for k in keys}
        if name in got and set(got[name]) == want:
            out[name] = got[name]
    return out


def checkpoint_info(model: str) -> dict[str, Any]:
    path = Path(model) / "gate_ckpt.json"
    info = json.loads(path.read_text()) if path.is_file() else {}
    return {"path": model, **info}


def end_orphan_ranks(work: Path) -> list[int]:
    """End the rank process groups an earlier, killed suite of this work folder left running
    (they hold GPU memory and ports); only processes that are gate ranks are touched."""
    ended = []
    for f in sorted((work / "ranks").glob("*.pgids")):
        # the run was in flight when its suite died: say so in <work>/killed.jsonl
        with open(work / "killed.jsonl", "a") as killed:
            killed.write(
                json.dumps(
                    {
                        "name": f.name.removesuffix(".pgids"),
                        "ended_at": round(time.time(), 3),
                        "note": "in flight when its suite process died; rerun by the resumed suite",
                    }
                )
                + "\n"
            )
        for pid in (int(x) for x in f.read_text().split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"_rank" in cmdline and any(c.endswith(b"dcp_gate.py") for c in cmdline):
                try:
                    os.killpg(pid, signal.SIGKILL)
                    ended.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
        f.unlink()
    return ended


def run_many(
    configs: list[plan.GateConfig],
    work: Path,
    max_ranks: int,
    deadline_s: float,
    port0: int,
    warmup_hold_s: float = 240.0,
    rank_gib: float = RANK_GIB,
) -> dict[str, dict[str, Any]]:
    """Run the configurations, as many at once as max_ranks and the GPUs' memory (rank_gib
    per rank) allow; stop at the deadline. Warm-up runs start first; the others wait until
    the warm-up engines are up (the JIT caches are then filled once) or warmup_hold_s has
    passed."""
    orphans = end_orphan_ranks(work)
    if orphans:
        print(f"[gate] ended rank processes a killed suite left: {orphans}", flush=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    if gpus < 1:
        raise SystemExit("no GPU visible (nvidia-smi -L): the gates run on a GPU machine")
    gpu_gib = gpu_memory_gib()
    fit = ranks_that_fit(max_ranks, gpus, gpu_gib, rank_gib)
    if fit < max_ranks:
        print(
            f"[gate] {fit} rank processes at once, not {max_ranks}: {gpus} GPU(s) of "
            f"{gpu_gib:.0f} GiB hold {fit} ranks of {rank_gib} GiB",
            flush=True,
        )
        max_ranks = fit
    pending = list(configs)
    active: list[Launch] = []
    results: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    port = port0
    command = command_line()
    while pending or active:
        # warm-up runs go first; the rest wait until their engines are up (JIT caches filled)
        while pending:
            warming = time.time() - t0 < warmup_hold_s and any(
                a.cfg.warmup and not a.engine_up() for a in active
            )
            busy = sum(a.cfg.world_size for a in active)
            fits = not active or busy + pending[0].world_size <= max_ranks
            if not fits or (warming and not pending[0].warmup):
                break
            cfg = pending.pop(0)
            print(
                f"[gate {time.strftime('%H:%M:%S')}] start {cfg.name} ({cfg.world_size} ranks)",
                flush=True,
            )
            active.append(Launch(cfg, work, port, gpus))
            port += 7
            write_status(work, pending, active, results, t0)
        late = time.time() - t0 > deadline_s
        for a in list(active):
            if a.done() or late:
                if not a.done():
                    a.kill()
                rec = a.collect(command, timed_out=late)
                results[a.cfg.name] = rec
                (work / "runs" / f"{a.cfg.name}.json").write_text(json.dumps(rec) + "\n")
                print(
                    f"[gate {time.strftime('%H:%M:%S')}] {a.cfg.name}: ok={rec['ok']} "
                    f"passes {rec['passes_complete']} "
                    f"wall {rec['wall_s']} s {rec['error'] or ''}"[:600],
                    flush=True,
                )
                active.remove(a)
                write_status(work, pending, active, results, t0)
        if late:
            for cfg in pending:
                results[cfg.name] = {
                    "name": cfg.name,
                    "ok": False,
                    "config": cfg.to_json(),
                    "error": "not started before the deadline",
                }
                (work / "runs" / f"{cfg.name}.json").write_text(
                    json.dumps(results[cfg.name] | {"kind": "dcp_gate_run", "not_started": True})
                    + "\n"
                )
            pending = []
            write_status(work, pending, active, results, t0)
        time.sleep(1)
    return results


def write_status(work: Path, pending: list, active: list, results: dict, t0: float) -> None:
    """<work>/status.json: what runs, what waits, what ended (read by ``wait``)."""
    doc = {
        "elapsed_s": round(time.time() - t0, 1),
        "active": [a.cfg.name for a in active],
        "pending": [c.name for c in pending],
        "finished": {n: bool(r.get("ok")) for n, r in results.items()},
    }
    tmp = work / "status.json.tmp"
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(work / "status.json")


def load_runs(work: Path) -> dict[str, dict[str, Any]]:
    runs = {}
    for p in sorted((work / "runs").glob("*.json")):
        d = json.loads(p.read_text())
        d["file"] = p.name
        runs[d["name"]] = d
    return runs


def report(suite: dict[str, Any], work: Path, out: Path) -> list[Path]:
    """Noise floor, tolerance and sensitivity per checkpoint, then every gate of the suite,
    then every distance (measured and stated, never gated: ``dcp-distance-<name>.json``).

    Pure Python over the run records: ``report`` re-derives every verdict from
    ``<work>/runs`` on any machine (the figures stay those the runs recorded)."""
    runs = load_runs(work)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    noise_by_ckpt: dict[str, dict[str, Any]] = {}
    for label, (ckpt, a, b, pa, pb) in suite.get("noise", {}).items():
        if a in runs and b in runs:
            value, _ = verdict.pair_noise(runs[a], runs[b], pa, pb)
            noise_by_ckpt.setdefault(ckpt, {})[label] = {
                "max_abs_logprob_diff": value,
                # runs that did not complete whose finished passes this pair used
                "incomplete_runs": sorted(
                    {n for n in (a, b) if verdict.incomplete(runs[n])} if value is not None else []
                ),
                "ref": a,
                "cand": b,
                "passes": [pa, pb],
            }
    tolerances: dict[str, dict[str, Any]] = {}
    for ckpt, pairs in noise_by_ckpt.items():
        try:
            tol = verdict.derive_tolerance({k: v["max_abs_logprob_diff"] for k, v in pairs.items()})
        except ValueError as e:
            print(f"{ckpt}: {e}", flush=True)
            continue
        tolerances[ckpt] = tol
        sens = {}
        model_name = ckpt.split("/")[0]  # a noise group "glmn/patched" is of checkpoint glmn
        for name, run in runs.items():
            if verdict.finished_passes(run).get("sensitivity") and run.get("config", {}).get(
                "model", ""
            ).rstrip("/").endswith("/" + model_name):
                sens[name] = verdict.sensitivity(run, tol["atol_logprob"])
        doc = {
            "schema_version": verdict.SCHEMA_VERSION,
            "kind": verdict.NOISE_KIND,
            "checkpoint": ckpt,
            "command": command_line(),
            # the runs' revision (what was measured) plus the one that derived the verdict
            "revision": dict(
                next((r["revision"] for r in runs.values() if r.get("revision")), {}),
                report=revision()["series"],
            ),
            "base": next((r.get("base") for r in runs.values() if r.get("base")), None),
            "machine": next((r.get("machine") for r in runs.values() if r.get("machine")), None),
            "noise_pairs": pairs,
            "checkpoints": {
                n: runs[n].get("checkpoint")
                for n in sorted({v[k] for v in pairs.values() for k in ("ref", "cand")})
            },
            "tolerance": tol,
            "sensitivity": sens,
        }
        path = out / f"dcp-gate-noise-{ckpt.replace('/', '-')}.json"
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        written.append(path)
    for gate, spec in suite.get("gates", {}).items():
        ref_name, cand_name, kind = gate_spec(spec)
        ref, cand = runs.get(ref_name), runs.get(cand_name)
        if ref is None or cand is None:
            print(f"gate {gate}: run {ref_name if ref is None else cand_name} missing", flush=True)
            continue
        ckpt = _ckpt_of(suite, ref_name)
        group = spec.get("noise", ckpt) if isinstance(spec, dict) else ckpt
        tol = tolerances.get(group)
        if tol is None:
            print(f"gate {gate}: no tolerance for noise group {group}", flush=True)
            continue
        sens = _best_sensitivity(runs, ckpt, tol["atol_logprob"], ref_name)
        options = gate_options(spec)
        control = None
        if options["control"] is not None:
            control = runs.get(options["control"]) or {
                "name": options["control"],
                "ok": False,
                "error": "the control run did not run",
            }
        result = verdict.gate_result(
            gate,
            ref,
            cand,
            tol,
            {
                "max_abs_logprob_diff": tol["noise_floor"],
                "group": group,
                "pairs": noise_by_ckpt[group],
            },
            sens,
            kind,
            cand_pass=options["cand_pass"],
            control=control,
        )
        result["command"] = command_line()
        # the runs' revision (what was tested) plus the one that derived the verdict
        result["revision"] = dict(cand.get("revision") or {}, report=revision()["series"])
        result["machine"] = cand.get("machine")
        written.append(
            _write_result(out / f"dcp-gate-{gate}.json", result, verdict.validate, f"gate {gate}")
        )
        print(
            f"GATE {gate}: equivalent={result['equivalent']} max={result['max_abs_logprob_diff']} "
            f"atol={tol['atol_logprob']:.4g} negative_control_detected="
            f"{result['negative_control_detected']} meaningful={result['meaningful']}",
            flush=True,
        )
    for name, spec in suite.get("distances", {}).items():
        ref, cand = runs.get(spec["ref"]), runs.get(spec["cand"])
        if ref is None or cand is None:
            missing = spec["ref"] if ref is None else spec["cand"]
            print(f"distance {name}: run {missing} missing", flush=True)
            continue
        tol = tolerances.get(spec["noise"])
        if tol is None:
            print(f"distance {name}: no tolerance for noise group {spec['noise']}", flush=True)
            continue
        # the scale's sensitivity: the candidate's own when it ran that pass
        sens = _best_sensitivity(
            runs, _ckpt_of(suite, spec["cand"]), tol["atol_logprob"], spec["cand"]
        )
        noise = {
            "max_abs_logprob_diff": tol["noise_floor"],
            "group": spec["noise"],
            "pairs": noise_by_ckpt[spec["noise"]],
        }
        result = verdict.distance_result(name, ref, cand, tol, noise, sens)
        result["command"] = command_line()
        result["revision"] = dict(cand.get("revision") or {}, report=revision()["series"])
        result["machine"] = cand.get("machine")
        path = out / f"dcp-distance-{name}.json"
        written.append(_write_result(path, result, verdict.validate_distance, f"distance {name}"))
        scale = result["scale"]
        print(
            f"DISTANCE {name}: max={result['max_abs_logprob_diff']} first_step="
            f"{result['max_first_step_abs_logprob_diff']} x noise floor="
            f"{scale['ratio_to_noise_floor']} x tolerance={scale['ratio_to_tolerance']} "
            "(measured, not gated)",
            flush=True,
        )
    names = {r["name"] for r in suite.get("runs", [])}
    needle = needle_calibration(suite, runs)
    if needle is not None:
        needle.update(
            command=command_line(),
            revision=dict(
                next((runs[n].get("revision") for n in sorted(needle["runs"])), None) or {},
                report=revision()["series"],
            ),
        )
        path = out / f"dcp-{suite.get('name') or 'needle-suite'}.json"
        path.write_text(json.dumps(needle, indent=1, sort_keys=True) + "\n")
        written.append(path)
        for n, r in sorted(needle["runs"].items()):
            print(f"NEEDLE {n}: {r['per_prompt']}", flush=True)
    mem = memory.memory_result({n: r for n, r in runs.items() if n in names})
    if mem is not None:
        first = next(r for n, r in sorted(runs.items()) if n in names)
        mem.update(
            command=command_line(),
            revision=dict(first.get("revision") or {}, report=revision()["series"]),
            base=first.get("base"),
            machine=first.get("machine"),
            transport=sorted({runs[n].get("transport") for n in mem["runs"]} - {None}),
        )
        # one file per suite or queue: a report of another suite never replaces it
        path = out / memory.result_name(suite.get("name"))
        written.append(_write_result(path, mem, memory.validate, "memory test"))
        print(
            f"MEMORY all_within={mem['all_within']} controls_caught={mem['controls_caught']} "
            f"all_transient_within={mem['all_transient_within']} controls_caught_by_transient_"
            f"rule={mem['controls_caught_by_transient_rule']} "
            f"capacity rows={len(mem['capacity'])}",
            flush=True,
        )
    return written


def needle_calibration(suite: dict[str, Any], runs: dict[str, Any]) -> dict[str, Any] | None:
    """A calibration suite's verdict (one without gates or noise pairs whose runs have a
    sensitivity pass, on a checkpoint with a needle's answer): per run and prompt, whether
    the clean pass generated the needle's answer first, whether the sensitivity pass (the
    needle replaced) did not, and how far replacing the needle moved the first step (a lower
    bound, as in the gates); None for any other suite or when none of its runs finished.
    The needle decides the answer only where both hold."""
    if suite.get("gates") or suite.get("noise"):
        return None
    doc: dict[str, Any] = {}
    for run in suite.get("runs", []):
        rec = runs.get(run["name"])
        if rec is None or verdict.answer_id(rec) is None:
            continue  # not run, or a checkpoint without a needle's answer
        if not verdict.finished_passes(rec).get("sensitivity"):
            continue
        sens = verdict.sensitivity(rec)
        found = verdict.needle_retrieval(rec) or {}
        per_prompt = {}
        for key, moved in sorted(sens.get("per_prompt", {}).items()):
            clean_key = key.partition("~p")[0]
            clean = (found.get("clean") or {}).get(clean_key, {})
            without = (found.get("sensitivity") or {}).get(key, {})
            per_prompt[clean_key] = {
                "needle_retrieved": clean.get("needle_retrieved"),
                "first_token": clean.get("first_token"),
                "first_token_without_needle": without.get("first_token"),
                "answer_absent_without_needle": without.get("answer_absent"),
                "first_step_move_lower_bound": moved["first_step_move_lower_bound"],
            }
        doc[run["name"]] = {
            "checkpoint": rec.get("checkpoint"),
            "model": run["model"],
            "answer_id": found.get("answer_id"),
            "per_prompt": per_prompt,
        }
    if not doc:
        return None
    first = runs[next(iter(doc))]
    return {
        "schema_version": verdict.SCHEMA_VERSION,
        "kind": "dcp_gate_needle_calibration",
        "measure": "per run and single prompt: the clean pass's first token against the "
        "checkpoint's answer, the sensitivity pass's (the needle replaced) likewise, and its "
        "first-step move (verdict.sensitivity)",
        "base": first.get("base"),
        "machine": first.get("machine"),
        "runs": doc,
    }


def _write_result(path: Path, doc: dict[str, Any], validate: Any, what: str) -> Path:
    """Write one result after its validator found nothing wrong (else stop, naming it)."""
    problems = validate(doc)
    if problems:
        raise SystemExit(f"{what}: malformed result {problems}")
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def gate_spec(spec: Any) -> tuple[str, str, str]:
    """A suite's gate entry: [ref, cand], [ref, cand, kind] or {ref, cand, kind}."""
    if isinstance(spec, dict):
        return spec["ref"], spec["cand"], spec.get("kind", "dcp")
    if len(spec) == 3:
        return spec[0], spec[1], spec[2]
    return spec[0], spec[1], "dcp"


def gate_options(spec: Any) -> dict[str, Any]:
    """A suite's gate entry's optional keys (only a dict entry has them): the candidate pass
    it compares (``cand_pass``, default clean) and the run whose fault pass is its negative
    control (``control``, default the candidate)."""
    spec = spec if isinstance(spec, dict) else {}
    return {"cand_pass": spec.get("cand_pass", "clean"), "control": spec.get("control")}


def _ckpt_of(suite: dict[str, Any], run_name: str) -> str:
    for r in suite.get("runs", []):
        if r["name"] == run_name:
            return Path(r["model"].lstrip("@")).name
    return run_name.split("-")[0].removeprefix("p-")


def _best_sensitivity(runs: dict[str, Any], ckpt: str, atol: float, ref_name: str):
    """The sensitivity measured on the gate's own reference when it ran that pass, else on
    the checkpoint's TP=1 reference."""
    variant = (runs.get(ref_name) or {}).get("config", {}).get("variant", "stock")
    order = [ref_name] + sorted(
        (n for n in runs if n != ref_name),
        key=lambda n: (runs[n].get("config", {}).get("variant", "stock") != variant, n),
    )
    for name in order:
        run = runs.get(name)
        if run is None:
            continue
        if verdict.finished_passes(run).get("sensitivity") and str(
            run.get("config", {}).get("model", "")
        ).rstrip("/").endswith("/" + ckpt):
            s = verdict.sensitivity(run, atol)
            s["run"] = name
            return s
    return {"measured": False}


def resolve_suite(args: argparse.Namespace) -> dict[str, Any]:
    """--suite NAME (or a JSON file), or --suites A,B,C, or --suites <a named queue of
    plans.QUEUES> as one queue."""
    names = getattr(args, "suites", None)
    if names:
        named = plans.QUEUES
        listed = named[names] if names in named else names.split(",")
        suites = []
        for name in listed:
            one = argparse.Namespace(**{**vars(args), "suite": name, "suites": None})
            suites.append(resolve_suite(one))
        return {**plans.merge_suites(suites), "name": names.replace(",", "+")}
    if not args.suite:
        raise SystemExit("give --suite NAME or --suites A,B,... (or a queue: --suites all)")
    if args.suite == "patched":
        if not args.backend:
            raise SystemExit("--suite patched needs --backend (the patched tree's registry name)")
        return {
            **plans.patched_suite(args.backend, args.kv_cache_dtype),
            "name": f"patched-{args.backend.lower()}",
        }
    if args.suite in plans.SUITES:
        return {**plans.SUITES[args.suite], "name": args.suite}
    path = Path(args.suite)
    if path.is_file():
        return {"name": path.stem, **json.loads(path.read_text())}
    raise SystemExit(
        f"unknown suite {args.suite!r}; valid: {', '.join(plans.SUITES)}, patched, or a JSON file"
    )


def make_checkpoints(suite: dict[str, Any], work: Path) -> dict[str, str]:
    """Write the suite's missing checkpoints, all at once (seeded: the same bytes each time)."""
    paths, procs = {}, []
    for name, argv in suite.get("checkpoints", {}).items():
        d = work / "ckpt" / name
        if not (d / "gate_ckpt.json").is_file():
            cmd = [sys.executable, str(HERE / "make_dsa_gate_ckpt.py"), *argv, "--out", str(d)]
            procs.append((name, subprocess.Popen(cmd)))
        paths[name] = str(d)
    failed = [name for name, proc in procs if proc.wait() != 0]
    if failed:
        raise SystemExit(f"checkpoint generation failed: {failed}")
    return paths


def cmd_suite(args: argparse.Namespace) -> int:
    t_start = time.time()  # --deadline-s counts from here: checkpoints included
    suite = resolve_suite(args)
    work = Path(args.work)
    ckpts = make_checkpoints(suite, work)
    configs = []
    only = set(args.only.split(",")) if args.only else None
    for r in suite["runs"]:
        if only and r["name"] not in only:
            continue
        earlier = work / "runs" / f"{r['name']}.json"
        if earlier.is_file() and not args.rerun and json.loads(earlier.read_text()).get("ok"):
            print(f"[gate] {r['name']}: reusing {earlier}", flush=True)
            continue
        model = ckpts[r["model"][1:]] if r["model"].startswith("@") else r["model"]
        made = checkpoint_info(model).get("needle") or {}
        if made and "needle" not in r:  # a needle checkpoint: its prompts carry the needle
            r = {**r, "needle": int(made["needle_id"])}
        configs.append(plan.GateConfig.from_json({**r, "model": model}))
    # the resolved suite, for ``wait --dest`` (partial reports from whatever has finished)
    work.mkdir(parents=True, exist_ok=True)
    (work / "suite.json").write_text(json.dumps(suite) + "\n")
    left = args.deadline_s - (time.time() - t_start)
    # a resumed suite takes fresh ports (a killed one's may linger in TIME_WAIT)
    starts_file = work / "starts"
    starts = int(starts_file.read_text()) if starts_file.is_file() else 0
    starts_file.write_text(f"{starts + 1}\n")
    port = args.port + 1000 * (starts % 8)
    run_many(configs, work, args.max_ranks, left, port, args.warmup_hold_s, args.rank_gib)
    report(suite, work, Path(args.out))
    return 0


# --- detached mode: start / wait / collect ------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, not yet reaped) has ended
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        return state != "Z"
    except (OSError, IndexError):
        return True


def daemon_state(work: Path) -> dict[str, Any]:
    """{"state": none | running | done | died, pid, rc}: what <work>/daemon.* say."""
    pid_file, done_file = work / "daemon.pid", work / "daemon.done"
    if done_file.is_file():
        return {"state": "done", "rc": int(done_file.read_text().split()[0] or 1)}
    if not pid_file.is_file():
        return {"state": "none"}
    info = json.loads(pid_file.read_text())
    return {"state": "running" if _alive(info["pid"]) else "died", **info}


def cmd_start(args: argparse.Namespace) -> int:
    """Run the suite in a detached session (setsid, SIGHUP ignored), logging to
    <work>/daemon.log; <work>/daemon.pid while it runs, <work>/daemon.done (exit code) when
    it ends. Refuses to start while one runs. Started again after a kill, it reuses every
    successful run of the work folder (like ``suite``)."""
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = daemon_state(work)
    if state["state"] == "running":
        print(f"a gate suite already runs in {work} (pid {state['pid']}); use wait", flush=True)
        return 2
    resolve_suite(args)  # a bad suite name fails here, not in the background
    out = work / "results"
    if args.out != str(REPO / "results"):
        print(f"note: start writes the gate files to {out}; collect --dest copies them", flush=True)
    # the deadline is absolute: a resumed suite (start again after a kill) keeps the first
    # start's end unless --rerun; it never moves later
    end_file = work / "deadline_epoch"
    end = time.time() + args.deadline_s
    if end_file.is_file() and not args.rerun:
        end = min(end, float(end_file.read_text()))
    end_file.write_text(f"{end}\n")
    left = max(end - time.time(), 0.0)
    argv = [sys.executable, str(HERE / "dcp_gate.py"), "suite", "--work", str(work)]
    argv += ["--out", str(out), "--deadline-s", f"{left:.0f}"]
    argv += ["--max-ranks", str(args.max_ranks), "--port", str(args.port)]
    argv += ["--warmup-hold-s", str(args.warmup_hold_s), "--rank-gib", str(args.rank_gib)]
    for flag, value in (
        ("--suite", args.suite),
        ("--suites", args.suites),
        ("--only", args.only),
        ("--backend", args.backend),
    ):
        if value:
            argv += [flag, value]
    argv += ["--kv-cache-dtype", args.kv_cache_dtype]
    if args.rerun:
        argv.append("--rerun")
    (work / "daemon.done").unlink(missing_ok=True)
    log = open(work / "daemon.log", "a")
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(os.environ, GATE_DAEMON_DONE=str(work / "daemon.done")),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    (work / "daemon.pid").write_text(
        json.dumps({"pid": proc.pid, "started": time.time(), "argv": argv}) + "\n"
    )
    print(f"started pid {proc.pid}: {shlex.join(argv)}", flush=True)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Print progress until the detached suite ends or ``--seconds`` pass (returns a few
    seconds early). Exit 0: done and it succeeded; 3: still running; 4: it died without
    finishing (its finished runs stay recorded; start again to resume); 5: nothing started;
    1: it ended with an error. With --dest, collect at the end."""
    work = Path(args.work).resolve()
    t_end = time.time() + max(args.seconds - 5, 0)
    seen: dict[str, bool] = {}
    rc = 3
    while True:
        state = daemon_state(work)
        status_file = work / "status.json"
        if status_file.is_file():
            try:
                st = json.loads(status_file.read_text())
            except json.JSONDecodeError:
                st = {}
            for name, ok in st.get("finished", {}).items():
                if name not in seen:
                    seen[name] = ok
                    print(f"[wait {time.strftime('%H:%M:%S')}] {name}: ok={ok}", flush=True)
            line = (
                f"[wait {time.strftime('%H:%M:%S')}] {state['state']}: "
                f"{st.get('elapsed_s')} s, active {st.get('active')}, "
                f"{len(st.get('pending', []))} pending, {len(st.get('finished', {}))} finished"
            )
        else:
            line = f"[wait {time.strftime('%H:%M:%S')}] {state['state']}: no status yet"
        if state["state"] != "running":
            print(line, flush=True)
            rc = {"done": 0 if state.get("rc") == 0 else 1, "died": 4, "none": 5}[state["state"]]
            break
        if time.time() >= t_end:
            print(line, flush=True)
            break
        if int(time.time()) % 30 == 0:
            print(line, flush=True)
        time.sleep(1)
    if state["state"] == "done":
        tail = (work / "daemon.log").read_text(errors="replace").splitlines()
        print("\n".join(line for line in tail if line.startswith("GATE ")), flush=True)
    if args.dest:
        collect(work, Path(args.dest))
        suite_file = work / "suite.json"
        if state["state"] != "done" and suite_file.is_file():
            try:  # the gate files of whatever has finished so far
                report(json.loads(suite_file.read_text()), work, Path(args.dest) / "results")
            except (SystemExit, Exception) as e:  # noqa: BLE001 - the runs are collected
                print(f"partial report failed: {e}", flush=True)
    return rc


def collect(work: Path, dest: Path) -> None:
    """Copy what the runs wrote to ``dest``: run records, gate files, status, the daemon log,
    and the rank logs and rank records as one tarball."""
    import shutil
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("runs", "results"):
        if (work / sub).is_dir():
            shutil.copytree(work / sub, dest / sub, dirs_exist_ok=True)
    for name in ("status.json", "daemon.log", "daemon.pid", "daemon.done", "killed.jsonl"):
        if (work / name).is_file():
            shutil.copy2(work / name, dest / name)
    with tarfile.open(dest / "rank-logs.tgz", "w:gz") as tar:
        for sub in ("logs", "ranks"):
            if (work / sub).is_dir():
                tar.add(work / sub, arcname=sub)
    print(f"collected {work} -> {dest}", flush=True)


def cmd_collect(args: argparse.Namespace) -> int:
    collect(Path(args.work).resolve(), Path(args.dest))
    return 0


def _suite_main(args: argparse.Namespace) -> int:
    """``suite``, writing its exit code to $GATE_DAEMON_DONE when started detached."""
    done = os.environ.get("GATE_DAEMON_DONE")
    rc = 1
    try:
        rc = cmd_suite(args)
        return rc
    finally:
        if done:
            Path(done).write_text(f"{rc}\n")


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """Write the suite's missing checkpoints into <work>/ckpt (what ``suite`` does first), so
    that a lease can make them while its benchmarks hold the GPU (they need only the CPU)."""
    for name, path in make_checkpoints(resolve_suite(args), Path(args.work)).items():
        print(f"{name}: {path}", flush=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    report(resolve_suite(args), Path(args.work), Path(args.out))
    return 0


def cmd_decode_rates(args: argparse.Namespace) -> int:
    """The decode tok/s the runs of a work folder recorded, with how crowded the GPU was."""
    runs = load_runs(Path(args.work))
    rates = verdict.decode_rates(runs)
    used = [runs[row["run"]] for row in rates["rows"]]
    doc = {
        "schema_version": 1,
        "kind": "dcp_gate_decode_rates",
        "command": command_line(),
        "revision": revision(),
        "runs_revision": sorted({json.dumps(r.get("revision")) for r in used}),
        "base": sorted({(r.get("base") or {}).get("vllm") or "?" for r in used}),
        "machine": next((r["machine"] for r in used if r.get("machine")), None),
        **rates,
    }
    write_result(Path(args.out), doc)
    for row in doc["rows"]:
        print(
            f"{row['run']:40s} single median {row['single_request_median']} tok/s, "
            f"ranks alive mean {row['ranks_alive_mean']} max {row['ranks_alive_max']}"
        )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = plan.GateConfig(
        name=args.name,
        model=args.model,
        tp=args.tp,
        dcp=args.dcp,
        backend=args.backend,
        kv_cache_dtype=args.kv_cache_dtype,
        graphs=args.graphs,
        passes=tuple(args.passes.split(",")),
        lens=tuple(int(x) for x in args.lens.split(",")),
        batch_lens=tuple(int(x) for x in args.batch_lens.split(",") if x),
        max_tokens=args.max_tokens,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        variant=args.variant,
        engine_extra=json.loads(args.engine_extra),
        enable_prefix_caching=args.enable_prefix_caching,
    )
    rec = run_many([cfg], Path(args.work), cfg.world_size, args.deadline_s, args.port)[cfg.name]
    print(json.dumps({k: rec.get(k) for k in ("name", "ok", "error", "transport")}), flush=True)
    return 0 if rec.get("ok") else 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (
        ("suite", _suite_main),
        ("report", cmd_report),
        ("start", cmd_start),
        ("checkpoints", cmd_checkpoints),
    ):
        p = sub.add_parser(name)
        p.add_argument("--suite", help=f"{', '.join(plans.SUITES)}, patched, or JSON")
        p.add_argument(
            "--suites",
            help="comma-separated suites run as one priority queue, or a named queue: "
            + ", ".join(plans.QUEUES),
        )
        p.add_argument("--backend", default=None, help="for --suite patched")
        p.add_argument("--kv-cache-dtype", default="fp8_ds_mla", help="for --suite patched")
        p.add_argument("--work", default=WORK, help="checkpoints, runs, logs")
        p.add_argument("--out", default=str(REPO / "results"), help="gate result files")
        p.set_defaults(func=fn)
        if name in ("suite", "start"):
            p.add_argument("--max-ranks", type=int, default=16, help="rank processes at once")
            p.add_argument(
                "--rank-gib",
                type=float,
                default=RANK_GIB,
                help="GPU memory one rank may hold: fewer ranks at once where the GPUs are "
                "smaller (0: max-ranks alone)",
            )
            p.add_argument("--deadline-s", type=float, default=3600.0)
            p.add_argument("--port", type=int, default=29600)
            p.add_argument(
                "--warmup-hold-s",
                type=float,
                default=240.0,
                help="the longest the queue waits for the warm-up engines",
            )
            p.add_argument("--only", default=None, help="comma-separated run names")
            p.add_argument("--rerun", action="store_true", help="ignore earlier run records")
    p = sub.add_parser("wait", help="follow a suite started with start")
    p.add_argument("--work", default=WORK)
    p.add_argument("--seconds", type=float, default=540.0, help="return before this")
    p.add_argument("--dest", default=None, help="collect into this folder at the end")
    p.set_defaults(func=cmd_wait)
    p = sub.add_parser("collect", help="copy runs, gate files and logs to --dest")
    p.add_argument("--work", default=WORK)
    p.add_argument("--dest", required=True)
    p.set_defaults(func=cmd_collect)
    p = sub.add_parser("decode-rates", help="decode tok/s of a work folder's runs (emulation)")
    p.add_argument("--work", required=True, help="holds runs/*.json")
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.set_defaults(func=cmd_decode_rates)
    p = sub.add_parser("run", help="one configuration")
    p.add_argument("--name", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dcp", type=int, default=1)
    p.add_argument("--backend", default=None)
    p.add_argument("--kv-cache-dtype", default=None)
    p.add_argument("--graphs", action="store_true")
    p.add_argument("--passes", default="clean")
    p.add_argument("--lens", default=",".join(map(str, plan.SINGLE_LENS)))
    p.add_argument("--batch-lens", default=",".join(map(str, plan.BATCH_LENS)))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=1 << 30)
    p.add_argument("--variant", default="stock", help=f"{' or '.join(plan.VARIANTS)}")
    p.add_argument("--engine-extra", default="{}", help="JSON merged into LLM(**kwargs)")
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="vLLM's prefix cache (the repeat pass then hits it; not with the fault pass)",
    )
    p.add_argument("--work", default=WORK)
    p.add_argument("--deadline-s", type=float, default=3600.0)
    p.add_argument("--port", type=int, default=29600)
    p.set_defaults(func=cmd_run)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_rank":  # one rank, started by Launch
        import importlib

        # GATE_WORKER_MODULE: the CPU tests put a stand-in for vLLM here
        worker = importlib.import_module(os.environ.get("GATE_WORKER_MODULE", "gate.worker"))
        return worker.main(argv[1], argv[2])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # vLLM may start worker processes with spawn
    sys.exit(main())
