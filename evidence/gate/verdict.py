# SPDX-License-Identifier: Apache-2.0
"""The gate's judgements, from two run records (pure Python, tested on CPU).

A run record (written by evidence/dcp_gate.py) holds per pass and prompt key the greedy tokens
and, per generated step, the top-k log-probs. Two runs are compared prompt by prompt:

* steps 0..d share their context, where d is the first step whose tokens differ (all steps
  when none do); at each such step the log-probs of the token ids present in both top-k lists
  are compared, and the largest absolute difference must be <= the tolerance;
* a differing token at step d is accepted only as a near tie: in both runs both tokens are in
  the top-k and their log-probs differ by <= the tolerance (a legitimate reordering can flip
  the argmax of two near-equal candidates; a wrong attention result moves everything);
* every prompt of the reference must be there, with the same prompt digest and token count.

The tolerance is derived from the noise floor (legitimate reorderings: TP=2 DCP=1 against
TP=1, and two identical runs): ``max(TOLERANCE_FACTOR * noise floor, TOLERANCE_MIN)``. A gate
result is only meaningful when the checkpoint's sensitivity (one prompt token changed near the
start moves the first generated step's log-probs) exceeds the tolerance by at least
SENSITIVITY_MARGIN, and when the negative control (a fault injected into the candidate) makes
the comparison fail.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gate import plan
from gate.ledger import phase_sums

SENSITIVITY_MEASURE = (
    "per prompt, a lower bound of the largest first-step |delta log-prob| over the vocabulary "
    "(ids in both top-k lists: their difference; an id in one list only: its log-prob minus "
    "the other list's smallest); the figure is the smallest over the prompts"
)
PERTURB_POSITION_NOTE = "one prompt token changed at the position the key names (~p<pos>)"
TOLERANCE_FACTOR = 4.0
TOLERANCE_MIN = 1e-3
SENSITIVITY_MARGIN = 5.0
SCHEMA_VERSION = 1
GATE_KIND = "dcp_gate"
NOISE_KIND = "dcp_gate_noise"
REQUIRED_KEYS = (
    "base",
    "dcp",
    "backend",
    "equivalent",
    "tolerance",
    "noise_floor",
    "sensitivity",
    "negative_control_detected",
    "meaningful",
)

TOLERANCE_RULE = (
    f"atol = max({TOLERANCE_FACTOR:g} x noise floor, {TOLERANCE_MIN:g}); noise floor = the "
    "largest |delta log-prob| over shared-context steps and common top-k ids of the noise "
    "pairs (TP=2 DCP=1 vs TP=1; two identical runs)"
)
EQUIVALENCE_RULE = (
    "equivalent iff every reference prompt was served with the same digest and token count, "
    "at every shared-context step the log-probs of the ids in both top-k lists differ by <= "
    "atol, and a differing greedy token is a near tie (both tokens in both top-k lists, "
    "within atol of each other)"
)


def finished_passes(run: dict[str, Any]) -> dict[str, Any]:
    """The passes of a run record that the verdicts may use: those it lists in
    ``passes_complete`` (each served in full: the launcher keeps a pass only when all of its
    prompts came back), even when the run as a whole did not complete (timed out, a rank
    died); a record without ``passes_complete`` (written before partial records) is all or
    nothing: its passes when ok, none otherwise."""
    passes = run.get("passes") or {}
    done = run.get("passes_complete")
    if done is None:
        return dict(passes) if run.get("ok") else {}
    return {name: passes[name] for name in done if name in passes}


def incomplete(run: dict[str, Any]) -> bool:
    """A run that did not complete but whose finished passes the verdicts use."""
    return not run.get("ok") and bool(finished_passes(run))


def _top(step: dict[str, Any]) -> dict[int, float]:
    return {int(t): float(lp) for t, lp in step["top"]}


def step_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, int]:
    """(largest |delta log-prob| over the ids in both top-k lists, how many ids that is)."""
    ta, tb = _top(a), _top(b)
    common = set(ta) & set(tb)
    if not common:
        return None, 0
    diffs = [abs(ta[t] - tb[t]) for t in common]
    if any(math.isnan(d) for d in diffs):  # max() would silently skip a NaN
        return math.nan, len(common)
    return max(diffs), len(common)


def largest_difference(
    a_steps: list[dict[str, Any]], b_steps: list[dict[str, Any]]
) -> dict[str, Any]:
    """Where the largest |delta log-prob| over the ids in both top-k lists sits, over the
    given steps: its step, id and both log-probs (None without a finite one), plus how many
    (step, id) entries were compared and how many of them are equal."""
    where: dict[str, Any] | None = None
    best, compared, equal = -1.0, 0, 0
    for i, (sa, sb) in enumerate(zip(a_steps, b_steps, strict=False)):
        ta, tb = _top(sa), _top(sb)
        for t in sorted(set(ta) & set(tb)):
            d = abs(ta[t] - tb[t])
            compared += 1
            equal += d == 0.0
            if d > best:  # False for NaN: a NaN entry is counted, never the largest
                best, where = d, {"step": i, "id": t, "ref": ta[t], "cand": tb[t]}
    return {"at": where, "entries_compared": compared, "entries_equal": equal}


def step_move_lower_bound(a: dict[str, Any], b: dict[str, Any]) -> float:
    """A lower bound of the largest |delta log-prob| over the whole vocabulary at one step,
    from the two top-k lists: exact for the ids in both, and for an id in only one list at
    least its log-prob there minus the other list's smallest (the id ranks below all of
    those). NaN if any log-prob is NaN."""
    ta, tb = _top(a), _top(b)
    if any(math.isnan(x) for x in (*ta.values(), *tb.values())):
        return math.nan
    floor_a, floor_b = min(ta.values()), min(tb.values())
    moves = [abs(ta[t] - tb[t]) for t in set(ta) & set(tb)]
    moves += [lp - floor_b for t, lp in ta.items() if t not in tb]
    moves += [lp - floor_a for t, lp in tb.items() if t not in ta]
    return max([0.0, *moves])


def near_tie(step: dict[str, Any], tok_a: int, tok_b: int, atol: float) -> bool:
    top = _top(step)
    return tok_a in top and tok_b in top and abs(top[tok_a] - top[tok_b]) <= atol


def compare_prompt(a: dict[str, Any], b: dict[str, Any], atol: float) -> dict[str, Any]:
    """Compare one prompt's record in run a (reference) and run b (candidate)."""
    if a["prompt_sha256"] != b["prompt_sha256"]:
        return {"equivalent": False, "reasons": ["prompt digests differ"]}
    ta, tb = a["tokens"], b["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), None)
    upto = min(len(ta), len(tb)) if first is None else first + 1
    diffs: list[float] = []
    min_common = None
    disjoint_steps, nan_steps = [], []
    for i in range(upto):
        d, n = step_difference(a["steps"][i], b["steps"][i])
        min_common = n if min_common is None else min(min_common, n)
        if d is None:
            disjoint_steps.append(i)
        elif math.isnan(d):  # a NaN never compares greater than atol: refuse it outright
            nan_steps.append(i)
        else:
            diffs.append(d)
    max_diff = max(diffs) if diffs else None
    first_step = step_difference(a["steps"][0], b["steps"][0])[0] if ta and tb else None
    if first_step is not None and math.isnan(first_step):
        first_step = None
    tie = None
    if first is not None:
        sa, sb = a["steps"][first], b["steps"][first]
        tie = near_tie(sa, ta[first], tb[first], atol) and near_tie(sb, ta[first], tb[first], atol)
    reasons = []
    if len(ta) != len(tb):
        reasons.append(f"token counts differ ({len(ta)} vs {len(tb)})")
    if nan_steps:
        reasons.append(f"NaN log-probs at steps {nan_steps}")
    if disjoint_steps:
        reasons.append(f"no common top-k id at steps {disjoint_steps}")
    if max_diff is not None and max_diff > atol:
        reasons.append(f"max |delta log-prob| {max_diff:.4g} > atol {atol:.4g}")
    if first is not None and not tie:
        reasons.append(f"tokens differ at step {first} and it is not a near tie")
    if upto == 0:
        reasons.append("no step to compare")
    return {
        "prompt_len": a.get("prompt_len"),
        "tokens_ref": ta,
        "tokens_cand": tb,
        "first_token_difference": first,
        "divergence_is_near_tie": tie,
        "compared_steps": upto,
        "min_common_top_ids": min_common,
        "first_step_max_abs_logprob_diff": first_step,
        "max_abs_logprob_diff": max_diff,
        "largest_difference": largest_difference(a["steps"][:upto], b["steps"][:upto]),
        "equivalent": not reasons,
        "reasons": reasons,
    }


def checkpoints_differ(ref: dict[str, Any], cand: dict[str, Any]) -> str | None:
    """Why two runs' records cannot be compared because they name different checkpoint
    weights (their recorded safetensors sha256), or None. Runs of two leases are compared
    only when the seeded script wrote the same bytes on both machines."""
    a, b = ((r.get("checkpoint") or {}).get("safetensors_sha256") for r in (ref, cand))
    if a is not None and b is not None and a != b:
        return f"reference and candidate ran different checkpoints (sha256 {a} vs {b})"
    return None


def compare_passes(
    ref: dict[str, Any],
    cand: dict[str, Any],
    atol: float,
    ref_pass: str = "clean",
    cand_pass: str = "clean",
    keys_of: str = "ref",
) -> dict[str, Any]:
    """Every prompt of ``ref_pass`` in run ``ref`` against the same key in ``cand_pass``
    (``keys_of="cand"``: every prompt the candidate served, each of which the reference must
    have: a variant run with a lighter prompt set than its reference)."""
    out: dict[str, Any] = {"ref_pass": ref_pass, "cand_pass": cand_pass, "prompts": {}}
    problems = []
    rp = finished_passes(ref).get(ref_pass)
    cp = finished_passes(cand).get(cand_pass)
    for side, run, got, name in (
        ("reference", ref, rp, ref_pass),
        ("candidate", cand, cp, cand_pass),
    ):
        if got is not None:
            continue
        if not run.get("ok"):
            problems.append(
                f"{side} run failed without a finished {name!r} pass: {run.get('error')}"
            )
        else:
            problems.append(f"{side} has no pass {name!r}")
    differ = checkpoints_differ(ref, cand)
    if differ:
        problems.append(differ)
    out["incomplete_runs"] = [
        run.get("name") or side
        for side, run in (("reference", ref), ("candidate", cand))
        if not run.get("ok") and not problems
    ]
    if not problems:
        if keys_of == "cand":
            keys = list(cp)
        else:
            keys = [k for k in rp if k in cp] if cand_pass != ref_pass else list(rp)
        if not keys:
            problems.append("no prompt in common")
        for key in keys:
            if key not in rp:
                out["prompts"][key] = {"equivalent": False, "reasons": ["missing in reference"]}
                continue
            if key not in cp:
                out["prompts"][key] = {"equivalent": False, "reasons": ["missing in candidate"]}
                continue
            out["prompts"][key] = compare_prompt(rp[key], cp[key], atol)
    out["problems"] = problems
    out["equivalent"] = not problems and all(p["equivalent"] for p in out["prompts"].values())
    diffs = [
        p["max_abs_logprob_diff"]
        for p in out["prompts"].values()
        if p.get("max_abs_logprob_diff") is not None
    ]
    out["max_abs_logprob_diff"] = max(diffs) if diffs else None
    return out


def pair_noise(ref: dict[str, Any], cand: dict[str, Any], ref_pass="clean", cand_pass="clean"):
    """The largest |delta log-prob| of a noise pair over its shared-context steps (None when
    a run failed or nothing was compared), computed with no tolerance in play."""
    cmp = compare_passes(ref, cand, math.inf, ref_pass, cand_pass)
    if cmp["problems"]:
        return None, cmp
    return cmp["max_abs_logprob_diff"], cmp


def derive_tolerance(noise: dict[str, float | None]) -> dict[str, Any]:
    """The tolerance from the noise pairs: label -> that pair's largest difference."""
    measured = {k: v for k, v in noise.items() if v is not None}
    if not measured:
        raise ValueError("no noise pair was measured: the tolerance cannot be derived")
    floor = max(measured.values())
    return {
        "atol_logprob": max(TOLERANCE_FACTOR * floor, TOLERANCE_MIN),
        "noise_floor": floor,
        "factor": TOLERANCE_FACTOR,
        "minimum": TOLERANCE_MIN,
        "rule": TOLERANCE_RULE,
    }


def sensitivity(ref: dict[str, Any], atol: float | None = None) -> dict[str, Any]:
    """How far one changed prompt token (the ``sensitivity`` pass) moves the first generated
    step of each single prompt; the figure is the smallest such move over the prompts.

    The move of one prompt is ``step_move_lower_bound`` of its first step: the ids that
    leave or enter the top-k count with the least they must have moved, so a perturbation
    that replaces most of the top-k (the strongest kind) is not scored by the few ids that
    stay. ``min_first_step_max_abs_logprob_diff`` keeps the common-ids figure (the first
    gate files' measure, which that case understates)."""
    done = finished_passes(ref)
    clean, pert = done.get("clean"), done.get("sensitivity")
    if not pert or not clean:
        return {"measured": False}
    rows = {}
    answer = answer_id(ref)
    for key, rec in pert.items():
        base = clean.get(key.partition("~p")[0])
        if base is None:
            continue
        d, n = step_difference(base["steps"][0], rec["steps"][0])
        rows[key] = {
            "first_step_move_lower_bound": step_move_lower_bound(base["steps"][0], rec["steps"][0]),
            "first_step_max_abs_logprob_diff": d,
            "common_top_ids": n,
            "first_token_changed": base["tokens"][0] != rec["tokens"][0],
            "prompt_len": rec.get("prompt_len"),
        }
        if answer is not None:  # a needle checkpoint: without the needle, no answer
            rows[key]["answer_absent"] = _first_token(rec) != answer
    common = [r["first_step_max_abs_logprob_diff"] for r in rows.values()]
    bounds = [r["first_step_move_lower_bound"] for r in rows.values()]
    figure = min(bounds) if bounds and not any(math.isnan(b) for b in bounds) else None
    out: dict[str, Any] = {
        "measured": bool(rows),
        "position": PERTURB_POSITION_NOTE,
        "measure": SENSITIVITY_MEASURE,
        "per_prompt": rows,
        "min_first_step_move_lower_bound": figure,
        "min_first_step_max_abs_logprob_diff": min(
            (m for m in common if m is not None), default=None
        ),
        "all_top_ids_disjoint": bool(common) and all(m is None for m in common),
    }
    if atol is not None and rows:
        out["margin_required"] = SENSITIVITY_MARGIN
        out["over_tolerance"] = None if figure is None else figure / atol
        out["sufficient"] = figure is not None and figure >= SENSITIVITY_MARGIN * atol
    return out


def answer_id(run: dict[str, Any]) -> int | None:
    """The answer token of a run's needle checkpoint: the id make_dsa_gate_ckpt.add_answer
    made the retrieved needle raise (its ``needle`` record in gate_ckpt.json, which
    dcp_gate.checkpoint_info copies into the run record), when ``answer_logit`` > 0; None
    for a checkpoint without a needle or without an answer token."""
    needle = (run.get("checkpoint") or {}).get("needle") or {}
    logit = needle.get("answer_logit") or 0
    if not isinstance(logit, (int, float)) or logit <= 0 or needle.get("answer_id") is None:
        return None
    return int(needle["answer_id"])


def _first_token(rec: dict[str, Any]) -> int | None:
    return int(rec["tokens"][0]) if rec.get("tokens") else None


NEEDLE_RETRIEVAL_NOTE = (
    "needle checkpoints only: per single prompt, the first generated token against the "
    "checkpoint's answer token; clean pass (needle at position 5): needle_retrieved iff it is "
    "the answer; sensitivity pass (needle replaced): answer_absent iff it is not"
)


def needle_retrieval(run: dict[str, Any]) -> dict[str, Any] | None:
    """Whether a run found the needle, from the first generated token of each single prompt:
    in its clean pass ``needle_retrieved`` (the token is the checkpoint's answer), in its
    sensitivity pass, where the needle is replaced, ``answer_absent`` (it is not). None for a
    checkpoint without an answer token; passes the run did not finish are empty."""
    answer = answer_id(run)
    if answer is None:
        return None
    done = finished_passes(run)
    clean = {
        key: {"first_token": _first_token(rec), "needle_retrieved": _first_token(rec) == answer}
        for key, rec in sorted((done.get("clean") or {}).items())
        if key.startswith("single/")
    }
    without = {
        key: {"first_token": _first_token(rec), "answer_absent": _first_token(rec) != answer}
        for key, rec in sorted((done.get("sensitivity") or {}).items())
    }
    return {
        "answer_id": answer,
        "clean": clean,
        "sensitivity": without,
        "all_retrieved": bool(clean) and all(r["needle_retrieved"] for r in clean.values()),
        "all_absent_without_needle": (
            all(r["answer_absent"] for r in without.values()) if without else None
        ),
    }


def negative_control(ref: dict[str, Any], cand: dict[str, Any], atol: float) -> dict[str, Any]:
    """The candidate's ``fault`` pass against the reference's clean pass: detected iff the
    comparison fails (with the prompts really served, not because a run crashed)."""
    faulted = finished_passes(cand).get("fault")
    if not faulted:
        return {"ran": False, "detected": False}
    cmp = compare_passes(ref, cand, atol, "clean", "fault")
    served = not cmp["problems"] and bool(cmp["prompts"])
    return {
        "ran": True,
        "fault": cand.get("fault", {}),
        "detected": served and not cmp["equivalent"],
        "max_abs_logprob_diff": cmp["max_abs_logprob_diff"],
        "prompts_failing": sorted(k for k, p in cmp["prompts"].items() if not p["equivalent"]),
        "prompts": sorted(cmp["prompts"]),
        "incomplete_runs": cmp["incomplete_runs"],
        "problems": cmp["problems"],
    }


GATE_KINDS = ("dcp", "dcp_pair", "wire", "spec", "accept")
# The candidate's pass a gate compares with the reference's clean pass: the clean one, or the
# repeat one (with the prefix cache on, the clean prompts served again from the cache).
GATE_CAND_PASSES = ("clean", "repeat")
# Gate kinds whose negative control may come from a control run (gate_result's ``control``).
GATE_CONTROL_KINDS = ("dcp", "dcp_pair")
GATE_KIND_NOTES = {
    "dcp": "DCP > 1 against DCP = 1 at the same TP (the issue's gate)",
    "dcp_pair": "one DCP > 1 run against another at the same TP and DCP (e.g. packed-CKV "
    "route vs query route, one top-k merge backend vs another): equality to the noise floor",
    "wire": "a lossy DCP wire (fp8) against the same run on the activations' dtype: judged "
    "under the bf16 tolerance (equivalent) and, separately, under the stated wire tolerance",
    "spec": "speculative (MTP) greedy decoding against non-speculative greedy decoding of the "
    "same configuration: every token exact, log-probs within the tolerance",
    "accept": "the same speculative configuration at DCP > 1 against DCP = 1: every token "
    "exact, log-probs within the tolerance, and the draft accepted exactly as often (the "
    "draft model's own attention over its DCP-sharded cache shows only in acceptance)",
}
# An acceptance gate means something only where acceptance depends on the draft's DCP
# attention: the reference accepts drafts (at least ACCEPT_MIN_ACCEPTED tokens), and the fault
# pass (one rank's partial dropped in the target and the draft) accepts at most
# ACCEPT_FAULT_SHARE of the reference's rate. (Until 2026-12-02 the rule was a reference rate
# of at least 0.5, a proxy for this; the glmnm runs accepted 26 % / 18 % of their drafts at
# k = 2 / 4, all or nothing per draft, and 0 % under the fault.)
ACCEPT_MIN_ACCEPTED = 16
ACCEPT_FAULT_SHARE = 0.5
# The fp8 wire's tolerance: a stated choice over the measured noise floor, never the bf16 one.
WIRE_TOLERANCE_FACTOR = 16.0
WIRE_TOLERANCE_RULE = (
    f"wire atol = max({WIRE_TOLERANCE_FACTOR:g} x noise floor, {TOLERANCE_MIN:g}): e4m3 with one "
    "fp32 scale per 128 values on the query gather and the combine is lossy; the factor is a "
    "choice stated here, the deviation and its ratio to the noise floor are measured"
)
NEGATIVE_CONTROL_NOTES = {
    "dcp": "the candidate's fault pass (one DCP rank's partial dropped from every layer's LSE "
    "merge) against the reference's clean pass",
    "dcp_pair": "the candidate's fault pass (one DCP rank's partial dropped from every LSE merge "
    "it still does; on the packed-CKV route prefill rows take no merge, so the fault reaches "
    "the decode rows only) against the reference's clean pass",
    "wire": "the candidate's fault pass against the reference's clean pass, judged under the "
    "tolerance the wire is judged at: the bf16 one when the wire stayed within it, else the "
    "wire tolerance (a fault that the wider tolerance hides is not detected)",
    "spec": "the speculative run's fault pass (one DCP rank's partial dropped in the target and "
    "the draft model) against the non-speculative reference's clean pass",
    "accept": "the DCP > 1 run's fault pass (one DCP rank's partial dropped in the target and "
    "the draft model) against the DCP = 1 run's clean pass; its acceptance is reported beside",
}


def acceptance(run: dict[str, Any], pass_name: str = "clean") -> dict[str, Any] | None:
    """A speculative run's draft tokens and accepted tokens in one pass (vLLM's counters, as
    the worker recorded their change over the pass); None when not recorded."""
    metrics = ((run.get("spec") or {}).get(pass_name) or {}).get("metrics") or {}
    drafted = metrics.get("vllm:spec_decode_num_draft_tokens")
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens")
    if not isinstance(drafted, (int, float)) or not isinstance(accepted, (int, float)):
        return None
    rate = accepted / drafted if drafted else None
    return {"draft_tokens": int(drafted), "accepted_tokens": int(accepted), "rate": rate}


def tokens_exact(ref_pass: dict[str, Any] | None, cand_pass: dict[str, Any] | None) -> dict:
    """Per prompt of the candidate: are its greedy tokens those of the reference, all of them."""
    rows: dict[str, Any] = {}
    for key, rec in (cand_pass or {}).items():
        base = (ref_pass or {}).get(key)
        if base is None:
            rows[key] = {"exact": False, "reason": "missing in reference"}
            continue
        if base.get("prompt_sha256") != rec.get("prompt_sha256"):
            rows[key] = {"exact": False, "reason": "prompt digests differ"}
            continue
        a, b = base["tokens"], rec["tokens"]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows[key] = {"exact": first is None, "first_token_difference": first}
    return {"all_exact": bool(rows) and all(r["exact"] for r in rows.values()), "prompts": rows}


def ledger_totals(run: dict[str, Any]) -> dict[str, Any]:
    """Per pass, rank and phase: the exact wire bytes summed over the layers, the per-layer
    bytes, and whether every rank moved the same bytes per layer and phase."""
    out: dict[str, Any] = {}
    for entry in run.get("ledger") or []:
        for pass_name, summ in (entry.get("passes") or {}).items():
            if not summ:
                continue
            phases = phase_sums(summ)
            per_phase = {phase: p["wire_bytes"] for phase, p in phases.items()}
            per_layer: dict[str, dict[str, int]] = {}
            for phase, p in phases.items():
                for layer, rec in p["per_layer"].items():
                    per_layer.setdefault(layer, {})[phase] = rec["wire_bytes"]
            slot = out.setdefault(pass_name, {"ranks": {}})
            slot["ranks"][str(entry["rank"])] = {
                "wire_bytes_by_phase": per_phase,
                "wire_bytes_by_layer": per_layer,
                "armed": summ.get("armed"),
            }
    for slot in out.values():
        layers = [r["wire_bytes_by_layer"] for r in slot["ranks"].values()]
        slot["ranks_agree"] = all(x == layers[0] for x in layers)
        slot["time_label"] = "one-GPU emulation (socket transport)"
    return out


def gate_result(
    name: str,
    ref: dict[str, Any],
    cand: dict[str, Any],
    tol: dict[str, Any],
    noise: dict[str, Any],
    sens: dict[str, Any],
    kind: str = "dcp",
    cand_pass: str = "clean",
    control: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The comparison file of one gate: the candidate's ``cand_pass`` (GATE_CAND_PASSES)
    against the reference's clean pass, judged as ``kind`` (GATE_KINDS; GATE_KIND_NOTES says
    what each compares). The negative control is the candidate's fault pass, or ``control``'s:
    a run of the candidate's engine configuration (CONTROL_MAY_DIFFER aside) that ran the
    fault pass the candidate cannot (GATE_CONTROL_KINDS only)."""
    if kind not in GATE_KINDS:
        raise ValueError(f"unknown gate kind {kind!r}; valid: {', '.join(GATE_KINDS)}")
    if cand_pass not in GATE_CAND_PASSES:
        raise ValueError(
            f"unknown candidate pass {cand_pass!r}; valid: {', '.join(GATE_CAND_PASSES)}"
        )
    if control is not None and kind not in GATE_CONTROL_KINDS:
        raise ValueError(
            f"a control run serves gates of kind {', '.join(GATE_CONTROL_KINDS)}, not {kind!r}"
        )
    atol = tol["atol_logprob"]
    # a variant run may serve a lighter prompt set than its reference, and a repeat pass
    # serves fewer prompts than the clean one: compare what the candidate served, and require
    # every prompt its own configuration names for that pass
    keys_of = "cand" if cand_pass != "clean" or _lighter(ref, cand) else "ref"
    cmp = compare_passes(ref, cand, atol, cand_pass=cand_pass, keys_of=keys_of)
    cand_served = finished_passes(cand).get(cand_pass)
    if cand_served is not None:
        missing = sorted(set(expected_keys(cand, cand_pass)) - set(cand_served))
        if missing:
            cmp["problems"].append(f"candidate did not serve {missing}")
            cmp["equivalent"] = False
    extra: dict[str, Any] = {"gate_kind": kind, "compares": compares_note(kind, ref, cand)}
    equivalent = cmp["equivalent"]
    neg_atol = atol
    if kind == "wire":
        floor = tol["noise_floor"]
        wire_atol = max(WIRE_TOLERANCE_FACTOR * floor, TOLERANCE_MIN)
        raw = compare_passes(ref, cand, math.inf, cand_pass=cand_pass, keys_of=keys_of)
        dev = raw["max_abs_logprob_diff"]
        under_wire = compare_passes(ref, cand, wire_atol, cand_pass=cand_pass, keys_of=keys_of)
        # A wire within the bf16 tolerance makes the strict claim: its sensitivity and its
        # negative control are judged there; otherwise under the wider wire tolerance.
        neg_atol = atol if equivalent else wire_atol
        extra["wire"] = {
            "dtype": (cand.get("config", {}).get("engine_extra") or {}).get("dcp_wire_dtype"),
            "max_abs_logprob_diff": dev,
            "ratio_to_noise_floor": (dev / floor) if dev is not None and floor > 0 else None,
            "within_bf16_tolerance": equivalent,
            "tolerance": {"atol_logprob": wire_atol, "rule": WIRE_TOLERANCE_RULE},
            "equivalent_under_wire_tolerance": under_wire["equivalent"],
            "sensitivity_over_wire_tolerance": _over(sens, wire_atol),
            "judged_at": "bf16 tolerance" if equivalent else "wire tolerance",
        }
    if kind in ("spec", "accept"):
        ref_done = finished_passes(ref)
        exact = tokens_exact(ref_done.get("clean"), cand_served)
    if kind == "spec":
        self_exact = None
        if ref_done.get("repeat") and ref_done.get("clean"):
            self_exact = tokens_exact(ref_done["clean"], ref_done["repeat"])["all_exact"]
        extra["spec"] = {
            "tokens_exact": exact,
            "logprobs_within_tolerance": cmp["equivalent"],
            "reference_repeat_tokens_exact": self_exact,
            "speculative_config": (cand.get("config", {}).get("engine_extra") or {}).get(
                "speculative_config"
            ),
            "acceptance": cand.get("spec"),
            "note": "tokens must be exact; the reference's own repeat pass says whether the "
            "engine is token-exact run to run at all (None: not measured)",
        }
        equivalent = equivalent and exact["all_exact"]
    if kind == "accept":
        ref_acc, cand_acc = acceptance(ref), acceptance(cand)
        same = (
            ref_acc is not None
            and cand_acc is not None
            and ref_acc["draft_tokens"] > 0
            and (ref_acc["draft_tokens"], ref_acc["accepted_tokens"])
            == (cand_acc["draft_tokens"], cand_acc["accepted_tokens"])
        )
        extra["accept"] = {
            "reference": ref_acc,
            "candidate": cand_acc,
            "candidate_fault": acceptance(cand, "fault"),
            "acceptance_equal": same,
            "tokens_exact": exact,
            "meaningful_rule": (
                f"reference accepts >= {ACCEPT_MIN_ACCEPTED} draft tokens and the candidate's "
                f"fault pass accepts at most {ACCEPT_FAULT_SHARE:g} x the reference's rate"
            ),
            "speculative_config": (cand.get("config", {}).get("engine_extra") or {}).get(
                "speculative_config"
            ),
        }
        equivalent = equivalent and exact["all_exact"] and same
    neg = negative_control(ref, cand if control is None else control, neg_atol)
    neg["applies"] = NEGATIVE_CONTROL_NOTES[kind]
    neg["atol_logprob"] = neg_atol
    if control is not None:
        neg["control_run"] = control.get("name")
        differ = control_differs(cand, control)
        if differ:  # another engine's fault says nothing about this candidate
            neg["problems"] = [*neg.get("problems", []), differ]
            neg["detected"] = False
    if kind in ("dcp_pair", "wire") and (ref.get("ledger") or cand.get("ledger")):
        extra["ledger"] = {"reference": ledger_totals(ref), "candidate": ledger_totals(cand)}
    sufficient = bool(sens.get("sufficient"))
    if kind == "wire" and not equivalent:
        over = extra["wire"]["sensitivity_over_wire_tolerance"]
        sufficient = sufficient and over is not None and over >= SENSITIVITY_MARGIN
    if kind == "accept":  # acceptance must hinge on the draft's DCP attention
        ref_acc = extra["accept"]["reference"] or {}
        fault_acc = extra["accept"]["candidate_fault"] or {}
        rate, fault_rate = ref_acc.get("rate"), fault_acc.get("rate")
        sufficient = (
            sufficient
            and ref_acc.get("accepted_tokens", 0) >= ACCEPT_MIN_ACCEPTED
            and rate is not None
            and fault_rate is not None
            and fault_rate <= ACCEPT_FAULT_SHARE * rate
        )
    cache = prefix_cache_report(cand, cand_pass)
    if cache and cand_pass != "clean" and not cache["prefix_cache"]["every_prompt_hit"]:
        # a prefix-cache gate whose candidate pass never hit the cache tests no cache hit
        sufficient = False
    return {
        **extra,
        "schema_version": SCHEMA_VERSION,
        "kind": GATE_KIND,
        "name": name,
        "base": cand.get("base"),
        "checkpoint": cand.get("checkpoint"),
        "dcp": {"reference": run_summary(ref), "candidate": run_summary(cand)},
        "backend": {
            "requested": cand.get("config", {}).get("backend"),
            "kv_cache_dtype": cand.get("config", {}).get("kv_cache_dtype"),
            "reference_used": used_backends(ref),
            "candidate_used": used_backends(cand),
            "reference_merge_seen": merges_seen(ref),
            "candidate_merge_seen": merges_seen(cand),
        },
        "tolerance": tol,
        "noise_floor": noise,
        "sensitivity": sens,
        "ref_pass": "clean",
        "cand_pass": cand_pass,
        "needle_retrieval": {
            "reference": needle_retrieval(ref),
            "candidate": needle_retrieval(cand),
            "note": NEEDLE_RETRIEVAL_NOTE,
        },
        **cache,
        "prompts": cmp["prompts"],
        "prompts_compared": sorted(cmp["prompts"]),
        # runs that did not complete (timed out, a rank died) whose finished passes were used
        "incomplete_runs": sorted(set(cmp["incomplete_runs"] + neg.get("incomplete_runs", []))),
        "problems": cmp["problems"],
        "max_abs_logprob_diff": cmp["max_abs_logprob_diff"],
        "equivalent": equivalent,
        "negative_control": neg,
        "negative_control_detected": neg["detected"],
        "meaningful": sufficient and neg["detected"],
        "timing_label": cand.get("transport"),
    }


def compares_note(kind: str, ref: dict[str, Any], cand: dict[str, Any]) -> str:
    """GATE_KIND_NOTES[kind], and for a DCP gate whose reference runs at another TP (a TP 1
    reference of a long prompt, the cheapest), what that adds to the comparison."""
    note = GATE_KIND_NOTES[kind]
    ref_tp, cand_tp = ((r.get("config") or {}).get("tp") for r in (ref, cand))
    if kind == "dcp" and ref_tp is not None and cand_tp is not None and ref_tp != cand_tp:
        note += (
            f"; here the reference runs at TP {ref_tp} and the candidate at TP {cand_tp}: the "
            "difference holds TP's reordering too, which the noise floor must include (a TP = "
            f"{cand_tp} DCP = 1 vs TP = {ref_tp} pair)"
        )
    return note


def expected_keys(run: dict[str, Any], pass_name: str = "clean") -> list[str]:
    """The prompt keys a run's configuration names for the clean pass, or for the repeat or
    fault pass (the two shortest singles and the batch: plan.pass_groups)."""
    if pass_name not in ("clean", "repeat", "fault"):
        raise ValueError(f"expected keys of pass {pass_name!r}; valid: clean, repeat, fault")
    c = run.get("config") or {}
    groups = plan.pass_keys(c.get("lens") or [], c.get("batch_lens") or [], pass_name)
    return [key for group in groups for key in group]


# What a control run's configuration may change from its candidate's: it runs the fault pass
# the candidate cannot (a prefix-cached run), under its own name.
CONTROL_MAY_DIFFER = ("name", "passes", "enable_prefix_caching", "warmup")


def control_differs(cand: dict[str, Any], control: dict[str, Any]) -> str | None:
    """Why ``control`` is not a control of ``cand`` (their configurations differ beyond
    CONTROL_MAY_DIFFER, or they ran different checkpoint bytes), or None."""
    a, b = (
        {k: v for k, v in (r.get("config") or {}).items() if k not in CONTROL_MAY_DIFFER}
        for r in (cand, control)
    )
    if not a or not b:
        return "the control or the candidate records no configuration"
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    if keys:
        return f"the control run's configuration differs from the candidate's in {keys}"
    return checkpoints_differ(cand, control)


def prefix_cache_report(run: dict[str, Any], pass_name: str) -> dict[str, Any]:
    """For a run with the prefix cache on, ``{"prefix_cache": ...}``: per prompt of the pass,
    the prompt tokens vLLM served from the cache (None: not recorded); else nothing."""
    if not (run.get("config") or {}).get("enable_prefix_caching"):
        return {}
    served = finished_passes(run).get(pass_name) or {}
    cached = {k: rec.get("num_cached_tokens") for k, rec in sorted(served.items())}
    return {
        "prefix_cache": {
            "pass": pass_name,
            "cached_tokens": cached,
            "every_prompt_hit": bool(cached) and all(bool(v) for v in cached.values()),
        }
    }


def _lighter(ref: dict[str, Any], cand: dict[str, Any]) -> bool:
    want, have = set(expected_keys(cand)), set(expected_keys(ref))
    return bool(want) and want < have


def _over(sens: dict[str, Any], atol: float) -> float | None:
    """The sensitivity figure ``sensitivity`` judges by, over another tolerance."""
    figure = sens.get("min_first_step_move_lower_bound")
    return None if figure is None else figure / atol


def merges_seen(run: dict[str, Any]) -> list[str] | None:
    """The DCP top-k merge backends any rank of a run called (None: not recorded, i.e. a
    run of DCP = 1 or a record written before the spy's result was collected)."""
    seen = [m for m in run.get("merge_backends_seen") or [] if m is not None]
    return sorted({b for m in seen for b in m}) if seen else None


def used_backends(run: dict[str, Any]) -> list[str]:
    """The distinct backend/impl/kv-cache dtype triples the run's attention layers used."""
    seen = set()
    for rank in run.get("attention_layers") or []:
        for layer in rank.get("layers", []):
            seen.add(f"{layer['backend']}/{layer['impl']}/{layer['kv_cache_dtype']}")
    return sorted(seen)


def run_summary(run: dict[str, Any]) -> dict[str, Any]:
    c = run.get("config", {})
    return {
        "name": run.get("name"),
        "variant": c.get("variant", "stock"),
        "base": run.get("base"),
        "backend": c.get("backend"),
        "kv_cache_dtype": c.get("kv_cache_dtype"),
        "engine_extra": c.get("engine_extra") or {},
        "file": run.get("file"),
        "ok": run.get("ok"),
        "complete": run.get("complete", run.get("ok")),
        "passes_complete": sorted(finished_passes(run)),
        "timed_out": run.get("timed_out"),
        "error": run.get("error"),
        "tp": c.get("tp"),
        "dcp": c.get("dcp"),
        "graphs": c.get("graphs"),
        "cudagraph_mode": run.get("cudagraph_mode"),
        "transport": run.get("transport"),
        "engine_start_s": run.get("engine_start_s"),
        "command": run.get("command"),
        "revision": run.get("revision"),
        "machine": run.get("machine"),
    }


def validate(result: dict[str, Any]) -> list[str]:
    """Schema problems of a gate comparison file (empty when it is well formed)."""
    errors = [f"missing {k!r}" for k in REQUIRED_KEYS if k not in result]
    if result.get("kind") != GATE_KIND:
        errors.append(f"kind must be {GATE_KIND!r}")
    dcp = result.get("dcp") or {}
    for side in ("reference", "candidate"):
        if side not in dcp:
            errors.append(f"dcp lacks {side!r}")
    tol = result.get("tolerance") or {}
    if not isinstance(tol.get("atol_logprob"), (int, float)):
        errors.append("tolerance.atol_logprob must be a number")
    if not isinstance(result.get("equivalent"), bool):
        errors.append("equivalent must be a bool")
    if not isinstance(result.get("negative_control_detected"), bool):
        errors.append("negative_control_detected must be a bool")
    if "cand_pass" in result and result["cand_pass"] not in GATE_CAND_PASSES:
        errors.append(f"cand_pass must be one of {', '.join(GATE_CAND_PASSES)}")
    if "needle_retrieval" in result:
        errors += _needle_retrieval_problems(result["needle_retrieval"])
    return errors


def _needle_retrieval_problems(report: Any) -> list[str]:
    """Schema problems of a gate file's ``needle_retrieval`` (written by gate_result)."""
    if not isinstance(report, dict) or not {"reference", "candidate"} <= set(report):
        return ["needle_retrieval must hold 'reference' and 'candidate'"]
    errors = []
    for side in ("reference", "candidate"):
        got = report[side]
        if got is None:  # a checkpoint without an answer token
            continue
        if not isinstance(got, dict) or isinstance(got.get("answer_id"), bool):
            errors.append(f"needle_retrieval.{side} must be null or a report")
            continue
        if not isinstance(got.get("answer_id"), int):
            errors.append(f"needle_retrieval.{side}.answer_id must be an int")
        for pass_name, flag in (("clean", "needle_retrieved"), ("sensitivity", "answer_absent")):
            rows = got.get(pass_name)
            if not isinstance(rows, dict) or not all(
                isinstance(r, dict) and isinstance(r.get(flag), bool) for r in rows.values()
            ):
                errors.append(f"needle_retrieval.{side}.{pass_name} rows need a bool {flag!r}")
        if not isinstance(got.get("all_retrieved"), bool):
            errors.append(f"needle_retrieval.{side}.all_retrieved must be a bool")
    return errors


DISTANCE_KIND = "dcp_gate_distance"
DISTANCE_NOTE = (
    "a measured distance, not a gate: two runs that need not agree within the noise (e.g. the "
    "same checkpoint on two KV-cache formats), compared as the gates compare (shared-context "
    "steps, ids in both top-k lists) with no tolerance; the noise floor, the tolerance and the "
    "sensitivity of its noise group are given for scale, and nothing here passes or fails"
)
DISTANCE_REQUIRED_KEYS = (
    "name",
    "runs",
    "backend",
    "prompts",
    "max_abs_logprob_diff",
    "max_first_step_abs_logprob_diff",
    "tokens_exact",
    "scale",
    "note",
)


def distance_result(
    name: str,
    ref: dict[str, Any],
    cand: dict[str, Any],
    tol: dict[str, Any],
    noise: dict[str, Any],
    sens: dict[str, Any],
) -> dict[str, Any]:
    """How far the candidate's clean pass lies from the reference's, stated and never judged
    (DISTANCE_NOTE): per prompt the largest |delta log-prob| over the steps that share their
    context, the first step's, where the greedy tokens first differ; and that distance over the
    noise floor, the tolerance (``within_tolerance``: a fact, not a verdict) and the
    sensitivity (how far removing the needle moves the first step)."""
    cmp = compare_passes(ref, cand, math.inf, keys_of="ref")
    prompts = {}
    for key, row in cmp["prompts"].items():
        prompts[key] = {
            k: row[k]
            for k in (
                "prompt_len",
                "tokens_ref",
                "tokens_cand",
                "first_token_difference",
                "compared_steps",
                "min_common_top_ids",
                "first_step_max_abs_logprob_diff",
                "max_abs_logprob_diff",
                "largest_difference",
            )
            if k in row
        }
        # with no tolerance only these remain: other token counts, NaN, disjoint top-k lists
        prompts[key]["notes"] = row.get("reasons", [])
    firsts = [
        p["first_step_max_abs_logprob_diff"]
        for p in prompts.values()
        if p.get("first_step_max_abs_logprob_diff") is not None
    ]
    dist = cmp["max_abs_logprob_diff"]
    floor, atol = tol["noise_floor"], tol["atol_logprob"]
    figure = sens.get("min_first_step_move_lower_bound")
    done = finished_passes(ref)
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": DISTANCE_KIND,
        "name": name,
        "note": DISTANCE_NOTE,
        "base": cand.get("base"),
        "checkpoint": cand.get("checkpoint"),
        "runs": {"reference": run_summary(ref), "candidate": run_summary(cand)},
        "backend": {
            "reference_kv_cache_dtype": ref.get("config", {}).get("kv_cache_dtype"),
            "candidate_kv_cache_dtype": cand.get("config", {}).get("kv_cache_dtype"),
            "reference_used": used_backends(ref),
            "candidate_used": used_backends(cand),
        },
        "ref_pass": "clean",
        "cand_pass": "clean",
        "prompts": prompts,
        "problems": cmp["problems"],
        "incomplete_runs": cmp["incomplete_runs"],
        "max_abs_logprob_diff": dist,
        "max_first_step_abs_logprob_diff": max(firsts) if firsts else None,
        "tokens_exact": tokens_exact(done.get("clean"), finished_passes(cand).get("clean")),
        "scale": {
            "noise_floor": noise,
            "tolerance": tol,
            "sensitivity": sens,
            "ratio_to_noise_floor": dist / floor if dist is not None and floor > 0 else None,
            "ratio_to_tolerance": dist / atol if dist is not None and atol > 0 else None,
            "within_tolerance": None if dist is None else _within_tolerance(ref, cand, atol),
            "ratio_to_sensitivity": dist / figure if dist is not None and figure else None,
        },
        "needle_retrieval": {
            "reference": needle_retrieval(ref),
            "candidate": needle_retrieval(cand),
            "note": NEEDLE_RETRIEVAL_NOTE,
        },
        "timing_label": cand.get("transport"),
    }


def _within_tolerance(ref: dict[str, Any], cand: dict[str, Any], atol: float) -> bool:
    """Whether the candidate's clean pass would pass the gates' comparison at ``atol``."""
    return bool(compare_passes(ref, cand, atol)["equivalent"])


def validate_distance(result: dict[str, Any]) -> list[str]:
    """Schema problems of a distance file (distance_result); it carries no verdict."""
    errors = [f"missing {k!r}" for k in DISTANCE_REQUIRED_KEYS if k not in result]
    if result.get("kind") != DISTANCE_KIND:
        errors.append(f"kind must be {DISTANCE_KIND!r}")
    verdicts = sorted({"equivalent", "meaningful", "negative_control_detected"} & set(result))
    if verdicts:
        errors.append(f"a distance is not a gate: no {', '.join(verdicts)}")
    dist = result.get("max_abs_logprob_diff")
    if dist is not None and not isinstance(dist, (int, float)):
        errors.append("max_abs_logprob_diff must be a number or null")
    runs = result.get("runs") or {}
    for side in ("reference", "candidate"):
        if side not in runs:
            errors.append(f"runs lacks {side!r}")
    return errors


EMULATION_RATES_LABEL = (
    "one-GPU emulation (socket transport): every rank of every run shares one GPU and the "
    "host's cores, and DCP's collectives go through NCCL's socket transport; these decode "
    "rates are neither fabric figures nor a ranking of kernels or merges"
)


def decode_rates(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per finished run, the clean pass's decode tok/s per request (vLLM's request metrics,
    as the worker recorded them) and the rank processes of all runs that were alive while
    it ran (mean and largest, from each run's start and wall time): how crowded the GPU was.
    """
    spans = [
        (r["started_at"], r["started_at"] + r["wall_s"], (r.get("config") or {}).get("tp", 1))
        for r in runs.values()
        if r.get("started_at") is not None and r.get("wall_s") is not None
    ]
    rows = []
    for name, run in sorted(runs.items()):
        clean = (run.get("passes") or {}).get("clean") or {}
        rates = {
            k: v["timing"]["decode_tok_per_s"]
            for k, v in clean.items()
            if (v.get("timing") or {}).get("decode_tok_per_s") is not None
        }
        if not rates or run.get("started_at") is None:
            continue
        t0, t1 = run["started_at"], run["started_at"] + run["wall_s"]
        # ranks alive at 1 s steps over the run's life
        alive = [
            sum(n for a, b, n in spans if a <= t < b) for t in range(int(t0), int(t1) + 1)
        ] or [0]
        c = run.get("config") or {}
        rows.append(
            {
                "run": name,
                "variant": c.get("variant", "stock"),
                "backend": c.get("backend"),
                "kv_cache_dtype": c.get("kv_cache_dtype"),
                "tp": c.get("tp"),
                "dcp": c.get("dcp"),
                "graphs": c.get("graphs"),
                "engine_extra": c.get("engine_extra") or {},
                "decode_tok_per_s": rates,
                "single_request_median": _median(
                    [v for k, v in rates.items() if k.startswith("single/")]
                ),  # None when the run had no single requests
                "ranks_alive_mean": round(sum(alive) / len(alive), 1),
                "ranks_alive_max": max(alive),
            }
        )
    return {"label": EMULATION_RATES_LABEL, "rows": rows}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None
