# SPDX-License-Identifier: Apache-2.0
"""The memory test and the capacity table, computed from gate run records (pure Python).

A run configured with ``memory_probe`` carries each rank's memory record
(gate/memory_probe.py). vLLM sizes the KV pool once, from a profiling forward: what it
budgets for a rank is that forward's torch peak (weights included) plus the KV bytes it
hands the pool. A rank stays inside its budget when every later step's peak does:

    step peak <= profiled peak + KV pool bytes            ("peak <= reserved + the pool")

A step over it takes memory the KV pool was given: with a pool sized to the GPU, the
out-of-memory error of a long prefill after a clean start-up. The verdict is per rank and
per step class (the largest prefill chunk, decode); a run is ``within`` when every rank is.
Each rank's ``peak_at`` carries the probe's attribution (None in records without it): per
``profile``, ``prefill`` and ``decode``, the module sites of the highest segment peaks, the
first being where that peak happened, with ``transient_bytes`` (peak - allocated at entry).

The strict rule also charges what vLLM allocates after its profiling forward and keeps (step
metadata, buffers grown at the first steps): stock behaviour, at DCP = 1 as at DCP > 1, and
not a transient of any step. What the series' 0016 promises is narrower, the transient rule,
judged per rank and step class on the step that set the class's peak:

    step peak - allocated at the step's start
        <= profiled peak - allocated when the profiling started        ("transient_within")

With ``grown`` = allocated at that step's start - allocated when the profiling started - KV
pool bytes (what the engine holds beyond the profile's start and the pool), the two rules are
one identity apart, per rank and step class:

    budget - step peak = transient margin - grown

so a step within the transient rule is over the strict budget by at most what grew, and one
over it only by what grew is ``transient_within`` and not ``within``. Guarantees: ``within``,
that no step took memory the pool was given; ``transient_within``, that the profiling
forward's headroom above what it started with (0016's reservation included) covered the
largest step's own transient, whatever the engine kept after the profile (``grown_bytes``,
reported beside it, not judged). A record from before the probe kept the step's start has no
transient verdict (None, never a pass).

The transient rule is lenient by what the profiling forward allocated and kept (its
allowance counts it; the step's start already holds it), so a DSA layer can take more in a
step than its profile did and still pass. The attention rule judges 0016's promise where it
is made, per rank and step class, from the probe's attribution:

    the DSA layer's largest segment transient in the step
        <= the same in the profiling forward + LAYER_SLACK_BYTES          ("attention_within")

where the layer's segments are those of a module whose class names ``Attention`` or
``Indexer`` (peak - allocated at the segment's entry), each class held to its own profile
segment, and LAYER_SLACK_BYTES covers the
per-step metadata a profiling batch does not carry (measured at most 2 MiB over its profile at
top-k 512). It is None (never a pass) for a record without attribution, or when no class of
the layer is among both the step's and the profile's recorded sites (the probe keeps each
one's three highest).

Negative controls (runs whose environment sets ``GATE_DROP_DCP_RESERVATION``) are judged
against their twin, the run of the same configuration without it, by each rule: ``alloc``
(the series' reservation recorded but not allocated) is ``caught`` when some rank steps over
its budget and the twin is ``within``, ``caught_by_transient_rule`` when some rank's step
transient exceeds its profile transient and the twin is ``transient_within``,
``caught_by_attention_rule`` likewise with ``attention_within``; ``all`` (no
reservation at all) when the series' start-up check refused the engine, with a twin within
by that rule. A twin whose growth exceeds its transient margin is never ``within``: on such
an engine only the transient rule can show the controls.

Capacity: vLLM's own figures after start-up (``num_gpu_blocks`` x ``block_size`` tokens per
rank, which DCP shards, and the ``kv_cache_size_tokens`` it logs), per DCP size among runs of
one checkpoint, backend and KV pool size per rank, with the ratio to that group's DCP = 1; a
run vLLM refused because its pool cannot hold one ``max_model_len`` request is a row too (no
tokens, the length refused and vLLM's estimate of the longest it could hold), never a memory
verdict.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gate.plan import DROP_RESERVATION_ENV as DROP_ENV

KIND = "dcp_memory"
SCHEMA_VERSION = 1
REFUSAL_MARK = "DCP headroom check"
# vLLM's own start-up refusal of a max_model_len its KV pool cannot hold (kv_cache_planning.py)
KV_REFUSAL_MARK = "KV cache is needed, which is larger than the available KV cache memory"
_ESTIMATED_LEN = re.compile(r"estimated maximum model length is (\d+)")
STEP_CLASSES = ("prefill", "decode")
# per rank and step class, the transient rule's figures (None for a record without the
# step's start)
TRANSIENT_FIELDS = (
    "step_transient_bytes",
    "profile_transient_bytes",
    "transient_margin_bytes",
    "grown_bytes",
)
UNRECORDED = "a rank's record has no step start (made before the transient rule)"
ATTRIBUTED = ("profile", *STEP_CLASSES)
LAYER_CLASSES = ("Attention", "Indexer")  # a DSA layer's modules in the probe's attribution
LAYER_SLACK_BYTES = 4 << 20
NO_ATTRIBUTION = "a rank's record has no attribution, or none of the DSA layer's segments"


def peak_at(mem: dict[str, Any]) -> dict[str, Any] | None:
    """Where the profile's and each step class's peak happened (the probe's attribution,
    each site with its transient); None for a record without attribution."""
    got = mem.get("attribution")
    if not got:
        return None
    return {
        kind: [s | {"transient_bytes": s["peak_bytes"] - s["entry_bytes"]} for s in got[kind]]
        if got.get(kind)
        else None
        for kind in ATTRIBUTED
    }


def transient(profile: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    """One step class against the transient rule (the module docstring): its figures and
    ``transient_within``, all None when the record lacks the step's or the profile's start."""
    start, before = step.get("peak_step_start_bytes"), profile.get("allocated_before_bytes")
    if start is None or before is None:
        return dict.fromkeys((*TRANSIENT_FIELDS, "transient_within"))
    step_transient = int(step["peak_bytes"]) - int(start)
    profile_transient = int(profile["peak_bytes"]) - int(before)
    margin = profile_transient - step_transient
    return {
        "step_transient_bytes": step_transient,
        "profile_transient_bytes": profile_transient,
        "transient_margin_bytes": margin,
        "grown_bytes": int(start) - int(before) - int(profile["kv_cache_bytes"]),
        "transient_within": margin >= 0,
    }


def layer_transients(sites: list[dict[str, Any]] | None) -> dict[str, int]:
    """Per module class of a DSA layer (an attention or indexer class), the largest
    transient among ``sites`` (``peak_at``'s sites of one step class or the profile)."""
    out: dict[str, int] = {}
    for s in sites or []:
        cls = s.get("class") or ""
        if any(c in cls for c in LAYER_CLASSES):
            out[cls] = max(out.get(cls, s["transient_bytes"]), s["transient_bytes"])
    return out


def attention(at: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    """One step class by the attention rule (the module docstring), each DSA module class
    recorded in both the step and the profile against itself: the largest of those in the
    step and in the profile and ``attention_within``; all None when no class is in both."""
    step = layer_transients((at or {}).get(kind))
    profile = layer_transients((at or {}).get("profile"))
    both = sorted(step.keys() & profile.keys())
    if not both:
        return {"layer_step_bytes": None, "layer_profile_bytes": None, "attention_within": None}
    return {
        "layer_step_bytes": max(step[c] for c in both),
        "layer_profile_bytes": max(profile[c] for c in both),
        "attention_within": all(step[c] <= profile[c] + LAYER_SLACK_BYTES for c in both),
    }


def rank_verdict(mem: dict[str, Any]) -> dict[str, Any]:
    """One rank's record against its budget and by the transient rule; ``within`` is None
    when there is nothing to judge (no profile, or no step ran), ``transient_within`` also
    when a judged class's record has no step start."""
    profile = mem.get("profile")
    steps = mem.get("steps") or {}
    out: dict[str, Any] = {
        "rank": mem.get("rank"),
        "dcp_reservation": mem.get("dcp_reservation"),
        "peak_at": peak_at(mem),
    }
    if not profile:
        why = "no profiling record (engine did not size its pool)"
        return {
            **out,
            "within": None,
            "transient_within": None,
            "attention_within": None,
            "why": why,
        }
    budget = int(profile["peak_bytes"]) + int(profile["kv_cache_bytes"])
    out.update(
        profiled_peak_bytes=int(profile["peak_bytes"]),
        kv_cache_bytes=int(profile["kv_cache_bytes"]),
        budget_bytes=budget,
    )
    judged = []
    for kind in STEP_CLASSES:
        step = steps.get(kind)
        if not step:
            continue
        peak = int(step["peak_bytes"])
        out[kind] = {
            "peak_bytes": peak,
            "margin_bytes": budget - peak,
            "within": peak <= budget,
            "steps": step.get("steps"),
            "peak_step_tokens": step.get("peak_step_tokens"),
            "max_step_tokens": step.get("max_step_tokens"),
            "peak_step_start_bytes": step.get("peak_step_start_bytes"),
            **transient(profile, step),
            **attention(out["peak_at"], kind),
        }
        judged.append(peak <= budget)
    out["within"] = all(judged) if judged else None
    for key in ("transient_within", "attention_within"):
        out[key] = _all_judged([out[k][key] for k in STEP_CLASSES if k in out])
    if not judged:
        out["why"] = "no model step after start-up"
    return out


def _all_judged(verdicts: list[bool | None]) -> bool | None:
    """All of ``verdicts`` hold; None when there is none or one was not judged."""
    return all(verdicts) if verdicts and None not in verdicts else None


def _by_rule(
    ranks: list[dict[str, Any]], key: str, why: str | None, unjudged: str
) -> tuple[bool | None, str | None]:
    """A run by one rule from its ranks' ``key``: (the verdict, why it was not judged), not
    judged where the run is not (``why``) or some rank is not (``unjudged``)."""
    why_not = why or (unjudged if any(r[key] is None for r in ranks) else None)
    return (None if why_not else all(r[key] for r in ranks)), why_not


def _every(items: list[dict[str, Any]], key: str) -> bool:
    """There are ``items`` and each one's ``key`` is True."""
    return bool(items) and all(i[key] is True for i in items)


def drop_of(run: dict[str, Any]) -> str:
    """The negative control a run is ("" for none)."""
    return str(((run.get("config") or {}).get("env") or {}).get(DROP_ENV, ""))


def twin_key(run: dict[str, Any]) -> str:
    """What a control shares with its twin: the configuration without name and control."""
    cfg = dict(run.get("config") or {})
    cfg.pop("name", None)
    cfg["env"] = {k: v for k, v in (cfg.get("env") or {}).items() if k != DROP_ENV}
    return json.dumps(cfg, sort_keys=True)


def refused(run: dict[str, Any]) -> bool:
    """The series' start-up check refused the engine (its message is the run's error)."""
    return REFUSAL_MARK in str(run.get("error") or "")


def capacity_refused(run: dict[str, Any]) -> bool:
    """vLLM refused to start: the pool cannot hold one request of max_model_len (a capacity
    finding, e.g. DCP 1 with the pool that holds the prompt at DCP 4; not a memory overrun)."""
    return KV_REFUSAL_MARK in str(run.get("error") or "")


def run_verdict(run: dict[str, Any]) -> dict[str, Any]:
    """Every rank of one run. ``within`` is judged only for a run that completed its clean
    pass with a memory record from each of its ranks (True: every rank within); else None,
    with ``why`` (a crash, a deadline, a missing rank: never a pass). ``transient_within``
    likewise by the transient rule, also None (``why_transient_not_judged``) when a rank's
    record has no step start."""
    ranks = [rank_verdict(m) for m in run.get("memory") or []]
    cfg = run.get("config") or {}
    world = int(cfg.get("tp") or 1)
    seen = sorted(r["rank"] for r in ranks if r["rank"] is not None)
    why = None
    if not run.get("ok") or "clean" not in (run.get("passes_complete") or []):
        why = "the run did not complete (its clean pass or a rank failed)"
    elif seen != list(range(world)):
        why = f"memory records of ranks {seen}, not of all {world}"
    elif any(r["within"] is None for r in ranks):
        why = "a rank has nothing to judge"
    within = None if why else all(r["within"] for r in ranks)
    transient_within, why_transient = _by_rule(ranks, "transient_within", why, UNRECORDED)
    attention_within, why_layer = _by_rule(ranks, "attention_within", why, NO_ATTRIBUTION)
    over = [
        r[k]["peak_bytes"] - r["budget_bytes"]
        for r in ranks
        for k in STEP_CLASSES
        if k in r and not r[k]["within"]
    ]
    return {
        "run": run.get("name"),
        "tp": cfg.get("tp"),
        "dcp": cfg.get("dcp"),
        "backend": cfg.get("backend"),
        "route": (cfg.get("engine_extra") or {}).get("dcp_prefill_route", "query"),
        "max_num_batched_tokens": cfg.get("max_num_batched_tokens"),
        "control": drop_of(run) or None,
        "ok": bool(run.get("ok")),
        "refused": refused(run),
        "capacity_refused": capacity_refused(run),
        "error": (run.get("error") or None) and str(run["error"])[:600],
        "within": within,
        "why_not_judged": why,
        "transient_within": transient_within,
        "why_transient_not_judged": why_transient,
        "attention_within": attention_within,
        "why_attention_not_judged": why_layer,
        "failed_steps": [
            {"rank": m.get("rank"), **m["failed_step"], **raised_in(m)}
            for m in run.get("memory") or []
            if m.get("failed_step")
        ],
        "largest_overrun_bytes": max(over) if over else None,
        "ranks": ranks,
    }


def raised_in(mem: dict[str, Any]) -> dict[str, Any]:
    """The module a rank's failed step raised in, when the probe attributed it."""
    failed = (mem.get("attribution") or {}).get("failed_step")
    return {"raised_in": failed["raised_in"]} if failed else {}


def unrecorded(verdict: dict[str, Any]) -> bool:
    """Some rank of the run has a step class judged without its step start (an old record)."""
    return any(
        k in r and r[k]["step_transient_bytes"] is None
        for r in verdict["ranks"]
        for k in STEP_CLASSES
    )


def control_verdict(control: dict[str, Any], twin: dict[str, Any] | None) -> dict[str, Any]:
    """Is the negative control caught? ``caught`` by the strict rule, ``alloc``: some rank
    of the control over its budget; ``all``: the engine refused by the series' check; its
    twin must be within (else the control shows nothing). ``caught_by_transient_rule`` the
    same by the transient rule, ``alloc``: some rank's step transient over its profile
    transient; its twin must be transient_within (None where either record has no step
    start). For ``alloc``, the reservation's bytes are the difference of the two profiled
    peaks."""
    kind = control["control"]
    if twin is None:
        why = "no twin run (same configuration, no control)"
        return {
            "caught": None,
            "caught_by_transient_rule": None,
            "caught_by_attention_rule": None,
            "why": why,
        }
    out: dict[str, Any] = {
        "twin": twin["run"],
        "twin_within": twin["within"],
        "twin_transient_within": twin["transient_within"],
        "twin_attention_within": twin["attention_within"],
    }
    twin_ok = twin["transient_within"] is True
    twin_layer = twin["attention_within"]
    if kind == "all":
        out["caught"] = control["refused"] and twin["within"] is True
        out["caught_by_transient_rule"] = (
            None if unrecorded(twin) else control["refused"] and twin_ok
        )
        out["caught_by_attention_rule"] = (
            None if twin_layer is None else control["refused"] and twin_layer
        )
        return out
    out["caught_by_attention_rule"] = (
        None
        if twin_layer is None or control["attention_within"] is None
        else control["attention_within"] is False and twin_layer
    )
    out["caught"] = control["within"] is False and twin["within"] is True
    out["caught_by_transient_rule"] = (
        None
        if unrecorded(twin) or unrecorded(control)
        else control["transient_within"] is False and twin_ok
    )
    twin_peaks = {r["rank"]: r.get("profiled_peak_bytes") for r in twin["ranks"]}
    ctl_peaks = {r["rank"]: r.get("profiled_peak_bytes") for r in control["ranks"]}
    if twin_peaks and twin_peaks.keys() == ctl_peaks.keys():
        out["reservation_bytes_by_rank"] = {
            str(rank): twin_peaks[rank] - ctl_peaks[rank]
            for rank in sorted(twin_peaks)
            if twin_peaks[rank] is not None and ctl_peaks[rank] is not None
        }
    return out


def capacity_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's KV capacity per run (rank 0's figures; every rank holds the same pool), grouped
    by checkpoint, backend (its KV record layout sets the tokens a block of bytes holds) and
    KV bytes per rank, with the ratio of tokens to the group's DCP = 1 (None without one)."""
    rows = []
    for run in runs:
        mems = run.get("memory") or []
        engine = (mems[0].get("engine") if mems else None) or {}
        cfg = run.get("config") or {}
        dcp = int(cfg.get("dcp", 1))
        if drop_of(run):
            continue
        row = {
            "run": run.get("name"),
            "checkpoint": str(cfg.get("model", "")).rstrip("/").rsplit("/", 1)[-1],
            "backend": cfg.get("backend"),
            "kv_cache_memory_bytes": cfg.get("kv_cache_memory_bytes"),
            "tp": cfg.get("tp"),
            "dcp": dcp,
            "max_model_len": cfg.get("max_model_len"),
        }
        if engine.get("num_gpu_blocks"):
            blocks, block = int(engine["num_gpu_blocks"]), int(engine.get("block_size") or 0)
            row.update(
                num_gpu_blocks=blocks,
                block_size=block,
                tokens=blocks * block * dcp,
                vllm_kv_cache_size_tokens=engine.get("kv_cache_size_tokens"),
                longest_prompt_served=longest_served(run),
            )
        elif capacity_refused(run):
            estimated = _ESTIMATED_LEN.search(str(run.get("error")))
            row.update(
                tokens=None,
                refused_max_model_len=cfg.get("max_model_len"),
                vllm_estimated_max_model_len=int(estimated.group(1)) if estimated else None,
                longest_prompt_served=None,
            )
        else:
            continue
        rows.append(row)

    def group(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["checkpoint"], r["backend"], r["kv_cache_memory_bytes"]

    base: dict[tuple[Any, ...], int] = {}
    for r in rows:
        if r["dcp"] == 1 and r["tokens"]:
            base.setdefault(group(r), r["tokens"])
    for r in rows:
        one = base.get(group(r))
        r["tokens_vs_dcp1"] = round(r["tokens"] / one, 3) if one and r["tokens"] else None
    return sorted(rows, key=lambda r: (r["checkpoint"], r["kv_cache_memory_bytes"] or 0, r["dcp"]))


def longest_served(run: dict[str, Any]) -> int | None:
    """The longest single prompt of a run whose clean pass finished (None otherwise)."""
    if "clean" not in (run.get("passes_complete") or []):
        return None
    return max((run.get("config") or {}).get("lens") or [], default=None)


def result_name(suite: str | None) -> str:
    """The memory result's file name for a suite or queue: ``dcp-memory-<name>.json``, a
    leading ``memory-`` of the name dropped (suite ``memory-dcp`` -> ``dcp-memory-dcp.json``)."""
    return f"dcp-memory-{(suite or 'suite').removeprefix('memory-')}.json"


def memory_result(runs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The memory test over the runs that carry memory records (None when none does)."""
    probed = {
        n: r
        for n, r in runs.items()
        if r.get("memory") or (r.get("config") or {}).get("memory_probe")
    }
    if not probed:
        return None
    verdicts = {n: run_verdict(r) for n, r in sorted(probed.items())}
    twins = {twin_key(r): verdicts[n] for n, r in probed.items() if not drop_of(r)}
    controls = {
        n: control_verdict(verdicts[n], twins.get(twin_key(r)))
        for n, r in probed.items()
        if drop_of(r)
    }
    # a capacity refusal by vLLM is a capacity row, not a memory verdict; DCP = 1 runs (no
    # series DCP path) are the baseline, the headline judges the DCP > 1 runs
    judged = [v for v in verdicts.values() if v["control"] is None and not v["capacity_refused"]]
    series = [v for v in judged if (v["dcp"] or 1) > 1]
    baseline = [v for v in judged if (v["dcp"] or 1) == 1]
    caught = list(controls.values())
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "rule": "every rank's largest prefill and decode step peak <= profiled peak + KV pool",
        "transient_rule": "every rank's largest prefill and decode step peak - allocated at "
        "its start <= profiled peak - allocated when the profiling started",
        "all_within_covers": "the DCP > 1 runs that are not controls (DCP = 1: baseline_within)",
        "runs": verdicts,
        "controls": controls,
        "all_within": _every(series, "within"),
        "baseline_within": _every(baseline, "within") if baseline else None,
        "all_transient_within": _every(series, "transient_within"),
        "baseline_transient_within": _every(baseline, "transient_within") if baseline else None,
        "controls_caught": _every(caught, "caught"),
        "controls_caught_by_transient_rule": _every(caught, "caught_by_transient_rule"),
        "attention_rule": "every rank's largest DSA-layer segment transient in its largest "
        f"prefill and decode step <= that in the profiling forward + {LAYER_SLACK_BYTES} bytes",
        "all_attention_within": _every(series, "attention_within"),
        "baseline_attention_within": _every(baseline, "attention_within") if baseline else None,
        "controls_caught_by_attention_rule": _every(caught, "caught_by_attention_rule"),
        "capacity": capacity_rows(list(probed.values())),
    }


RESULT_KEYS = (
    "schema_version",
    "kind",
    "rule",
    "transient_rule",
    "runs",
    "controls",
    "all_within",
    "baseline_within",
    "all_transient_within",
    "baseline_transient_within",
    "controls_caught",
    "controls_caught_by_transient_rule",
    "attention_rule",
    "all_attention_within",
    "baseline_attention_within",
    "controls_caught_by_attention_rule",
    "capacity",
    "command",
    "revision",
    "base",
    "machine",
)


def validate(doc: dict[str, Any]) -> list[str]:
    """What is missing or inconsistent in a memory result before it is written (the
    transient rule's keys of the right types included)."""
    out = [f"missing {k}" for k in RESULT_KEYS if k not in doc]
    if doc.get("kind") != KIND:
        out.append(f"kind {doc.get('kind')!r}, want {KIND!r}")
    if "transient_rule" in doc and not isinstance(doc["transient_rule"], str):
        out.append("transient_rule is not a string")
    for key, nullable in (
        ("all_transient_within", False),
        ("baseline_transient_within", True),
        ("controls_caught_by_transient_rule", False),
        ("all_attention_within", False),
        ("baseline_attention_within", True),
        ("controls_caught_by_attention_rule", False),
    ):
        if key in doc and not _verdict(doc[key], nullable):
            out.append(f"{key} is {doc[key]!r}, not a verdict")
    for name, v in (doc.get("runs") or {}).items():
        if v.get("within") is None and not v.get("why_not_judged") and not v.get("control"):
            if not v.get("capacity_refused"):
                out.append(f"run {name}: not judged, and no reason given")
        if not _verdict(v.get("transient_within"), True):
            out.append(f"run {name}: transient_within is {v.get('transient_within')!r}")
        elif v.get("transient_within") is None and not v.get("why_transient_not_judged"):
            out.append(f"run {name}: not judged by the transient rule, and no reason given")
        if not _verdict(v.get("attention_within"), True):
            out.append(f"run {name}: attention_within is {v.get('attention_within')!r}")
        elif v.get("attention_within") is None and not v.get("why_attention_not_judged"):
            out.append(f"run {name}: not judged by the attention rule, and no reason given")
        for r in v.get("ranks") or []:
            where = f"run {name} rank {r.get('rank')}"
            for key in ("transient_within", "attention_within"):
                if not _verdict(r.get(key), True):
                    out.append(f"{where}: {key} is {r.get(key)!r}")
            for kind in STEP_CLASSES:
                got = r.get(kind)
                if got is None:
                    continue
                for f in ("peak_step_start_bytes", *TRANSIENT_FIELDS):
                    if got.get(f) is not None and (type(got.get(f)) is not int):
                        out.append(f"{where} {kind}: {f} is {got.get(f)!r}, not bytes")
                if not _verdict(got.get("transient_within"), True):
                    out.append(f"{where} {kind}: transient_within is not a verdict")
    for name, c in (doc.get("controls") or {}).items():
        if name not in (doc.get("runs") or {}):
            out.append(f"control {name} is not among the runs")
        for key in ("caught_by_transient_rule", "caught_by_attention_rule"):
            if not _verdict(c.get(key), True):
                out.append(f"control {name}: {key} is not a verdict")
    return out


def _verdict(x: Any, nullable: bool) -> bool:
    """A verdict's type: a bool (or None where not judged is allowed)."""
    return isinstance(x, bool) or (nullable and x is None)
