# SPDX-License-Identifier: Apache-2.0
"""Generate design/results.md, README.md's status table and results/README.md from the JSON
files under results/.

Docs never carry hand-typed figures: this script renders every table from the files the GPU and
tool scripts wrote (each holding its command, revision and machine). results/README.md has one
line per file saying what it shows (by its ``kind``, else by ``NAME_LINES``, else its ``what``),
where it ran and its revision. Run after adding results:

    python evidence/results_tables.py            # writes the three
    python evidence/results_tables.py --check    # exit 1 if one is out of date or a file
                                                 # under results/ says nothing of what it shows
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "evidence"))
from gate.verdict import acceptance  # noqa: E402  (the spec-decode counters, read once)
from mtp_depth_report import MODES as MTP_MODES  # noqa: E402  (the depth bench's modes)

RESULTS = REPO / "results"
OUT = REPO / "design" / "results.md"


def load(pattern: str) -> list[tuple[str, dict[str, Any]]]:
    """Every results/<pattern> file, sorted by name, as (file name, parsed JSON)."""
    return [(p.name, json.loads(p.read_text())) for p in sorted(RESULTS.glob(pattern))]


def table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _sensitivity_figure(s: dict) -> float | None:
    """The sensitivity figure of one run: the lower bound (files since 2026-12-01 20Z), else
    the common-ids figure the earlier files carry."""
    if "min_first_step_move_lower_bound" in s:
        return s["min_first_step_move_lower_bound"]
    return s.get("min_first_step_max_abs_logprob_diff")


def card(d: dict[str, Any]) -> str:
    """The GPU a run record names (``machine.gpus[0].name`` without the vendor), else "?"."""
    gpus = (d.get("machine") or {}).get("gpus") or [{}]
    first = gpus[0] if isinstance(gpus[0], dict) else {"name": gpus[0]}  # early records: names
    return str(first.get("name") or "?").removeprefix("NVIDIA ")


PATH_PLACEHOLDERS = {
    "--out": "<out>",
    "--dest": "<out>",
    "--work": "<work>",
    "--tree": "<tree>",
    "--vllm-tree": "<tree>",
}
"""What an option's absolute path is shown as (any other option's: ``<path>``)."""
REPO_FOLDERS = ("evidence", "scripts", "proofs", "tools", "tests", "results")
"""A repository file a command names is shown from its top folder (``evidence/x.py``)."""


def shown_command(command: str) -> str:
    """A recorded command as the tables show it, without the folders of the machine it ran on
    (the record in results/ keeps them): an interpreter by its name (``python3``), a file of
    this repository from its top folder (``evidence/...``), a file of a vLLM tree from
    ``<tree>/vllm/...``, any other absolute path as its option's placeholder (``<out>``,
    ``<work>``, ``<tree>``, else ``<path>``), followed by the file's name when it has a suffix.
    """
    try:
        args = shlex.split(command)
    except ValueError:
        return command
    shown: list[str] = []
    for i, arg in enumerate(args):
        option, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        if not value.startswith("/"):
            shown.append(shlex.quote(arg))
            continue
        path = PurePosixPath(value)
        parts = path.parts
        top = next((j for j, part in enumerate(parts) if part in (*REPO_FOLDERS, "vllm")), None)
        if i == 0 and path.name.startswith("python"):
            rendered = path.name
        elif top is not None and parts[top] == "vllm":
            rendered = "/".join(("<tree>", *parts[top:]))
        elif top is not None:
            rendered = "/".join(parts[top:])
        else:
            flag = option or (args[i - 1] if i > 0 else "")
            rendered = PATH_PLACEHOLDERS.get(flag, "<path>")
            if path.suffix:
                rendered += f"/{path.name}"
        shown.append(f"{option}{eq}{rendered}")
    return " ".join(shown)


def fmt(x: float | None, digits: int = 3) -> str:
    """A figure for a table: whole numbers from 100 up, else ``digits`` significant digits."""
    if x is None:
        return "-"
    if not isinstance(x, float):
        return str(x)
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"


def ratio(x: float | None) -> str:
    """A ratio for a table: two decimals."""
    return "-" if x is None else f"{x:.2f}"


def revision(d: dict[str, Any]) -> str:
    rev = d.get("launched_at_revision") or d.get("git_revision") or d.get("revision")
    if isinstance(rev, dict):
        rev = rev.get("head") or rev.get("series") or rev.get("overlay_manifest_sha256")
    return str(rev)[:12] if rev else "unknown"


def base_of(d: dict[str, Any]) -> str:
    """The vLLM base a result was measured on: ``base`` (a string or a dict with ``vllm``),
    else the machine's recorded vLLM version."""
    b = d.get("base")
    if isinstance(b, dict):
        b = b.get("vllm")
    if isinstance(b, str) and b:
        return b if b.startswith("vllm") else f"vllm {b}"
    v = (d.get("machine") or {}).get("vllm")
    return f"vllm {v}" if v else "unknown base"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _splits(topk: int, block_n: int, num_splits: int) -> int:
    """The split count a launch really uses: whole BLOCK_N tiles per split, no empty split."""
    split_len = _cdiv(_cdiv(max(topk, 1), num_splits), block_n) * block_n
    return max(1, _cdiv(topk, split_len))


def policy_num_splits(
    policy: str, programs: int, topk: int, block_h: int, block_n: int, num_sms: int
) -> int:
    """The split count of ``policy`` ("fill" or "occupancy") for one launch, as the kernel's
    ``_fill_num_splits`` / ``_occupancy_num_splits`` (patch 0002) compute it."""
    if policy == "fill":
        target = 2 * num_sms
        want = 1 if programs >= target else min(_cdiv(topk, block_n), _cdiv(target, programs))
    else:
        target = num_sms * (2 if block_h <= 16 else 1)
        if programs >= target:
            want = 1
        else:
            want = min(max(1, topk // (2 * block_n)), _cdiv(target, programs))
            want = 1 << (max(want, 1).bit_length() - 1)
    return _splits(topk, block_n, max(1, want))


# The automatic plan of patch 0002 on a paged cache (large-shared-memory GPUs): rows x
# head-blocks <= 4: the half tile (BLOCK_H, 64, 8, 2) and "fill" splits; <= 8: the default tiling
# and "fill"; else the default tiling and "occupancy". Always the base variant (no flat records,
# no prefetch).
AUTO_FEW_PROGRAMS = 4
AUTO_FILL_PROGRAMS = 8


def auto_rule(e: dict[str, Any], num_sms: int) -> tuple[str, dict[str, Any] | None]:
    """The "auto" launch of one bench row and the sweep point that timed that launch (None
    when the sweep did not time it)."""
    plan = e["default_plan"]
    block_h = plan["block_h"]
    rows = e.get("batch", e.get("rows"))
    programs = rows * _cdiv(e["heads"], block_h)
    tiling = [block_h, plan["block_n"], plan["num_warps"], plan["num_stages"]]
    if programs <= AUTO_FEW_PROGRAMS:
        tiling = [block_h, 64, 8, 2]
    policy = "fill" if programs <= AUTO_FILL_PROGRAMS else "occupancy"
    splits = policy_num_splits(policy, programs, e["topk"], block_h, tiling[1], num_sms)
    rule = f"({', '.join(map(str, tiling))}) {policy} ×{splits}"
    same = [
        p
        for p in e.get("points", [])
        if p["variant"] == "base" and p["tiling"] == tiling and p["num_splits"] == splits
    ]
    same.sort(key=lambda p: p["splits_arg"] != policy)  # the point recorded under its name first
    return rule, (same[0] if same else None)


def _rule_label(rule: str | None) -> str | None:
    """A ``plan_choice`` rule as the bench now names it: runs before patch 0002's split rules
    became private named them ``split_policy=<rule>``."""
    return None if rule is None else re.sub(r"split_policy=(\w+)", r"\1 splits", rule)


def _point_rule(p: dict[str, Any]) -> str:
    return (
        f"{p['variant']} ({', '.join(map(str, p['tiling']))}) {p['splits_arg']} ×{p['num_splits']}"
    )


def kernel_table(name: str, d: dict[str, Any]) -> list[str]:
    """Schema 2 of evidence/bench_sparse_mla_kernel.py: default launch, "auto" rule and best
    sweep point per row, CUDA-graph replayed; eager beside it."""
    sms = d["machine"]["sms"]
    out = [f"### Triton sparse-MLA vs FlashMLA-sparse (fp8_ds_mla), {base_of(d)}, `{name}`", ""]
    out += [
        f"Machine {d['machine']['gpu']} ({sms} SMs), torch {d['machine']['torch']}, Triton "
        f"{d['machine']['triton']}, revision {revision(d)}, kernel sha256 "
        f"{d['kernel_sha256'][:12]}; command `{shown_command(d['command'])}`.",
        f"Timing: {d['timing']}.",
        "Ratio = FlashMLA time / Triton time (> 1: Triton faster), both CUDA-graph replayed;",
        "eager ratio = the same with both launched eagerly. Default = the kernel file's default",
        "launch in that run. Auto = the sweep point of the automatic paged-cache launch (base",
        f"variant; rows x head-blocks <= {AUTO_FEW_PROGRAMS}: (BLOCK_H, 64, 8, 2) fill; <= "
        f"{AUTO_FILL_PROGRAMS}: default tiling fill; else default tiling occupancy). Best = the",
        "fastest sweep point: variant (BLOCK_H, BLOCK_N, warps, stages) split rule ×splits.",
        "% HBM = record bytes read / time / 4.8 TB/s.",
        "",
    ]
    rows = []
    for e in d["decode"] + d["extend"]:
        rule, auto = auto_rule(e, sms)
        best = e["triton_best"]
        acc = (e.get("accuracy") or {}).get("base") or {}
        rows.append(
            [
                e["kind"],
                e.get("batch", e.get("rows")),
                e["heads"],
                e["topk"],
                fmt(e["flashmla_graph_us"]),
                fmt(e["triton_default_graph_us"]),
                ratio(e["speed_over_flashmla"]),
                rule,
                fmt(auto["graph_us"]) if auto else "not timed",
                ratio(auto["speed_over_flashmla"]) if auto else "-",
                ratio(e["speed_over_flashmla_best"]),
                _point_rule(best),
                ratio(e["speed_over_flashmla_eager"]),
                f"{fmt(e['triton_default_eager_us'])} / {fmt(e['flashmla_eager_us'])}",
                f"{fmt(e['triton_default_pct_hbm'], 2)} / {fmt(e['flashmla_pct_hbm'], 2)}",
                f"{fmt(acc.get('maxdiff_out_vs_flashmla'), 2)} / "
                f"{fmt(acc.get('maxdiff_lse_vs_flashmla'), 2)}",
            ]
        )
    out += table(
        [
            "kind",
            "batch/rows",
            "heads",
            "top-k",
            "FlashMLA graph µs",
            "Triton default graph µs",
            "default ratio",
            "auto launch",
            "auto graph µs",
            "auto ratio",
            "best ratio",
            "best point",
            "eager ratio",
            "eager µs Triton / FlashMLA",
            "% HBM Triton default / FlashMLA",
            "max abs Δout / Δlse vs FlashMLA",
        ],
        rows,
    )
    choice = d.get("plan_choice") or {}
    ranked = choice.get("global_ranked") or []
    if ranked:
        out += [
            f"Single rules over all decode rows (the bench's `plan_choice`, accuracy gate "
            f"{json.dumps(choice.get('accuracy_gate'), sort_keys=True)}; recommended: "
            f"`{_rule_label(choice.get('recommended'))}`; best per row at worst "
            f"{ratio(choice.get('oracle_min_speed_over_flashmla'))} in its slowest "
            "heads group):",
            "",
        ]
        out += table(
            ["rule", "rows", "geomean ratio", "min ratio", "accurate"],
            [
                [
                    _rule_label(r["rule"]),
                    r["rows"],
                    ratio(r["geomean_speed_over_flashmla"]),
                    ratio(r["min_speed_over_flashmla"]),
                    r["accurate"],
                ]
                for r in ranked
            ],
        )
    return out


def kernel_section() -> list[str]:
    out: list[str] = []
    for name, d in load("kernel-bench-*.json"):
        out += kernel_table(name, d)
    return out


def _side(s: dict[str, Any]) -> str:
    mode = "graphs" if s.get("graphs") else "eager"
    extra = s.get("engine_extra") or {}
    tags = [f"{k}={v}" for k, v in sorted(extra.items()) if k != "speculative_config"]
    spec = extra.get("speculative_config")
    if spec:
        depth = spec.get("adaptive_speculative_tokens_ladder") or spec.get("num_speculative_tokens")
        tags.append(f"mtp {depth}")
    if s.get("variant") == "patched":  # files before per-run variants render as they did
        tags.insert(0, "patched")
    return (
        f"TP={s.get('tp')} DCP={s.get('dcp')} {mode}"
        + "".join(f", {t}" for t in tags)
        + ("" if s.get("ok") else " (failed)")
    )


def _problems(d: dict[str, Any], width: int = 90) -> str:
    """Why a gate has no verdict (a run cut by the deadline, a failed rank): its first
    recorded problem, shortened, and how many more there are; '-' when none."""
    problems = [str(p) for p in d.get("problems") or []]
    if not problems:
        return "-"
    first = problems[0].replace("|", "/")
    first = first if len(first) <= width else first[: width - 1] + "…"
    return first + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")


def dcp_gate_section() -> list[str]:
    """The DCP gates (evidence/dcp_gate.py): noise floor, tolerance and sensitivity per
    checkpoint, then one row per gate (DCP > 1 against DCP = 1 at the same TP)."""
    out: list[str] = []
    noise = load("dcp-gate-noise-*.json")
    if noise:
        out += [
            "### DCP gates: noise floor, tolerance, sensitivity",
            "",
            "Noise pairs are legitimate reorderings (TP=2 DCP=1 vs TP=1; identical runs): the",
            "largest |Δ log-prob| over shared-context steps and common top-20 ids. Sensitivity:",
            "one prompt token changed at position 5, smallest move of the first generated step",
            "over the single prompts (×tol = that move / the tolerance).",
            "",
        ]
        rows = []
        for name, d in noise:
            pairs = "; ".join(
                f"{k.split(': ', 1)[-1]} {fmt(v['max_abs_logprob_diff'], 2)}"
                for k, v in sorted(d["noise_pairs"].items())
            )
            sens = "; ".join(
                f"{run}: {fmt(_sensitivity_figure(s), 3)} (×tol {fmt(s.get('over_tolerance'), 3)})"
                for run, s in sorted(d["sensitivity"].items())
            )
            t = d["tolerance"]
            made = {
                json.dumps(c.get("gains"), sort_keys=True)
                for c in (d.get("checkpoints") or {}).values()
                if c and c.get("gains")
            }
            rows.append(
                [
                    d["checkpoint"] + "".join(f" gains {m}" for m in sorted(made)),
                    pairs,
                    fmt(t["noise_floor"], 2),
                    fmt(t["atol_logprob"], 2),
                    sens or "not measured",
                    f"`{name}`",
                ]
            )
        out += table(
            ["checkpoint", "noise pairs", "noise floor", "tolerance", "sensitivity", "file"], rows
        )
    for name, d in load("dcp-gate-ckpt-check*.json"):
        out += [
            f"### DCP gate checkpoints at layer 0 (CPU, fp32, no rope/fp8), `{name}`",
            "",
            "Key 0 is the needle (or, without one, an ordinary token): its rank in the indexer",
            "scores of 128 random queries over 4096 keys, and its MLA attention weight among",
            "index_topk keys (mean / min over heads and queries).",
            "",
        ]
        rows = []
        for ck, r in sorted(d["checkpoints"].items()):
            c = r["layer0_check"]
            rank = c.get("indexer_rank_of_key0") or {}
            att = c["attention_weight_of_key0"]
            rows.append(
                [
                    ck,
                    json.dumps(r["gains"], sort_keys=True),
                    (r.get("needle") or {}).get("needle_id", "-"),
                    f"{rank.get('median', '-')} / {rank.get('max', '-')}",
                    fmt(rank.get("in_topk_fraction"), 3),
                    f"{fmt(att['mean'], 3)} / {fmt(att['min'], 3)}",
                    fmt(att["uniform_would_be"], 3),
                ]
            )
        out += table(
            [
                "checkpoint",
                "gains",
                "needle",
                "indexer rank median / max",
                "in top-k",
                "attention weight mean / min",
                "uniform",
            ],
            rows,
        )
    refs = load("dcp-gate-ckpt-reference-*.json")
    if refs:
        out += [
            "### DCP gate checkpoints through the CPU forward (predictions, not GPU runs)",
            "",
            "`evidence/gate_ckpt_reference.py` (fp32, no fp8, simplified RoPE): the gate's prompts",
            "and its sensitivity perturbation; the bound is the gate's sensitivity measure, the",
            "tolerance 4 x the bf16 ULP of the largest top-k logit.",
            "",
        ]
        rows = []
        for name, d in refs:
            knobs = [a for a in d["checkpoint_args"] if "=" in a]
            per = d["per_prompt"]
            rows.append(
                [
                    f"`{name}`",
                    d["checkpoint_args"][1] + (" " + " ".join(knobs) if knobs else ""),
                    "; ".join(
                        f"{k.split('/')[1].split('~')[0]}: "
                        f"{fmt(v['first_step_move_lower_bound'], 3)}"
                        f" (logit {fmt(v['max_top_logit'], 3)})"
                        for k, v in per.items()
                    ),
                    fmt(d["predicted_tolerance"], 3),
                    fmt(d["predicted_over_tolerance"], 3),
                    revision(d),
                ]
            )
        out += table(
            [
                "file",
                "checkpoint",
                "bound per prompt (largest top-k logit)",
                "tolerance",
                "×tol",
                "revision",
            ],
            rows,
        )
    gates = load("dcp-gate-*.json")
    rows = []
    for name, d in gates:
        if d.get("kind") != "dcp_gate":
            continue
        prompts = d.get("prompts", {})
        same = sum(1 for p in prompts.values() if p.get("first_token_difference") is None)
        neg = d.get("negative_control", {})
        kind = d.get("gate_kind", "dcp")
        if kind == "wire":
            w = d.get("wire") or {}
            kind += (
                f" (×floor {fmt(w.get('ratio_to_noise_floor'), 2)}, wire atol "
                f"{fmt((w.get('tolerance') or {}).get('atol_logprob'), 2)}: "
                f"{w.get('equivalent_under_wire_tolerance')})"
            )
        if kind == "spec":
            ran = d["dcp"]["candidate"].get("ok") and d["dcp"]["reference"].get("ok")
            exact = d["spec"]["tokens_exact"]["all_exact"] if ran else "not run"
            # the gate file keeps the speculative run's per-pass counters under spec.acceptance
            taken = acceptance({"spec": d["spec"].get("acceptance")})
            kind += f" (tokens exact: {exact}" + (
                f", accepted {_accepted(taken)})" if taken else ")"
            )
        if kind == "accept":
            acc = d["accept"]
            kind += (
                f" (accepted {_accepted(acc['candidate'])} vs {_accepted(acc['reference'])} at "
                f"DCP=1, tokens exact: {acc['tokens_exact']['all_exact']})"
            )
        rows.append(
            [
                f"`{name}`" + ("" if kind == "dcp" else f" [{kind}]"),
                _side(d["dcp"]["reference"]),
                _side(d["dcp"]["candidate"]),
                ", ".join(d["backend"].get("candidate_used") or ["?"]),
                f"{same}/{len(prompts)}",
                fmt(d.get("max_abs_logprob_diff"), 2),
                fmt(d["tolerance"]["atol_logprob"], 2),
                d["equivalent"],
                f"{d['negative_control_detected']} ({fmt(neg.get('max_abs_logprob_diff'), 2)})",
                fmt(d.get("sensitivity", {}).get("over_tolerance"), 2),
                d.get("meaningful"),
                card(d),
                revision(d),
                _problems(d),
            ]
        )
    if rows:
        label = next((d.get("timing_label") for _, d in gates if d.get("timing_label")), "")
        out += [
            "### DCP gates: DCP > 1 against DCP = 1",
            "",
            f"Ranks: {label}. Prompts: 1k/8k/32k singles and one batch of 4 requests of",
            "different lengths, 32 greedy tokens, top-20 log-probs per step. Negative control:",
            "one DCP rank's partial dropped from the LSE merge (its max |Δ log-prob| in brackets).",
            "meaningful = sensitivity >= 5x the tolerance and the negative control detected; a",
            "gate that is not meaningful proves nothing either way.",
            "",
        ]
        out += table(
            [
                "file",
                "reference",
                "candidate",
                "backend/impl/kv used",
                "tokens equal",
                "max abs Δlogprob",
                "atol",
                "equivalent",
                "negative control detected",
                "sensitivity ×tol",
                "meaningful",
                "card",
                "revision",
                "problems",
            ],
            rows,
        )
    for name, d in gates:
        if d.get("kind") == "dcp_gate_decode_rates":
            out += decode_rates_table(name, d)
    return out


def _accepted(counts: dict[str, Any] | None) -> str:
    """verdict.acceptance's counts as accepted/drafted."""
    return f"{counts['accepted_tokens']}/{counts['draft_tokens']}" if counts else "-"


def decode_rates_table(name: str, d: dict[str, Any]) -> list[str]:
    """dcp_gate.py decode-rates: the gate runs' decode tok/s and how crowded the GPU was."""
    out = [
        f"### Decode rates of the gate runs, `{name}`",
        "",
        f"{d['label']}. Runs of revision {', '.join(d.get('runs_revision', []))}, base "
        f"{', '.join(d.get('base', []))}; command `{shown_command(d['command'])}`.",
        "",
    ]
    rows = [
        [
            r["run"],
            r["variant"],
            r["backend"],
            f"TP={r['tp']} DCP={r['dcp']}" + (" graphs" if r.get("graphs") else ""),
            ", ".join(f"{k}={v}" for k, v in (r.get("engine_extra") or {}).items()) or "-",
            fmt(r["single_request_median"]),
            f"{r['ranks_alive_mean']} / {r['ranks_alive_max']}",
        ]
        for r in d["rows"]
    ]
    return out + table(
        [
            "run",
            "tree",
            "backend",
            "parallel",
            "extra",
            "decode tok/s (median of single requests)",
            "ranks alive mean / max",
        ],
        rows,
    )


MERGE_GRIDS = {
    "decode": "decode grid (random scores, 1-64 rows)",
    "old36": "the 36-case grid of the 0.26.0 check (random / ties / short rows, 64 and 2048 rows)",
}


MERGE_EXTRA = {
    "triton_range": "Triton range first pass",
    "triton_rank": "Triton range + rank",
    "triton_radix4": "Triton radix-4",
    "triton_radix11": "Triton radix-11",
    "triton_bisect": "Triton bisect",
}


def merge_table(name: str, d: dict[str, Any]) -> list[str]:
    """Schema 2 of evidence/bench_dcp_topk.py: the exact DCP top-k merge, Triton and torch
    against CuTe DSL, per grid."""
    s = d["summary"]
    m = d["machine"]
    out = [
        f"### DCP global top-k merge: Triton and torch vs CuTe DSL, {base_of(d)}, `{name}`",
        "",
        f"Machine {m['gpu']}, torch {m['torch']}, Triton {m['triton']}, nvidia-cutlass-dsl "
        f"{m.get('nvidia-cutlass-dsl', '?')}; revision {revision(d)}; "
        f"command `{shown_command(d['command'])}`.",
        f"Cases {s['cases_identical']}/{s['cases']} identical (same selected set and bit-identical"
        " packs as CuTe DSL). × = the implementation's merge time / CuTe DSL's (< 1: faster),",
        "CUDA-graph replayed unless marked eager. Largest × at decode shapes: Triton "
        f"{ratio(s['decode_max_time_over_cutedsl']['triton'])}, torch "
        f"{ratio(s['decode_max_time_over_cutedsl']['torch'])}; over all cases: Triton "
        f"{ratio(s['max_time_over_cutedsl']['triton'])}, torch "
        f"{ratio(s['max_time_over_cutedsl']['torch'])}.",
        "",
    ]
    # the Triton selector variants a run timed beside its default (radix 8); they left the
    # patch after the 09:59Z run, but the runs that timed them keep their columns
    extra = [v for v in MERGE_EXTRA if v in d["cases"][0]["time_over_cutedsl"]]
    for grid in sorted({c["grid"] for c in d["cases"]}, key=lambda g: (g != "decode", g)):
        cases = [c for c in d["cases"] if c["grid"] == grid]
        out += [f"{MERGE_GRIDS.get(grid, grid)}:", ""]
        rows = [
            [
                c["topk"],
                c["dcp"],
                c["kind"],
                c["rows"],
                c["candidates_per_row"],
                fmt(c["timings"]["cutedsl"]["merge_graph_ms"] * 1e3),
                ratio(c["time_over_cutedsl"]["triton"]),
                *[ratio(c["time_over_cutedsl"][v]) for v in extra],
                ratio(c["time_over_cutedsl"]["torch"]),
                ratio(c["time_over_cutedsl_eager"]["triton"]),
                ratio(c["time_over_cutedsl_eager"]["torch"]),
                c["identical"] and c.get("packs_bit_identical", True),
            ]
            for c in cases
        ]
        out += table(
            [
                "top-k",
                "DCP",
                "inputs",
                "rows",
                "candidates/row",
                "CuTe DSL graph µs",
                "Triton ×",
                *[f"{MERGE_EXTRA[v]} ×" for v in extra],
                "torch ×",
                "Triton × eager",
                "torch × eager",
                "identical",
            ],
            rows,
        )
    return out


def cutedsl_compile_table(name: str, d: dict[str, Any]) -> list[str]:
    """evidence/cutedsl_merge_compile.py: vLLM 0.34.0's own CuTe DSL top-k selectors compiled
    per target offline (no GPU): compile facts, not timings."""
    rows = [
        [
            c["arch"],
            c.get("kernel", "-"),
            c.get("topk", "-"),
            c.get("dcp", "-"),
            c.get("score_bits", "pdl" if c.get("pdl") else "-"),
            "yes" if c["ok"] else f"NO: {c.get('error', '')[:80]}",
            c.get("ptx_target") or "-",
            ", ".join(c.get("cubin_targets") or []) or "-",
            "/".join(str(r) for r in c.get("registers") or []) or "-",
            "/".join(str(b) for b in c.get("local_bytes") or []) or "-",
        ]
        for c in d["cases"]
    ]
    compiled = [arch for arch, ok in d["compiled_by_arch"].items() if ok]
    head = [
        f"### `{name}`: vLLM's CuTe DSL DCP top-k merge compiled offline, nvidia-cutlass-dsl "
        f"{d['nvidia_cutlass_dsl']} (compiled for {', '.join(compiled)}; no GPU, nothing "
        f"launched); revision {revision(d)}",
        "",
    ]
    return head + table(
        [
            "target",
            "kernel",
            "top-k",
            "DCP",
            "score bits",
            "compiled",
            "PTX target",
            "SASS",
            "registers",
            "spill bytes",
        ],
        rows,
    )


def topk_section() -> list[str]:
    out: list[str] = []
    for name, d in load("dcp-topk-*.json"):
        if d.get("kind") == "dcp_topk_merge_cutedsl_compile":
            out += cutedsl_compile_table(name, d)
        else:
            out += merge_table(name, d)
    return out


def topk_order_section() -> list[str]:
    """evidence/repro_topk_order.py: does the indexer top-k return the same order each call,
    does FlashMLA sparse decode depend on the order, and what a per-row sort costs."""
    out: list[str] = []
    for name, d in load("topk-order-*.json"):
        out += [
            f"### Indexer top-k index order, {base_of(d)}, `{name}`",
            "",
            f"Machine {d['machine']['gpu']}, torch {d['machine']['torch']}; revision "
            f"{revision(d)}; command `{shown_command(d['command'])}`. Rows whose index order "
            "(or set) differs between repeated calls on the same scores:",
            "",
        ]
        out += table(
            [
                "kind",
                "rows",
                "context",
                "top-k",
                "exact ties",
                "calls",
                "order differs",
                "set differs",
            ],
            [
                [
                    r["kind"],
                    r["rows"],
                    r["ctx"],
                    r["topk"],
                    r["ties"],
                    r["calls"],
                    r["rows_order_differs"],
                    r["rows_set_differs"],
                ]
                for r in d["order"]
            ],
        )
        out += [
            "FlashMLA sparse decode on the same indices, in the same and in permuted order:",
            "",
        ]
        out += table(
            [
                "batch",
                "heads",
                "top-k",
                "same order bit-identical",
                "permuted bit-identical",
                "permuted max abs Δout",
                "permuted max abs Δlse",
            ],
            [
                [
                    a["batch"],
                    a["heads"],
                    a["topk"],
                    a["same_order_bit_identical"],
                    a["permuted_bit_identical"],
                    fmt(a["permuted_max_abs_out_diff"], 3),
                    fmt(a["permuted_max_abs_lse_diff"], 3),
                ]
                for a in d["attention"]
            ],
        )
        out += ["A per-row sort of the top-k indices (not shipped):", ""]
        out += table(
            [
                "rows",
                "context",
                "top-k",
                "calls",
                "rows differing after sort",
                "sort ms",
                "top-k ms",
                "sort / top-k",
            ],
            [
                [
                    f["rows"],
                    f["ctx"],
                    f["topk"],
                    f["calls"],
                    f["rows_differ_after_sort"],
                    fmt(f["sort_ms"], 3),
                    fmt(f["topk_ms"], 3),
                    ratio(f["sort_ms"] / f["topk_ms"]),
                ]
                for f in d["fix"]
            ],
        )
        if d.get("errors"):
            out += [f"Errors: {'; '.join(map(str, d['errors']))}", ""]
    return out


def tool_section() -> list[str]:
    out: list[str] = []
    runs = load("bench_tool-*.json")
    if runs:
        name, d = runs[-1]
        f = d["figures"]
        out += [f"### patchset timings (2-core CI-class machine), `{name}`", ""]
        out += table(
            ["step", "median s", "min s", "target s", "within"],
            [
                [k, f[k]["median_s"], f[k]["min_s"], d["targets_s"][k], d["within_targets"][k]]
                for k in ("apply_verify", "wheel")
            ],
        )
        out += [f"Series at that run: {d['series']['vllm_patches']} vLLM patch(es).", ""]
    for name, d in load("rebase-*.json"):
        out += [
            f"### Rebase dry-run {d['from']['version']} -> {d['onto']['version']}, `{name}`",
            "",
        ]
        out += table(
            ["patch", "status", "conflicting files"],
            [
                [p["name"], p["status"], ", ".join(c["path"] for c in p.get("conflicts", []))]
                for p in d["patches"]
            ],
        )
    return out


def serve_section() -> list[str]:
    """The serving smoke (``serve-smoke-*.json``, evidence/serve_smoke.py): one table each."""
    out: list[str] = []
    for name, d in load("serve-smoke-*.json"):
        b = d.get("bench") or {}
        m = d.get("spec_metrics_after_bench") or {}
        drafted = m.get("vllm:spec_decode_num_draft_tokens_total")
        accepted = m.get("vllm:spec_decode_num_accepted_tokens_total")
        out += [f"### `vllm serve` smoke ({card(d)}, {base_of(d)}), `{name}`", ""]
        out += [d.get("what", ""), ""]
        out += table(
            ["figure", "value"],
            [
                ["revision", revision(d)],
                ["ok (client answers = offline greedy, bench completed)", d.get("ok")],
                ["problems", len(d.get("problems", []))],
                ["server start s", fmt(d.get("server_start_s"))],
                ["KV pool (tokens, from the start-up log)", d.get("kv_pool_tokens")],
                ["answers checked", sum(len(v) for v in (d.get("answers") or {}).values())],
                [
                    "bench completed",
                    f"{b.get('completed')} of {d['bench_settings']['num_prompts']}",
                ],
                ["output tokens/s", fmt(b.get("output_throughput"))],
                ["median TTFT ms", fmt(b.get("median_ttft_ms"))],
                ["median TPOT ms", fmt(b.get("median_tpot_ms"))],
                ["draft tokens accepted", f"{fmt(accepted)} of {fmt(drafted)}"],
                ["adaptive depth (client, then bench)", depth_path(d.get("depth_changes"))],
                ["vLLM installed as", installed_as(d.get("install"))],
            ],
        )
    return out


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.2f}"


def peak_site(ranks: list[dict], kind: str, by: Any) -> str:
    """Where ``kind``'s peak happened (gate/memory.py ``peak_at``) on the rank with the
    largest ``by(rank)``: the module (its layer index apart) and its transient in GiB ("-"
    for a record without attribution)."""
    ranks = [r for r in ranks if ((r.get("peak_at") or {}).get(kind)) and by(r) is not None]
    if not ranks:
        return "-"
    site = max(ranks, key=by)["peak_at"][kind][0]
    layer = re.fullmatch(r"(?:.*\.)?layers\.(\d+)(?:\.(.+))?", site["module"])
    name = f"{layer[2] or 'layer'} (L{layer[1]})" if layer else site["module"]
    return f"{name} +{_gib(site['peak_bytes'] - site['entry_bytes'])}"


def step_figures(
    ranks: list[dict], field: str, kinds: tuple[str, ...] = ("prefill", "decode")
) -> list[int]:
    """``field`` of every rank's step classes ``kinds`` (gate/memory.py), where recorded."""
    return [r[k][field] for r in ranks for k in kinds if (r.get(k) or {}).get(field) is not None]


def verdict_of(d: dict[str, Any], key: str) -> Any:
    """A memory result's verdict, "-" where the record predates it."""
    return d[key] if key in d else "-"


def layer_cell(v: dict[str, Any]) -> str:
    """The attention rule's cell of a run: the DSA layer's largest prefill step transient and
    its profile's over the ranks (GiB), and the verdict; "-" where not judged."""
    ranks = v.get("ranks") or []
    step = step_figures(ranks, "layer_step_bytes", ("prefill",))
    profile = step_figures(ranks, "layer_profile_bytes", ("prefill",))
    if not step or not profile or v.get("attention_within") is None:
        return "-"
    mark = "within" if v["attention_within"] else "over"
    return f"{_gib(max(step))} / {_gib(max(profile))} ({mark})"


def memory_section() -> list[str]:
    """The memory test and the capacity table (``dcp-memory*.json``, gate/memory.py)."""
    out: list[str] = []
    for name, d in load("dcp-memory*.json"):
        out += [f"### DCP memory test ({card(d)}, {base_of(d)}), `{name}`", ""]
        out += [
            f"Rule: {d.get('rule')}. All DCP runs within: {d.get('all_within')} (DCP = 1 "
            f"baseline: {d.get('baseline_within')}); negative controls caught: "
            f"{d.get('controls_caught')}. Transient rule: {d.get('transient_rule') or '-'}. All "
            f"DCP runs transient-within: {verdict_of(d, 'all_transient_within')} (DCP = 1 "
            f"baseline: {verdict_of(d, 'baseline_transient_within')}); negative controls caught "
            f"by it: {verdict_of(d, 'controls_caught_by_transient_rule')}. Attention rule: "
            f"{d.get('attention_rule') or '-'}. All DCP runs attention-within: "
            f"{verdict_of(d, 'all_attention_within')} (DCP = 1 baseline: "
            f"{verdict_of(d, 'baseline_attention_within')}); negative controls caught by it: "
            f"{verdict_of(d, 'controls_caught_by_attention_rule')}. Revision "
            f"{revision(d)}; {', '.join(d.get('transport') or []) or '-'}. GiB per rank; "
            "margin: the smallest over the ranks (budget - step peak); transient margin: the "
            "smallest over the ranks and step classes (profile transient - step transient); "
            "grown since profile: the largest over the ranks and step classes (allocated at the "
            "peak step's start - at the profile's start - KV pool; per rank and class, margin = "
            "transient margin - grown); peak at: the module where the largest prefill "
            "step (profiling forward) peaked on the rank with the largest such peak, and what "
            "that segment allocated above its entry (a parent's earlier tensors count as entry).",
            "",
        ]
        rows = []
        for run, v in sorted((d.get("runs") or {}).items()):
            ranks = v.get("ranks") or []
            caught = (d.get("controls") or {}).get(run, {}).get("caught")
            rows.append(
                [
                    f"`{run}`",
                    f"{v.get('tp')}/{v.get('dcp')}",
                    v.get("backend") or "-",
                    v.get("route"),
                    v.get("control") or "-",
                    "refused" if v.get("refused") else v.get("within"),
                    "-" if caught is None else caught,
                    _gib(max((r.get("budget_bytes") or 0 for r in ranks), default=None)),
                    _gib(max(step_figures(ranks, "peak_bytes", ("prefill",)), default=None)),
                    _gib(min(step_figures(ranks, "margin_bytes", ("prefill",)), default=None)),
                    _gib(min(step_figures(ranks, "margin_bytes", ("decode",)), default=None)),
                    _gib(min(step_figures(ranks, "transient_margin_bytes"), default=None)),
                    _gib(max(step_figures(ranks, "grown_bytes"), default=None)),
                    layer_cell(v),
                    peak_site(
                        ranks, "prefill", lambda r: (r.get("prefill") or {}).get("peak_bytes")
                    ),
                    peak_site(ranks, "profile", lambda r: r.get("profiled_peak_bytes")),
                ]
            )
        out += table(
            [
                "run",
                "TP/DCP",
                "backend",
                "route",
                "control",
                "within",
                "control caught",
                "budget",
                "prefill peak",
                "prefill margin",
                "decode margin",
                "transient margin",
                "grown since profile",
                "attention step / profile",
                "prefill peak at",
                "profile peak at",
            ],
            rows,
        )
        cap = d.get("capacity") or []
        if cap:
            out += ["", "KV capacity with the same KV bytes per rank (vLLM's own block count):", ""]
            out += table(
                ["run", "checkpoint", "KV MiB / rank", "TP/DCP", "tokens", "x DCP 1", "served"],
                [
                    [
                        f"`{c['run']}`",
                        c["checkpoint"],
                        fmt((c.get("kv_cache_memory_bytes") or 0) / (1 << 20)),
                        f"{c.get('tp')}/{c['dcp']}",
                        f"{c['tokens']:,}"
                        if c.get("tokens") is not None
                        else (
                            f"refused {c.get('refused_max_model_len') or 0:,} "
                            f"(holds {c.get('vllm_estimated_max_model_len') or '?'})"
                        ),
                        fmt(c.get("tokens_vs_dcp1")),
                        "-"
                        if c.get("longest_prompt_served") is None
                        else f"{c['longest_prompt_served']:,}",
                    ]
                    for c in cap
                ],
            )
        out.append("")
    return out


def depth_path(changes: list[dict] | None) -> str:
    """The adaptive depth's path through a run, e.g. ``2 -> 4 -> 5 -> 2``."""
    if not changes:
        return "-"
    return " -> ".join(str(x) for x in [changes[0]["from"], *(c["to"] for c in changes)])


def installed_as(install: dict | None) -> str:
    """How the serving smoke's vLLM got onto the machine."""
    if not install:
        return "the patched tree (official tree + overlay files)"
    vllm = next((w for w in install["wheels"] if w["file"].startswith("vllm-")), None)
    if vllm is None:
        return "-"
    return (
        f"`{vllm['file']}` (sha256 {vllm['sha256'][:12]}) pip-installed; "
        f"{install['patched_files_checked']} patched files checked"
    )


def export_section() -> list[str]:
    """One table per ``patchset export --check --json`` record (``export-check-*.json``)."""
    out: list[str] = []
    for name, d in load("export-check*.json"):
        base = d["bases"]["vllm"]
        out += [
            f"### Each patch standalone on vLLM {base.get('version', '?')} "
            f"(+ its Depends-on), `{name}`",
            "",
        ]
        rows = []
        for r in d["patches"]:
            tests = r.get("tests") or {}
            rows.append(
                [
                    r["name"],
                    ", ".join(r["depends_on"]) or "-",
                    r["standalone"],
                    tests.get("summary") or "no test module",
                ]
            )
        out += table(["patch", "depends on", "standalone", "its own tests (CPU)"], rows)
    return out


# -- the README's status table -----------------------------------------------------------------

README = REPO / "README.md"
STATUS_BEGIN = "<!-- status table: generated by evidence/results_tables.py, do not edit -->"
STATUS_END = "<!-- end of status table -->"
_GATE_NAME = re.compile(
    r"^(?:p-)?(?P<ckpt>[a-z0-9]+)-tp(?P<tp>\d+)-dcp(?P<dcp>\d+)(?:-(?P<rest>.*))?$"
)
_BACKEND_TOKENS = ("triton_mla_sparse_fp8_ds_mla", "flashmla_sparse", "flash_attn_mla_sparse")


_PROMPT_LENGTH = re.compile(r"\d+[km]")  # a long gate's prompt: 32k, 128k, 256k, 1m
_KV_FORMATS = ("nvfp4_ds_mla",)  # a cache other than the backend's own fp8_ds_mla


def _gate_subject(rest: str) -> str:
    """What a gate compares, from the part of its name after ``-tpN-dcpM``; a KV-cache format
    (``-nvfp4_ds_mla``) and a prompt length (``-32k``, ``-128k``, ``-256k``, ``-1m``) in the
    name follow the subject in brackets."""
    rest = re.sub(r"-?\d+\.\d+\.\d+$", "", rest)  # a base suffix (``-0.34.0``) is its own column
    words = [w for w in rest.split("-") if w not in ("graphs", "eager", "bf16", *_BACKEND_TOKENS)]
    lengths = [w for w in words if _PROMPT_LENGTH.fullmatch(w)]
    formats = [w for w in words if w in _KV_FORMATS]
    subject = _subject_of("-".join(w for w in words if w not in (*lengths, *formats)))
    return (
        subject
        + "".join(f" ({w} cache)" for w in formats)
        + "".join(f" ({w.upper() if w.endswith('m') else w} prompt)" for w in lengths)
    )


def _subject_of(key: str) -> str:
    """What a gate compares, from its name's words less mode, backend and prompt length."""
    if key == "":
        return "DCP vs DCP = 1"
    if key == "prefixcache":
        return "prefix-cache hit vs DCP = 1"
    if key == "ckv":
        return "packed-CKV prefill route vs DCP = 1"
    if key == "ckv-vs-query":
        return "packed-CKV route vs query route"
    if key == "fp8wire-vs-auto":
        return "fp8 wire vs bf16 wire"
    if key == "b12x":
        return "b12x DCP transport vs DCP = 1"
    if key == "b12x-vs-a2a":
        return "b12x DCP transport vs a2a"
    m = re.fullmatch(r"merge-(\w+)(-vs-auto)?", key)
    if m:
        return f"{m.group(1)} top-k merge vs " + ("auto" if m.group(2) else "DCP = 1")
    m = re.fullmatch(r"mtp(\w+?)-(vs-nospec|accept)", key)
    if m:
        if m.group(2) == "accept":
            return f"MTP {m.group(1)}, accepted drafts vs DCP = 1"
        return f"MTP {m.group(1)} vs no speculation"
    return key


def _gate_facts(d: dict[str, Any]) -> tuple[re.Match[str], str, str, str] | None:
    """A gate record's name match, what it compares, the candidate's backend and the model
    geometry; None for a record that is not a gate."""
    m = _GATE_NAME.match(str(d.get("name", "")))
    if d.get("kind") != "dcp_gate" or not m:
        return None
    backend = (d["backend"].get("candidate_used") or ["?"])[0].split("/")[0]
    model = "V3.2" if m["ckpt"].startswith("v32") else "GLM-5"
    argv = (d.get("checkpoint") or {}).get("argv") or []
    heads = argv[argv.index("--heads") + 1] if "--heads" in argv else None
    if heads:
        model += f", {heads} heads"
    return m, _gate_subject(m["rest"] or ""), backend, model


def status_rows() -> list[list[str]]:
    """One row per (what is compared, backend, model geometry): per DCP size, whether every
    gate of it is meaningful and equivalent, in which modes, and its largest diff / tolerance."""
    cells: dict[tuple[str, str, str], dict[str, list[tuple[str, bool, float]]]] = {}
    for _, d in load("dcp-gate-*.json"):
        facts = _gate_facts(d)
        if facts is None:
            continue
        m, subject, backend, model = facts
        key = (_gate_base(d), subject, backend, model)
        mode = "graphs" if d["dcp"]["candidate"].get("graphs") else "eager"
        diff, tol = d.get("max_abs_logprob_diff"), d["tolerance"]["atol_logprob"]
        ok = bool(d.get("meaningful") and d.get("equivalent"))
        ratio = diff / tol if diff is not None and tol else float("nan")
        column = f"TP {m['tp']} DCP {m['dcp']}"
        cells.setdefault(key, {}).setdefault(column, []).append((mode, ok, ratio))
    columns = sorted({c for v in cells.values() for c in v})
    rows = []
    for key in sorted(cells):
        row = [*key]
        for column in columns:
            got = cells[key].get(column)
            if not got:
                row.append("-")
                continue
            modes = "+".join(sorted({mode for mode, _, _ in got}))
            mark = "✓" if all(ok for _, ok, _ in got) else "✗"
            row.append(f"{mark} {modes}, ≤ {max(r for _, _, r in got):.2f} tol")
        rows.append(row)
    return [["vLLM", "compared", "backend", "model geometry", *columns], *rows]


def _gate_base(d: dict[str, Any]) -> str:
    """The vLLM release a gate ran on (``base.vllm`` of its record; 0.33.0 for records that
    predate the field)."""
    base = d.get("base")
    if isinstance(base, dict) and base.get("vllm"):
        return str(base["vllm"])
    return "0.33.0"


def patch_rows() -> list[list[str]]:
    """The series in apply order: patch and its subject (``[PATCH]`` dropped, unfolded)."""
    rows = [["patch", "subject"]]
    for line in (REPO / "series").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        header = (REPO / "patches" / name).read_text().split("\n\n", 1)[0]
        subject = re.search(r"^Subject: (.*(?:\n .*)*)", header, re.MULTILINE)
        title = re.sub(r"\s*\n\s*", " ", subject.group(1)) if subject else "?"
        rows.append([f"`{name.removesuffix('.patch')}`", re.sub(r"^\[PATCH[^\]]*\] ", "", title)])
    return rows


def status_block() -> str:
    """The README's status table with the sentence that says how to read it."""
    header, *rows = status_rows()
    cards = Counter(
        card(d)
        for _, d in load("dcp-gate-*.json")
        if d.get("kind") == "dcp_gate" and d.get("meaningful")
    )
    where = ", ".join(f"{c}: {n}" for c, n in cards.most_common())
    lines = [
        STATUS_BEGIN,
        f"{sum(cards.values())} meaningful DCP gates in `results/`: the series on the vLLM",
        f"release of each row, DCP ranks sharing one GPU ({where}).",
        "✓: every gate of the cell was meaningful",
        "(sensitive to one prompt token, negative control caught) and equivalent; ≤ x tol: the",
        "largest log-prob difference as a fraction of the gate's tolerance.",
        "",
        *table(header, rows),
        *table(*(lambda r: (r[0], r[1:]))(patch_rows())),
        STATUS_END,
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def readme_with_status(text: str) -> str:
    """``text`` (README.md) with the block between the status markers regenerated."""
    if STATUS_BEGIN not in text or STATUS_END not in text:
        raise SystemExit(f"README.md has no status markers ({STATUS_BEGIN!r} ... {STATUS_END!r})")
    before = text[: text.index(STATUS_BEGIN)]
    after = text[text.index(STATUS_END) + len(STATUS_END) :].removeprefix("\n")
    return before + status_block() + after


def nvfp4_accuracy_table(name: str, d: dict[str, Any]) -> list[str]:
    """evidence/nvfp4_accuracy.py: the error each KV record format causes against bf16
    attention, per activation regime; ``kernel vs format``: the shipped kernel against float32
    attention over the same nvfp4 records (the kernel's own rounding)."""
    rows = []
    for regime, e in d["regimes"].items():
        f8, f4 = e["fp8_ds_mla"], e["nvfp4_ds_mla"]

        def pair(key: str, part: str = "format", f8=f8, f4=f4) -> str:
            return f"{fmt(f8[part][key])} / {fmt(f4[part][key])}"

        kvf = f4.get("kernel_vs_format") or {}
        rows.append(
            [
                regime,
                fmt(float(e["logit_std"])),
                pair("nope_rel_fro", "kv"),
                pair("out_rel_fro"),
                pair("lse_mean_abs"),
                pair("lse_max_abs"),
                fmt(kvf.get("out_rel_fro")),
            ]
        )
    a = d["args"]
    head = [
        f"### 4-bit KV records (nvfp4_ds_mla) beside fp8_ds_mla, against bf16 attention (CPU), "
        f"`{name}`; revision {revision(d)}",
        "",
        f"Synthetic DSA-shaped activations, {a['slots']} cache rows, {a['rows']} query rows x "
        f"{a['heads']} heads over a top-k of {a['topk']}; errors as fp8_ds_mla / nvfp4_ds_mla; "
        "relative errors are Frobenius norms, LSE errors in natural log.",
        "",
    ]
    return head + table(
        [
            "regime",
            "logit std",
            "NoPE rel. error",
            "output rel. error",
            "LSE mean abs error",
            "LSE max abs error",
            "nvfp4 kernel vs format (output rel.)",
        ],
        rows,
    )


def nvfp4_compile_table(files: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """evidence/nvfp4_compile_check.py: offline compile facts of every nvfp4_ds_mla launch per
    target (no GPU): not timings."""
    rows = []
    for name, d in files:
        launches = d["rows"]
        kernels = [r for r in launches if r.get("kernel") == "sparse_mla_nvfp4"]
        rows.append(
            [
                f"sm_{launches[0]['capability']}" if launches else "-",
                f"`{name}`",
                str(len(kernels)),
                "yes" if d["failed"] == 0 else f"NO: {d['failed']} failed",
                str(max((r.get("registers", 0) for r in kernels), default=0)),
                str(max((r.get("stack_bytes", 0) for r in kernels), default=0)),
                str(max((r.get("shared_bytes", 0) for r in kernels), default=0)),
                str(d["stand_in"]["smem_per_block"]),
                d.get("triton", "-"),
                revision(d),
            ]
        )
    head = ["### nvfp4_ds_mla launches compiled offline (no GPU, nothing launched)", ""]
    return head + table(
        [
            "target",
            "file",
            "kernel launches",
            "all compile and fit",
            "registers (max)",
            "spill bytes (max)",
            "shared memory (max, B)",
            "shared memory per block (B)",
            "Triton",
            "revision",
        ],
        rows,
    )


def nvfp4_bench_table(name: str, d: dict[str, Any]) -> list[str]:
    """evidence/bench_nvfp4_sparse_mla.py: the shipped kernel's time over each record format,
    same inputs, one run (``nvfp4 / fp8`` < 1: the 4-bit records are faster), and the KV
    tokens a GiB holds per format."""
    rows = [
        [
            r["kind"],
            r["rows"],
            r["heads"],
            fmt(r["fp8_ds_mla"]["us"]),
            fmt(r["nvfp4_ds_mla"]["us"]),
            ratio(r["nvfp4_over_fp8"]),
            fmt((r["nvfp4_ds_mla"].get("kernel_vs_bf16") or {}).get("out_rel_fro")),
        ]
        for r in d.get("decode", []) + d.get("extend", [])
    ]
    cap = d["capacity"]
    head = [
        f"### nvfp4_ds_mla against fp8_ds_mla: Triton sparse-MLA kernel time, `{name}`; "
        f"revision {revision(d)}",
        "",
        f"{d.get('device')} (capability {d.get('capability')}); top-k 2048, CUDA-graph replay "
        "over rotating index sets, each format's default launch; "
        f"{'complete' if d.get('complete') else 'cut by its time budget'}. "
        "Decode rows read a 1M-token cache, extend rows a 32k-token context.",
        "",
    ]
    out = head + table(
        [
            "shape",
            "rows",
            "heads",
            "fp8_ds_mla us",
            "nvfp4_ds_mla us",
            "nvfp4 / fp8",
            "nvfp4 out rel. error vs bf16",
        ],
        rows,
    )
    out += [
        f"KV tokens per GiB over {cap['layers']} layers: nvfp4_ds_mla holds "
        f"{ratio(cap['nvfp4_over_fp8_tokens'])}x fp8_ds_mla's tokens, "
        f"{ratio(cap['nvfp4_over_fp8_tokens_with_indexer'])}x with the indexer's key cache "
        "(record bytes: arithmetic, not a measured pool).",
        "",
    ]
    return out


def distance_table(files: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """results/dcp-distance-*.json: how far one configuration's log-probs lie from
    another's, stated and never gated (against the noise floor, the tolerance and the
    sensitivity of the same checkpoint)."""
    rows = []
    for name, d in files:
        sc = d.get("scale") or {}
        be = d.get("backend") or {}
        rows.append(
            [
                f"`{name}`",
                f"{be.get('candidate_kv_cache_dtype')} vs {be.get('reference_kv_cache_dtype')}",
                fmt(d.get("max_abs_logprob_diff")),
                fmt(d.get("max_first_step_abs_logprob_diff")),
                ratio(sc.get("ratio_to_noise_floor")),
                ratio(sc.get("ratio_to_tolerance")),
                ratio(sc.get("ratio_to_sensitivity")),
                (d.get("tokens_exact") or {}).get("all_exact"),
                revision(d),
            ]
        )
    head = [
        "### Distances between configurations (stated, never gated)",
        "",
        "Largest |delta log-prob| of the candidate's clean pass from the reference's, over the "
        "steps that share their context; its ratio to the checkpoint's noise floor, tolerance "
        "and sensitivity.",
        "",
    ]
    return head + table(
        [
            "file",
            "formats",
            "max abs diff",
            "first step",
            "/ noise floor",
            "/ tolerance",
            "/ sensitivity",
            "tokens exact",
            "revision",
        ],
        rows,
    )


def kv_pool_table(name: str, d: dict[str, Any]) -> list[str]:
    """results/kv-pool-*.json (evidence/kv_pool.py): the KV pool each gate run's engine logged
    at a fixed per-rank budget, against the record arithmetic."""
    rows = [
        [
            r["run"],
            r["kv_cache_dtype"],
            f"TP={r['tp']} DCP={r['dcp']}",
            _gib(r["kv_cache_memory_bytes"]),
            f"{r['logged_tokens']:,}" if r["logged_tokens"] else "-",
            f"{r['predicted_tokens']:,}",
            r.get("bytes_per_token_per_rank", "-"),
        ]
        for r in d["runs"]
    ]
    ratios = "; ".join(
        f"{p['formats']}: {p['ratio']}x logged ({p['predicted_ratio']}x predicted)"
        for p in d.get("ratios", [])
    )
    head = [
        f"### KV pool logged per format ({card(d)}, `{name}`)",
        "",
        f"Each run's engine holds a fixed KV budget per rank; the pool is its rank 0's `GPU KV "
        f"cache size`. Predicted: {d['block_size']}-token blocks of one MLA record per layer "
        f"plus one {d['indexer_key_bytes']}-byte indexer key per indexer layer, one token in "
        f"DCP per rank. {ratios}.",
        "",
    ]
    return head + table(
        [
            "run",
            "format",
            "ranks",
            "budget per rank (GiB)",
            "logged tokens",
            "predicted tokens",
            "bytes per token per rank",
        ],
        rows,
    )


def nvfp4_section() -> list[str]:
    out: list[str] = []
    for name, d in load("nvfp4-accuracy-*.json"):
        out += nvfp4_accuracy_table(name, d)
    for name, d in load("nvfp4-bench-*.json"):
        out += nvfp4_bench_table(name, d)
    for name, d in load("kv-pool-*.json"):
        out += kv_pool_table(name, d)
    distances = load("dcp-distance-*.json")
    if distances:
        out += distance_table(distances)
    files = sorted(
        load("nvfp4-compile-*.json"),
        key=lambda f: f[1]["rows"][0]["capability"] if f[1]["rows"] else 0,
    )
    if files:
        out += nvfp4_compile_table(files)
    return out


# -- results/README.md: one line per file ------------------------------------------------------
def _ledger_memory(d: dict) -> str:
    """The ledger's memory outside torch, the largest over the ranks that read it, per entry
    ("" if none did; a rank NVML could not read is None, gate/ledger.py)."""
    read = {}
    for label, e in (d.get("entries") or {}).items():
        known = [b for b in (e.get("non_torch_bytes") or {}).values() if b is not None]
        if known:
            read[label] = max(known)
    if not read:
        return ""
    mib = ", ".join(f"{label} {b / 2**20:,.0f}" for label, b in read.items())
    return f"; MiB outside torch per rank: {mib}"


def _n(x: Any) -> int:
    return len(x) if isinstance(x, (list, dict)) else 0


def _count(x: Any, noun: str) -> str:
    """``len(x)`` with its noun: "1 run", "4 runs"."""
    return f"{_n(x)} {noun}" + ("" if _n(x) == 1 else "s")


def _gate_line(d: dict[str, Any]) -> str:
    facts = _gate_facts(d)
    if facts is None:
        return f"DCP gate `{d.get('name')}`"
    m, subject, backend, model = facts
    mode = "graphs" if d["dcp"]["candidate"].get("graphs") else "eager"
    kind = d.get("gate_kind", "dcp")
    return (
        f"DCP gate ({kind}): {subject}, {backend}, {model}, TP {m['tp']} DCP {m['dcp']} {mode}; "
        f"equivalent {d.get('equivalent')}, meaningful {d.get('meaningful')}"
    )


def _memory_line(d: dict[str, Any]) -> str:
    cap = _n(d.get("capacity"))
    return (
        f"DCP memory test of {_count(d.get('runs'), 'run')}: step peaks against the profiled "
        f"peak + KV pool (all DCP runs within: {d.get('all_within')}, controls caught: "
        f"{d.get('controls_caught')})" + (f"; KV capacity of {cap} runs" if cap else "")
    )


def _distance_line(d: dict[str, Any]) -> str:
    """A distance record (``verdict.distance_result``): two runs compared as the gates compare,
    with no tolerance; the figures over the tolerance and the noise floor are stated, not
    judged."""
    cand = (d.get("runs") or {}).get("candidate") or {}
    kv = d.get("backend") or {}
    scale = d.get("scale") or {}
    prompts = ((d.get("tokens_exact") or {}).get("prompts") or {}).values()
    exact = [bool((t or {}).get("exact")) for t in prompts]
    return (
        f"measured distance `{d.get('name')}`, not a gate: the "
        f"{kv.get('candidate_kv_cache_dtype')} run against the {kv.get('reference_kv_cache_dtype')}"
        f" one ({cand.get('backend')}, TP {cand.get('tp')} DCP {cand.get('dcp')} "
        f"{'graphs' if cand.get('graphs') else 'eager'}): largest log-prob difference "
        f"{fmt(d.get('max_abs_logprob_diff'))}, {ratio(scale.get('ratio_to_tolerance'))}x the "
        f"tolerance, {ratio(scale.get('ratio_to_noise_floor'))}x the noise floor; greedy tokens "
        f"exact in {sum(exact)}/{len(exact)} prompts"
    )


def _nvfp4_accuracy_line(d: dict[str, Any]) -> str:
    """An nvfp4_accuracy.py record: both KV record formats against bf16 attention."""
    kernel = " and the shipped kernel's own rounding" if (d.get("args") or {}).get("kernel") else ""
    sizes = ", ".join(f"{k} {v}" for k, v in (d.get("bytes_per_token") or {}).items())
    return (
        f"nvfp4_ds_mla (0013/0014) beside fp8_ds_mla: sparse-MLA output and LSE errors against "
        f"bf16 attention in {_n(d.get('regimes'))} activation regimes "
        f"({', '.join(d.get('regimes') or {})}){kernel}; bytes per token {sizes}"
    )


def _nvfp4_compile_line(d: dict[str, Any]) -> str:
    """An nvfp4_compile_check.py record: each nvfp4_ds_mla launch compiled for one target."""
    rows = d.get("rows") or []
    kernels = [r for r in rows if r.get("kernel") == "sparse_mla_nvfp4"]
    caps = sorted({f"sm_{r['capability']}" for r in rows if "capability" in r})
    fits = "all compile and fit" if d.get("failed") == 0 else f"{d.get('failed')} failed"
    return (
        f"nvfp4_ds_mla Triton launches (0013) compiled offline for {', '.join(caps) or '?'}, "
        f"no GPU: sparse-MLA launches {len(kernels)}, cache-writer launches "
        f"{len(rows) - len(kernels)}, {fits}; "
        f"registers up to {max((r.get('registers', 0) for r in kernels), default=0)}, spills up "
        f"to {max((r.get('stack_bytes', 0) for r in kernels), default=0)} B; not timings"
    )


# What a record of each ``kind`` shows, from its own fields.
KIND_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "dcp_gate": _gate_line,
    "dcp_gate_noise": lambda d: (
        f"noise floor and tolerance of checkpoint {d.get('checkpoint')}: "
        f"{_count(d.get('noise_pairs'), 'noise pair')}, the sensitivity of "
        f"{_count(d.get('sensitivity'), 'run')}"
    ),
    "dcp_gate_run": lambda d: (
        f"run record of `{d.get('name')}` ({d.get('variant')}, TP {d['config'].get('tp')} DCP "
        f"{d['config'].get('dcp')}, passes {', '.join(d['config'].get('passes') or [])}): "
        "what the gate and ledger reports read"
    ),
    "dcp_comm_ledger": lambda d: (
        f"per-layer DCP communication ledger (entries {', '.join(d.get('entries') or {})}; "
        f"{_n(d.get('prompts'))} prompts): wire bytes per rank and phase"
        + _ledger_memory(d)
        + ("; the ledger's observer check" if d.get("observer_check") else "")
    ),
    "dcp_memory": _memory_line,
    "dcp_gate_needle_calibration": lambda d: (
        f"needle calibration over prompt length, {_count(d.get('runs'), 'run')}: whether the "
        "first token is the checkpoint's answer with and without the needle, the first-step move"
    ),
    "dcp_gate_ckpt_check": lambda d: (
        f"layer 0 of {_n(d.get('checkpoints'))} gate checkpoints on CPU: the needle's rank in the "
        "indexer scores and its attention weight"
    ),
    "dcp-gate-ckpt-reference": lambda d: (
        f"CPU fp32 forward of checkpoint `{' '.join(d['checkpoint_args'][:2])}`"
        f"{' ...' if len(d['checkpoint_args']) > 2 else ''} at "
        f"{', '.join(k.split('/')[1].split('~')[0] for k in d['per_prompt'])} tokens: predicted "
        f"sensitivity, {fmt(d.get('predicted_over_tolerance'), 3)}x the predicted tolerance"
    ),
    "dcp_topk_merge_cutedsl_compile": lambda d: (
        f"vLLM's CuTe DSL DCP top-k merge compiled offline (no GPU) for "
        f"{', '.join(a for a, ok in d['compiled_by_arch'].items() if ok)}"
    ),
    "dcp_topk_merge_034": lambda d: (
        f"the dropped Triton/torch DCP top-k merges (0004) against CuTe DSL on rank-major "
        f"candidates: {d['summary'].get('local_identical')}/{d['summary'].get('local_cases')} "
        "cases identical, merge time ratios"
    ),
    "topk_order_repro": lambda d: (
        f"whether the indexer top-k order repeats ({_count(d.get('order'), 'case')}), whether "
        "FlashMLA sparse decode depends on it, and what a per-row sort costs"
    ),
    "dcp_gate_distance": _distance_line,
    "tree_tests_gpu": lambda d: (
        f"the series' vLLM-tree test files on one GPU: {len(d['finished'])} finished, "
        f"{len(d['cut'])} cut by a time limit, {len(d['not_run'])} not run; "
        + ", ".join(f"{v} {k}" for k, v in sorted(d["totals"].items()))
        + f"; failed files: {len(d['failed'])}"
    ),
    "kv_pool": lambda d: (
        f"KV pool logged by {_count(d.get('runs'), 'gate run')} at a fixed per-rank budget "
        "against the record arithmetic ("
        + (", ".join(f"{p['formats']} {p['ratio']}x" for p in d.get("ratios", [])) or "no pair")
        + f"; off the prediction: {len(d.get('off_prediction', []))})"
    ),
    "nvfp4-ds-mla-compile": _nvfp4_compile_line,
    "upstream-baseline": lambda d: (
        f"stock vLLM {d['base'].get('version')}'s own tests selected by the series' touched "
        f"files, on CPU: {_n(d.get('covered'))} files covered, outcomes per test id "
        f"({', '.join(f'{k} {v}' for k, v in sorted(d['totals'].items()))})"
    ),
}

# What a record without a ``kind`` shows, by file name (``fnmatch`` patterns, first match).
NAME_LINES: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    (
        "mtp-adaptive-cost-*.json",
        lambda d: (
            "Adaptive MTP depth (0012) vs fixed depths 1-5 in tokens/s on the cost-realistic "
            f"target: {_n(d.get('workloads'))} workloads, "
            f"{(d.get('bench_engine') or {}).get('repeats')} interleaved repeats, step-time "
            "curve, graph memory per stock engine"
        ),
    ),
    (
        "kernel-bench-*.json",
        lambda d: (
            f"Triton sparse-MLA kernel (0002) vs FlashMLA-sparse on fp8_ds_mla: "
            f"{_n(d.get('decode'))} decode and {_n(d.get('extend'))} extend rows, CUDA-graph "
            "replayed and eager, with the sweep of launch plans"
        ),
    ),
    (
        "nvfp4-bench-*.json",
        lambda d: (
            f"nvfp4_ds_mla (0013) vs fp8_ds_mla Triton sparse-MLA kernel time on one GPU: "
            f"{_n(d.get('decode'))} decode and {_n(d.get('extend'))} extend shapes, the Triton "
            f"writer vs the CUDA fp8 writer at {_n(d.get('writer'))} token counts, tokens per "
            "KV byte (arithmetic)"
        ),
    ),
    (
        "export-check-*.json",
        lambda d: (
            f"`patchset export --check`: each of {_n(d.get('patches'))} patches standalone on "
            f"vLLM {d['bases']['vllm'].get('version')} (+ its Depends-on) with its own tests"
        ),
    ),
    (
        "rebase-*.json",
        lambda d: (
            f"`patchset rebase` dry-run {d['from']['version']} -> {d['onto']['version']}: per "
            f"patch clean, merged or conflicting ("
            + ", ".join(f"{k} {v}" for k, v in sorted(d["summary"].items()))
            + ")"
        ),
    ),
    (
        "bench_tool-*.json",
        lambda d: (
            f"patchset apply+verify and overlay wheel times ({', '.join(d['figures'])}) for "
            f"{d['series'].get('vllm_patches')} vLLM patches, against their targets"
        ),
    ),
    (
        "dcp-topk-merge-*.json",
        lambda d: (
            f"the DCP global top-k merge, Triton and torch against CuTe DSL: "
            f"{d['summary'].get('cases_identical')}/{d['summary'].get('cases')} cases identical, "
            "merge time ratios"
        ),
    ),
    (
        "dcp-fp8-wire-*.json",
        lambda d: (
            f"the dropped fp8 DCP wire (0008) against bf16 collectives, {_n(d.get('rows'))} "
            "rows: time, wire and transient bytes per case"
        ),
    ),
    (
        "nvfp4-accuracy-*.json",
        _nvfp4_accuracy_line,
    ),
]


def _first_gpu(d: dict[str, Any]) -> str | None:
    """The GPU a record names (``machine.gpus``, ``machine.gpu`` or ``device``), else None."""
    m: dict[str, Any] = d["machine"] if isinstance(d.get("machine"), dict) else {}
    name = None
    if m.get("gpus"):
        first = m["gpus"][0]
        name = first.get("name") if isinstance(first, dict) else first
    name = name or m.get("gpu") or d.get("device")
    if not name or str(name).lower() == "cpu":
        return None
    return str(name).removeprefix("NVIDIA ")


def _ranks_shared_one_gpu(d: dict[str, Any]) -> bool:
    """Whether a record's ranks shared one GPU: its timing label or transport says so, it
    records an ``emulation``, or a noise record on one GPU pairs runs of TP > 1."""
    transport = d.get("transport") or []
    labels = [str(d.get("timing_label") or "")]
    labels += [transport] if isinstance(transport, str) else [str(t) for t in transport]
    if any("one-GPU emulation" in t for t in labels) or d.get("emulation"):
        return True
    gpus = ((d.get("machine") or {}) if isinstance(d.get("machine"), dict) else {}).get("gpus")
    tps = [int(t) for k in d.get("noise_pairs") or {} for t in re.findall(r"TP=(\d+)", k)]
    return d.get("kind") == "dcp_gate_noise" and len(gpus or []) == 1 and max(tps, default=1) > 1


def where_ran(d: dict[str, Any]) -> str:
    """Where a record was measured: its GPU (and "one-GPU emulation" where its ranks shared
    it), else CPU (every GPU script records its GPU); a CPU report of emulated runs says so."""
    gpu = _first_gpu(d)
    shared = _ranks_shared_one_gpu(d)
    if gpu is None:
        return "CPU (a report of one-GPU emulation runs)" if shared else "CPU"
    return gpu + (", one-GPU emulation" if shared else "")


def describe(name: str, d: Any) -> str | None:
    """What ``results/<name>`` shows, from its data: by its ``kind``, else by its file name,
    else its own ``what``; None when nothing explains it (``--check`` fails then)."""
    if not isinstance(d, dict):
        return None
    line = None
    if d.get("kind") in KIND_LINES:
        line = KIND_LINES[d["kind"]](d)
    else:
        for pattern, fn in NAME_LINES:
            if fnmatch(Path(name).name, pattern):
                line = fn(d)
                break
    if line is None and isinstance(d.get("what"), str):
        line = d["what"]
    return line


RUN_OUTPUTS = ("upstream-tests-*.json",)
"""Files that every ``make test`` writes into results/ (the upstream check's per-run record,
tests/upstream_tests.py) and that are never committed (.gitignore): not measurements."""


def results_files() -> list[Path]:
    """Every file under results/ but its README and the per-run outputs, sorted by path."""
    return sorted(
        p
        for p in RESULTS.rglob("*")
        if p.is_file()
        and p.relative_to(RESULTS) != Path("README.md")
        and not any(p.match(pattern) for pattern in RUN_OUTPUTS)
    )


def results_readme() -> tuple[str, list[str]]:
    """results/README.md, and the files it could not explain."""
    rows, unexplained = [], []
    for path in results_files():
        name = path.relative_to(RESULTS).as_posix()
        try:
            d = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            d = None
        line = describe(name, d)
        if line is None:
            unexplained.append(name)
            continue
        rev = revision(d)
        rows.append(
            [
                f"`{name}`",
                line.replace("|", "/").replace("\n", " "),
                where_ran(d),
                "-" if rev == "unknown" else rev,
            ]
        )
    lines = [
        "# results/",
        "",
        "Generated by `python evidence/results_tables.py` from the files beside it; do not edit.",
        "One JSON per measurement on the current base (earlier bases' files are in git log); the",
        "tables of their figures are in [design/results.md](../design/results.md).",
        "",
        *table(["file", "what it shows", "where it ran", "revision"], rows),
    ]
    return "\n".join(lines).rstrip() + "\n", unexplained


def _range(r: dict[str, Any] | None) -> str:
    """A paired ratio as ``median [min-max]``."""
    if not r:
        return "-"
    return f"{r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]"


def mtp_depth_table(name: str, d: dict[str, Any]) -> list[str]:
    """The adaptive depth (0012) against every fixed depth on the cost-realistic target
    (evidence/bench_mtp_depth.py): tokens/s, paired ratios and goals, where adaptive's time
    went, the step-time curve and each stock engine's graph memory."""
    out = [
        f"### Adaptive MTP depth (0012) vs fixed depths, cost-realistic target ({card(d)}, "
        f"{base_of(d)}), `{name}`",
        "",
        f"Revision {revision(d)}; {d['bench_engine']['repeats']} interleaved repeats per mode, "
        f"one engine (ladder 1-5, forced controllers); every token exact: {d.get('exact')}; "
        f"complete: {d.get('complete')}. Tokens/s are medians; adaptive / best fixed is the "
        "median of paired ratios within a repeat [min-max].",
        "",
    ]
    rows = []
    for w, s in d["workloads"].items():
        tps = s.get("tokens_per_s") or {}
        goal = s.get("goal") or {}
        rows.append(
            [
                w,
                *[fmt((tps.get(m) or {}).get("median")) for m in MTP_MODES],
                s.get("best_fixed", "-"),
                _range((s.get("adaptive_over_fixed") or {}).get(s.get("best_fixed"))),
                f"{goal.get('met')} / {goal.get('beyond_noise')}",
            ]
        )
    out += table(
        [
            "workload",
            *[f"{m} tok/s" for m in MTP_MODES],
            "best fixed",
            "adaptive / best fixed",
            "goal met / beyond noise",
        ],
        rows,
    )
    rows = []
    for w, s in d["workloads"].items():
        use = (s.get("depth_use") or {}).get("adaptive") or {}
        model = (s.get("time_model") or {}).get("adaptive") or {}
        per_depth = ", ".join(
            f"{k}: {v}" for k, v in sorted(use.get("steps_per_depth", {}).items())
        )
        best = (s.get("depth_use") or {}).get(s.get("best_fixed")) or {}
        rows.append(
            [
                w,
                per_depth or "-",
                use.get("steps", "-"),
                best.get("steps", "-"),
                fmt(model.get("model_ms")),
                fmt(model.get("measured_ms")),
                ratio(model.get("model_over_measured")),
            ]
        )
    out += table(
        [
            "workload",
            "adaptive: steps at depth",
            "adaptive steps",
            "best fixed steps",
            "model ms (steps x t(d + 1))",
            "measured ms",
            "model / measured",
        ],
        rows,
    )
    curve = d.get("step_curve") or {}
    qs = sorted({q for c in curve.values() for q in (c.get("step_ms") or {})}, key=int)
    out += table(
        ["batch", *[f"t({q}) ms" for q in qs]],
        [[b, *[fmt((c.get("step_ms") or {}).get(q)) for q in qs]] for b, c in curve.items()],
    )
    workloads = list(d["workloads"])
    rows = []
    for mode, e in (d.get("stock_engines") or {}).items():
        mem = e.get("memory") or {}
        rows.append(
            [
                mode,
                fmt(mem.get("graph_capture_gib")),
                fmt(mem.get("kv_cache_gib")),
                fmt(e.get("startup_s")),
                *[
                    fmt(((e.get("tokens_per_s") or {}).get(w) or {}).get("median"))
                    for w in workloads
                ],
            ]
        )
    mem = (d.get("bench_engine") or {}).get("memory") or {}
    rows.append(
        [
            "bench engine (ladder 1-5)",
            fmt(mem.get("graph_capture_gib")),
            fmt(mem.get("kv_cache_gib")),
            fmt(d["bench_engine"].get("startup_s")),
            *["-" for _ in workloads],
        ]
    )
    out += table(
        [
            "stock engine",
            "CUDA graphs GiB",
            "KV cache GiB",
            "start s",
            *[f"{w} tok/s" for w in workloads],
        ],
        rows,
    )
    return out


def mtp_depth_section() -> list[str]:
    out: list[str] = []
    for name, d in load("mtp-adaptive-cost-*.json"):
        out += mtp_depth_table(name, d)
    return out


def render() -> str:
    lines = [
        "# Evidence tables",
        "",
        "Generated by `python evidence/results_tables.py` from `results/*.json`; do not edit.",
        "Each JSON holds the command, revision and machine of its run.",
        "",
    ]
    for section in (
        kernel_section,
        nvfp4_section,
        dcp_gate_section,
        topk_section,
        topk_order_section,
        tool_section,
        export_section,
        serve_section,
        mtp_depth_section,
        memory_section,
    ):
        lines += section()
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a file is out of date")
    args = ap.parse_args(argv)
    listing, unexplained = results_readme()
    for name in unexplained:
        print(f"results/{name}: nothing says what it shows (a `kind`, a `what` or a NAME_LINES")
        print("  pattern in evidence/results_tables.py)")
    outputs = {
        OUT: render(),
        README: readme_with_status(README.read_text()),
        RESULTS / "README.md": listing,
    }
    stale = [
        path for path, text in outputs.items() if not path.is_file() or path.read_text() != text
    ]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run evidence/results_tables.py")
        return 1 if stale or unexplained else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path.relative_to(REPO)}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
