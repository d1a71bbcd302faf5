# SPDX-License-Identifier: Apache-2.0
"""The named suites of evidence/dcp_gate.py: which runs, which noise pairs, which gates.

A suite is a dict: ``checkpoints`` (name -> make_dsa_gate_ckpt.py arguments), ``runs`` (gate
configs; ``model`` names a checkpoint as ``@name``), ``noise`` (label -> [checkpoint,
reference run, candidate run, reference pass, candidate pass]) and ``gates`` (name ->
[reference run, candidate run]: DCP > 1 against DCP = 1 at the same TP). Runs of earlier
suites in the same work folder are reused for noise pairs and gates (a warm machine keeps
them), so a suite may name runs it does not run itself.

Stock vLLM 0.33.0 serves FLASHMLA_SPARSE under DCP only on its mixed-batch fp8 path, i.e.
with fewer than 32 local heads that pad to the same kernel envelope as the gathered heads:
the 64-head GLM checkpoints therefore run their DCP gates at TP=4 (16 local heads; DCP=2
gathers 32, DCP=4 gathers 64) and the 32-head V3.2 ones at TP=2 (DCP=2; TP=4 DCP=4 would
also fit the envelope and is not in a suite yet).

``stock-eager`` (the chaotic high-gain GLM checkpoint) and ``survey-20261201.json`` are the
suites that produced the 2026-12-01 files; ``needle-eager`` and ``needle-graphs`` run the
needle checkpoints, which design/dcp-gates.md says why.

The patched series' rows (every run ``variant="patched"``: the launcher puts
~/gpu-vllm-patched first on its ranks' PYTHONPATH) are ``patched-matrix`` (the series'
Triton backend, FlashMLA-sparse with 32 local heads, FlashAttention-sparse on a bf16 cache,
each DCP=2 vs DCP=1 at TP=2), ``patched-variants`` (top-k merge backends, packed-CKV route,
fp8 wire with the ledger on, MTP k=1/2/4/5/adaptive, all at DCP=2), ``patched-dcp4``,
``patched-graphs`` and ``patched-dcp4-extras``. ``LEASE`` lists every suite in priority order
(``--suites lease``): a deadline cuts the end of that queue.
"""

from __future__ import annotations

from typing import Any

FLASHMLA = {"backend": "FLASHMLA_SPARSE", "kv_cache_dtype": "fp8_ds_mla"}
# FlashAttention MLA-sparse on a bf16 cache
FA_BF16 = {"backend": "FLASH_ATTN_MLA_SPARSE", "kv_cache_dtype": "auto"}
CKPTS = {"glm": ["--arch", "glm"], "v32": ["--arch", "v32"]}


def _run(
    name: str, ckpt: str, tp: int, dcp: int, passes: list[str], graphs: bool = False, **extra: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "model": f"@{ckpt}",
        "tp": tp,
        "dcp": dcp,
        "graphs": graphs,
        "passes": passes,
        **FLASHMLA,
        **extra,
    }


def _noise(ckpt: str, tp1: str, tp2: str, repeats: list[str], label: str = "") -> dict[str, list]:
    """The noise pairs of a checkpoint: TP=2 DCP=1 against TP=1 and each repeated run. A
    label that differs from the default's (e.g. " (graphs)") keeps two suites' pairs apart
    when merge_suites unites them (the 22:37Z lease's graph suite replaced the eager TP=2
    pair of v32n by its own, which never ran)."""
    out = {f"{ckpt}: TP=2 DCP=1 vs TP=1{label}": [ckpt, tp1, tp2, "clean", "clean"]}
    for r in repeats:
        out[f"{ckpt}: {r} repeated"] = [ckpt, r, r, "clean", "repeat"]
    return out


STOCK_EAGER: dict[str, Any] = {
    "checkpoints": CKPTS,
    "runs": [
        _run("glm-tp1-dcp1", "glm", 1, 1, ["clean", "repeat", "sensitivity"]),
        _run("glm-tp2-dcp1", "glm", 2, 1, ["clean"]),
        _run("glm-tp4-dcp1", "glm", 4, 1, ["clean", "repeat", "sensitivity"]),
        _run("glm-tp4-dcp2", "glm", 4, 2, ["clean", "fault"]),
        _run("glm-tp4-dcp4", "glm", 4, 4, ["clean", "fault"]),
    ],
    "noise": _noise("glm", "glm-tp1-dcp1", "glm-tp2-dcp1", ["glm-tp1-dcp1", "glm-tp4-dcp1"]),
    "gates": {
        "glm-tp4-dcp2-eager": ["glm-tp4-dcp1", "glm-tp4-dcp2"],
        "glm-tp4-dcp4-eager": ["glm-tp4-dcp1", "glm-tp4-dcp4"],
    },
}

# A quick smoke of the harness itself on a GPU: one short prompt, TP=2 DCP=2 vs TP=2 DCP=1.
SMOKE: dict[str, Any] = {
    "checkpoints": {"v32": ["--arch", "v32", "--layers", "2"]},
    "runs": [
        _run(
            "smoke-tp2-dcp1",
            "v32",
            2,
            1,
            ["clean", "repeat", "sensitivity"],
            lens=[1024],
            batch_lens=[300, 900],
        ),
        _run("smoke-tp2-dcp2", "v32", 2, 2, ["clean", "fault"], lens=[1024], batch_lens=[300, 900]),
    ],
    "noise": {
        "v32: smoke repeated": ["v32", "smoke-tp2-dcp1", "smoke-tp2-dcp1", "clean", "repeat"]
    },
    "gates": {"smoke-tp2-dcp2": ["smoke-tp2-dcp1", "smoke-tp2-dcp2"]},
}

# The needle checkpoints (make_dsa_gate_ckpt.py --needle): smooth low gains plus one token
# every query retrieves, put at position 5 of every prompt; the sensitivity pass removes it.
# answer_logit=7: the retrieved needle also raises one answer token's logit to about 7
# (add_answer). Without it the o-gain-3 needle moved the first step by 3.5-4.5x the
# tolerance on the H200 (2026-12-01 18:20Z); with it the CPU forward of the checkpoint
# (gate_ckpt_reference.py, which reproduced those GPU figures within 4 %) predicts 24x / 17x /
# 15x at 1k / 8k / 32k for glmn (results/dcp-gate-ckpt-reference-glmn-*cpu.json), with the
# largest logit still below 8 (the same bf16 ULP, so the same noise floor).
NEEDLE_ARGS = [
    "--qk-gain",
    "1",
    "--o-gain",
    "3",
    "--down-gain",
    "0.25",
    "--head-gain",
    "1",
    "--needle",
    "7",
    "--needle-knob",
    "attn_margin=9",
    "--needle-knob",
    "answer_logit=7",
]
NEEDLE_CKPTS = {
    "glmn": ["--arch", "glm", *NEEDLE_ARGS],
    "v32n": ["--arch", "v32", *NEEDLE_ARGS],
    # DeepSeek-V3.2's real 128 query heads: 32 local heads at TP = 4 and 64 at TP = 2, the
    # FlashMLA-sparse DCP configurations stock 0.33.0 refuses (patch 0006)
    "v32w": ["--arch", "v32", "--heads", "128", *NEEDLE_ARGS],
}


def _needle_suite(graphs: bool) -> dict[str, Any]:
    tag = "-graphs" if graphs else ""
    runs = [
        _run("glmn-tp1-dcp1", "glmn", 1, 1, ["clean", "repeat", "sensitivity"], warmup=True),
        _run("glmn-tp2-dcp1", "glmn", 2, 1, ["clean"], warmup=True),
        _run(f"glmn-tp4-dcp1{tag}", "glmn", 4, 1, ["clean", "repeat", "sensitivity"], graphs),
        _run(f"glmn-tp4-dcp2{tag}", "glmn", 4, 2, ["clean", "fault"], graphs),
        _run(f"glmn-tp4-dcp4{tag}", "glmn", 4, 4, ["clean", "fault"], graphs),
        _run("v32n-tp1-dcp1", "v32n", 1, 1, ["clean", "repeat", "sensitivity"]),
        _run(f"v32n-tp2-dcp1{tag}", "v32n", 2, 1, ["clean", "repeat", "sensitivity"], graphs),
        _run(f"v32n-tp2-dcp2{tag}", "v32n", 2, 2, ["clean", "fault"], graphs),
    ]
    gate = tag or "-eager"
    return {
        "checkpoints": NEEDLE_CKPTS,
        "runs": runs,
        "noise": _noise(
            "glmn", "glmn-tp1-dcp1", "glmn-tp2-dcp1", ["glmn-tp1-dcp1", f"glmn-tp4-dcp1{tag}"]
        )
        | _noise(
            "v32n",
            "v32n-tp1-dcp1",
            f"v32n-tp2-dcp1{tag}",
            ["v32n-tp1-dcp1", f"v32n-tp2-dcp1{tag}"],
            " (graphs)" if graphs else "",
        ),
        "gates": {
            f"glmn-tp4-dcp2{gate}": [f"glmn-tp4-dcp1{tag}", f"glmn-tp4-dcp2{tag}"],
            f"glmn-tp4-dcp4{gate}": [f"glmn-tp4-dcp1{tag}", f"glmn-tp4-dcp4{tag}"],
            f"v32n-tp2-dcp2{gate}": [f"v32n-tp2-dcp1{tag}", f"v32n-tp2-dcp2{tag}"],
        },
    }


# --- the patched series (VARIANT patched: ~/gpu-vllm-patched) on the needle checkpoint -------
# GLM at TP=2: 32 local heads, the case stock FlashMLA-sparse refuses under DCP. Every patched
# run asks for Model Runner V2 explicitly (0.33's default for these configurations; the
# adaptive depth refuses V1), so speculative and non-speculative runs share the runner.
TRITON = {"backend": "TRITON_MLA_SPARSE_FP8_DS_MLA", "kv_cache_dtype": "fp8_ds_mla"}
PATCHED_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1"}
# Variant rows (merge backends, routes, wire, MTP depths) serve a lighter pass set: the 1k
# and 8k singles and the batch, clean and fault; the first-priority rows keep 1k/8k/32k.
LIGHT = {"lens": [1024, 8192]}
LEDGER = {"dcp_comm_ledger_size": 64}
PATCHED_NOISE = "glmn/patched"


def _p(
    name: str,
    tp: int,
    dcp: int,
    passes: list[str],
    extra: dict | None = None,
    ckpt: str = "glmn",
    **kw: Any,
) -> dict[str, Any]:
    run = _run(name, ckpt, tp, dcp, passes, **{**TRITON, **kw})
    run["variant"] = "patched"
    run["env"] = {**PATCHED_ENV, **run.get("env", {})}
    if extra:
        run["engine_extra"] = extra
    return run


def _mtp(k: int | str) -> dict[str, Any]:
    if k == "adaptive":
        return {
            "method": "mtp",
            "num_speculative_tokens": 5,
            "adaptive_speculative_tokens": "acceptance",
            "adaptive_speculative_tokens_ladder": [2, 4, 5],
        }
    return {"method": "mtp", "num_speculative_tokens": int(k)}


def _patched_noise(pairs: dict[str, list[str]], group: str = PATCHED_NOISE) -> dict[str, list]:
    return {f"{group}: {label}": [group, *v] for label, v in pairs.items()}


PATCHED_MATRIX: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [
        _p("p-glmn-tp1-dcp1", 1, 1, ["clean", "repeat", "sensitivity"], warmup=True),
        _p("p-glmn-tp2-dcp1", 2, 1, ["clean", "repeat"], warmup=True),
        # (2) the series' Triton backend; its DCP=2 run is also the reference of the
        # route, wire and MTP rows (ledger on, repeat pass: token-exactness run to run)
        _p("p-glmn-tp2-dcp2", 2, 2, ["clean", "repeat", "fault"], LEDGER),
        # (3) FlashMLA-sparse with 32 local heads under DCP (stock refuses it)
        _p("p-glmn-tp2-dcp1-flashmla", 2, 1, ["clean", "repeat"], **FLASHMLA),
        _p("p-glmn-tp2-dcp2-flashmla", 2, 2, ["clean", "fault"], **FLASHMLA),
        # (4) FlashAttention MLA-sparse on a bf16 cache
        _p(
            "p-glmn-tp2-dcp1-fa",
            2,
            1,
            ["clean", "repeat"],
            **FA_BF16,
        ),
        _p(
            "p-glmn-tp2-dcp2-fa",
            2,
            2,
            ["clean", "fault"],
            **FA_BF16,
        ),
    ],
    "noise": _patched_noise(
        {
            "TP=2 DCP=1 vs TP=1 (Triton)": ["p-glmn-tp1-dcp1", "p-glmn-tp2-dcp1", "clean", "clean"],
            "TP=1 repeated": ["p-glmn-tp1-dcp1", "p-glmn-tp1-dcp1", "clean", "repeat"],
            "TP=2 repeated": ["p-glmn-tp2-dcp1", "p-glmn-tp2-dcp1", "clean", "repeat"],
            "TP=2 DCP=2 repeated": ["p-glmn-tp2-dcp2", "p-glmn-tp2-dcp2", "clean", "repeat"],
            "FlashMLA TP=2 repeated": [
                "p-glmn-tp2-dcp1-flashmla",
                "p-glmn-tp2-dcp1-flashmla",
                "clean",
                "repeat",
            ],
            "FA bf16 TP=2 repeated": [
                "p-glmn-tp2-dcp1-fa",
                "p-glmn-tp2-dcp1-fa",
                "clean",
                "repeat",
            ],
        }
    ),
    "gates": {
        "p-glmn-tp2-dcp2-triton_mla_sparse_fp8_ds_mla": {
            "ref": "p-glmn-tp2-dcp1",
            "cand": "p-glmn-tp2-dcp2",
            "noise": PATCHED_NOISE,
        },
        "p-glmn-tp2-dcp2-flashmla_sparse": {
            "ref": "p-glmn-tp2-dcp1-flashmla",
            "cand": "p-glmn-tp2-dcp2-flashmla",
            "noise": PATCHED_NOISE,
        },
        "p-glmn-tp2-dcp2-flash_attn_mla_sparse-bf16": {
            "ref": "p-glmn-tp2-dcp1-fa",
            "cand": "p-glmn-tp2-dcp2-fa",
            "noise": PATCHED_NOISE,
        },
    },
}

# The series' TP = 1 reference on glmn (clean, repeat, sensitivity): the noise pairs and the
# sensitivity of the later queues' glmn gates compare against it.
P_GLMN_TP1 = next(r for r in PATCHED_MATRIX["runs"] if r["name"] == "p-glmn-tp1-dcp1")


def _variant_rows(
    tp: int,
    dcp: int,
    merges: list[str],
    mtps: list,
    routes: bool,
    suffix: str = "",
    prompts: dict[str, list[int]] | None = None,
) -> dict:
    """Merge backends, routes + wire (ledger on), MTP depths at TP=tp DCP=dcp, each against
    the Triton DCP=1 reference (kind dcp) and, where it is a variant of the DCP run, against
    that run (dcp_pair / wire / spec). ``suffix`` names the reference pair
    (``p-glmn-tp{tp}-dcp{1|dcp}{suffix}``) and prefixes the variants; ``prompts`` (default
    LIGHT) is what every variant serves."""
    base = f"p-glmn-tp{tp}-dcp{dcp}{suffix}"
    ref1 = f"p-glmn-tp{tp}-dcp1{suffix}"
    prompts = LIGHT if prompts is None else prompts
    runs, gates = [], {}
    fault = ["clean", "fault"]
    for m in merges:
        name = f"{base}-merge-{m}"
        extra = {"kernel_config": {"sparse_indexer_dcp_merge_backend": m}}
        runs.append(_p(name, tp, dcp, fault, extra, **prompts))
        gates[name] = {"ref": ref1, "cand": name, "noise": PATCHED_NOISE}
        gates[f"{name}-vs-auto"] = {
            "ref": base,
            "cand": name,
            "kind": "dcp_pair",
            "noise": PATCHED_NOISE,
        }
    if routes:
        ckv, fp8 = f"{base}-ckv", f"{base}-fp8wire"
        runs.append(_p(ckv, tp, dcp, fault, {**LEDGER, "dcp_prefill_route": "ckv"}, **prompts))
        runs.append(_p(fp8, tp, dcp, fault, {**LEDGER, "dcp_wire_dtype": "fp8"}, **prompts))
        gates[ckv] = {"ref": ref1, "cand": ckv, "noise": PATCHED_NOISE}
        gates[f"{ckv}-vs-query"] = {
            "ref": base,
            "cand": ckv,
            "kind": "dcp_pair",
            "noise": PATCHED_NOISE,
        }
        gates[f"{fp8}-vs-auto"] = {"ref": base, "cand": fp8, "kind": "wire", "noise": PATCHED_NOISE}
    for k in mtps:
        name = f"{base}-mtp{k}"
        runs.append(_p(name, tp, dcp, fault, {"speculative_config": _mtp(k)}, **prompts))
        gates[f"{name}-vs-nospec"] = {
            "ref": base,
            "cand": name,
            "kind": "spec",
            "noise": PATCHED_NOISE,
        }
    return {"runs": runs, "gates": gates}


# Each list in priority order: the Triton merge and the torch fallback (never run end to
# end) before CuTe DSL (what auto ran at every size until 2026-12-02), MTP k=2 and the
# adaptive ladder first.
_V2 = _variant_rows(2, 2, ["triton", "torch", "cutedsl"], [2, "adaptive", 4, 5, 1], True)


def _select(rows: dict, tag: str) -> dict[str, Any]:
    """The runs and gates of a _variant_rows result whose name holds tag, as a suite."""
    return {
        "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
        "runs": [r for r in rows["runs"] if tag in r["name"]],
        "noise": {},
        "gates": {k: v for k, v in rows["gates"].items() if tag in k},
    }


PATCHED_VARIANTS: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    # (5) merge backends, (6) routes + wire + ledger, (7) MTP, all at DCP=2
    "runs": _V2["runs"],
    "noise": {},
    "gates": _V2["gates"],
}
# The same rows as three suites, so that a lease queue can put other suites between them.
PATCHED_MERGES = _select(_V2, "-merge-")
PATCHED_MTP = _select(_V2, "-mtp")
PATCHED_ROUTES: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [r for r in _V2["runs"] if r not in PATCHED_MERGES["runs"] + PATCHED_MTP["runs"]],
    "noise": {},
    "gates": {
        k: v
        for k, v in _V2["gates"].items()
        if k not in PATCHED_MERGES["gates"] and k not in PATCHED_MTP["gates"]
    },
}

# DCP=4 (TP=4): the route and ledger first (bytes per rank per layer at DCP=4), then the
# merge backend and MTP extras "if they fit".
_V4 = _variant_rows(4, 4, ["torch"], [2], True)
PATCHED_DCP4: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [
        # patched-matrix's TP=1 run, for the TP=4 vs TP=1 noise pair
        P_GLMN_TP1,
        # its own sensitivity pass: measured at the gates' TP as well
        _p("p-glmn-tp4-dcp1", 4, 1, ["clean", "repeat", "sensitivity"], **LIGHT),
        _p("p-glmn-tp4-dcp4", 4, 4, ["clean", "fault"], LEDGER, **LIGHT),
        *[r for r in _V4["runs"] if "-merge-" not in r["name"] and "-mtp" not in r["name"]],
    ],
    "noise": _patched_noise(
        {
            "TP=4 repeated": ["p-glmn-tp4-dcp1", "p-glmn-tp4-dcp1", "clean", "repeat"],
            "TP=4 DCP=1 vs TP=1 (Triton)": ["p-glmn-tp1-dcp1", "p-glmn-tp4-dcp1", "clean", "clean"],
        }
    ),
    "gates": {
        "p-glmn-tp4-dcp4-triton_mla_sparse_fp8_ds_mla": {
            "ref": "p-glmn-tp4-dcp1",
            "cand": "p-glmn-tp4-dcp4",
            "noise": PATCHED_NOISE,
        },
        **{k: v for k, v in _V4["gates"].items() if "-merge-" not in k and "-mtp" not in k},
    },
}
PATCHED_DCP4_EXTRAS: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [r for r in _V4["runs"] if "-merge-" in r["name"] or "-mtp" in r["name"]],
    "noise": {},
    "gates": {k: v for k, v in _V4["gates"].items() if "-merge-" in k or "-mtp" in k},
}


def _dcp_pair(
    tp: int, dcp: int, tag: str, gate: str, noise_label: str, **kw: Any
) -> dict[str, Any]:
    """The series on glmn at TP = tp, DCP = dcp against DCP = 1 with the same settings (runs
    named ``p-glmn-tp{tp}-dcp{1|dcp}-{tag}``; ``kw`` into both runs): the reference repeated
    for the noise pair ``noise_label``, the candidate with its fault pass, one gate."""
    ref, cand = f"p-glmn-tp{tp}-dcp1-{tag}", f"p-glmn-tp{tp}-dcp{dcp}-{tag}"
    return {
        "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
        "runs": [
            _p(ref, tp, 1, ["clean", "repeat"], **kw),
            _p(cand, tp, dcp, ["clean", "fault"], **kw),
        ],
        "noise": _patched_noise({noise_label: [ref, ref, "clean", "repeat"]}),
        "gates": {gate: {"ref": ref, "cand": cand, "noise": PATCHED_NOISE}},
    }


# (8) FULL_AND_PIECEWISE CUDA graphs for the patched Triton backend
PATCHED_GRAPHS = _dcp_pair(
    2,
    2,
    "graphs",
    "p-glmn-tp2-dcp2-graphs-triton_mla_sparse_fp8_ds_mla",
    "TP=2 graphs repeated",
    graphs=True,
)


def _o_gain(args: list[str], gain: str) -> list[str]:
    out = list(args)
    out[out.index("--o-gain") + 1] = gain
    return out


# Calibration of a stronger needle. The 2026-12-01 lease's needle (``--o-gain 1``) moved the
# first step by 2.2-2.35x the tolerance, below the 5x `meaningful` margin. A larger attention
# output gain makes the needle's value a larger share of the residual stream, and so of the
# logits (the final RMSNorm keeps their scale, so the noise floor, one bf16 ULP of the logits,
# stays put unless the network turns chaotic). NEEDLE_ARGS now uses 3 (a bet: one lease cannot
# calibrate first and then re-run every gate), and this suite measures its neighbours 2 and 4,
# each with its own noise pairs and sensitivity at TP=1 and TP=2 (eager, stock), so the lease
# also shows whether 3 was the smallest sufficient gain.
CALIBRATE_GAINS = ("2", "4")
NEEDLE_CALIBRATE: dict[str, Any] = {
    "checkpoints": {
        f"glmn-o{g}": ["--arch", "glm", *_o_gain(NEEDLE_ARGS, g)] for g in CALIBRATE_GAINS
    },
    "runs": [
        run
        for g in CALIBRATE_GAINS
        for run in (
            _run(f"glmn-o{g}-tp1-dcp1", f"glmn-o{g}", 1, 1, ["clean", "repeat", "sensitivity"]),
            _run(f"glmn-o{g}-tp2-dcp1", f"glmn-o{g}", 2, 1, ["clean"]),
        )
    ],
    "noise": {
        k: v
        for g in CALIBRATE_GAINS
        for k, v in _noise(
            f"glmn-o{g}", f"glmn-o{g}-tp1-dcp1", f"glmn-o{g}-tp2-dcp1", [f"glmn-o{g}-tp1-dcp1"]
        ).items()
    },
    "gates": {},
}


SUITES = {
    "needle-eager": _needle_suite(False),
    "needle-calibrate": NEEDLE_CALIBRATE,
    "patched-matrix": PATCHED_MATRIX,
    "patched-variants": PATCHED_VARIANTS,
    "patched-merges": PATCHED_MERGES,
    "patched-mtp": PATCHED_MTP,
    "patched-routes": PATCHED_ROUTES,
    "patched-dcp4": PATCHED_DCP4,
    "needle-graphs": _needle_suite(True),
    "patched-graphs": PATCHED_GRAPHS,
    "patched-dcp4-extras": PATCHED_DCP4_EXTRAS,
    "stock-eager": STOCK_EAGER,
    "smoke": SMOKE,
}
# The one GPU lease, in priority order (what a deadline cuts is the end of this list).
# CUDA graphs of the series' backend come before the DCP=4 rows: DCP > 1 under FULL graphs is
# where upstream users report hangs (#46145); the DCP=4 ledger only adds bytes at a larger N.
LEASE = [
    "needle-eager",
    "patched-matrix",
    "patched-variants",
    "patched-graphs",
    "needle-graphs",
    "patched-dcp4",
    "patched-dcp4-extras",
]
# The next lease: every gate again on the answer needle, in priority order: the stock needle
# rows (noise floor and sensitivity of the new checkpoint), the series' matrix (each with its
# fault pass), the series' backend under FULL CUDA graphs at DCP=2 (never finished: cut in
# both leases of 2026-12-01), the merge backends end to end, the stock graph rows, MTP, the
# routes and wire (both gated on the first lease's checkpoint already), then the DCP=4 rows.
# The o-gain calibration suite is not in it: the CPU forward predicts a checkpoint's
# sensitivity before a lease (gate_ckpt_reference.py).
LEASE_NEXT = [
    "needle-eager",
    "patched-matrix",
    "patched-graphs",
    "patched-merges",
    "needle-graphs",
    "patched-mtp",
    "patched-routes",
    "patched-dcp4",
    "patched-dcp4-extras",
]

# The rows the 22:37Z lease did not reach (design/dcp-gates.md), with the references their
# gates need: the stock graph rows, the series' DCP=2 reference (also the MTP, route and wire
# rows' reference) and its noise runs, MTP, routes and wire, then DCP=4.
PATCHED_REFS: dict[str, Any] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [
        r
        for r in PATCHED_MATRIX["runs"]
        if r["name"] in ("p-glmn-tp1-dcp1", "p-glmn-tp2-dcp1", "p-glmn-tp2-dcp2")
    ],
    "noise": {
        k: v
        for k, v in PATCHED_MATRIX["noise"].items()
        if "FlashMLA" not in k and "FA bf16" not in k
    },
    "gates": {
        k: v
        for k, v in PATCHED_MATRIX["gates"].items()
        if k.endswith("triton_mla_sparse_fp8_ds_mla")
    },
}
SUITES["patched-refs"] = PATCHED_REFS


def _first(names: list[str], suites: list[str]) -> dict[str, Any]:
    """The named runs of the named suites, in the order given, as a suite with no gates:
    put first in a queue, it moves those runs forward (merge_suites keeps a name's first
    place) while their suites still bring the gates and noise pairs."""
    runs = {r["name"]: r for n in suites for r in SUITES[n]["runs"]}
    known = {k: v for n in suites for k, v in SUITES[n]["checkpoints"].items()}
    picked = [runs[n] for n in names]
    checkpoints = {r["model"][1:]: known[r["model"][1:]] for r in picked}
    return {"checkpoints": checkpoints, "runs": picked, "noise": {}, "gates": {}}


# In every lease so far MTP under DCP was cut (it came last). Here the series' DCP=2
# reference, the stock GLM TP=4 FULL-graph reference, MTP k=2 and the adaptive ladder, the
# stock GLM FULL-graph DCP rows (DCP > 1 under FULL graphs: upstream #46145), then the DCP=2
# route and wire come before the V3.2 graph rows, the other depths and DCP=4 (warm-up runs
# still go first).
SUITES["rest-first"] = _first(
    [
        "p-glmn-tp2-dcp2",
        "glmn-tp4-dcp1-graphs",
        "p-glmn-tp2-dcp2-mtp2",
        "p-glmn-tp2-dcp2-mtpadaptive",
        "glmn-tp4-dcp2-graphs",
        "glmn-tp4-dcp4-graphs",
        "p-glmn-tp2-dcp2-ckv",
        "p-glmn-tp2-dcp2-fp8wire",
    ],
    ["needle-graphs", "patched-refs", "patched-mtp", "patched-routes"],
)
LEASE_REST = [
    "rest-first",
    "needle-graphs",
    "patched-refs",
    "patched-mtp",
    "patched-routes",
    "patched-dcp4",
    "patched-dcp4-extras",
]


# MTP with accepted drafts. Every MTP gate before 2026-12-02 had 0 accepted drafts (the
# needle checkpoint's MTP layer is random), so the draft model's own attention under DCP was
# never exercised. glmnm is glmn (the same target tensors) with an MTP layer that retrieves
# the needle through its own attention and then drafts the answer, which the target writes at
# every step (make_dsa_gate_ckpt.add_mtp_answer): its drafts are accepted exactly when the
# draft's attention over its DCP-sharded cache is right. Gates: speculative == not at DCP = 2
# (spec) and DCP = 2 == DCP = 1 with the same depth, acceptance included (accept).
MTP_ACCEPT_CKPT = ["--arch", "glm", *NEEDLE_ARGS, "--needle-knob", "mtp_answer_logit=14"]
MTP_ACCEPT_NOISE = "glmnm/patched"


def _mtp_accept_suite(depths: tuple, tp: int = 2, dcp: int = 2) -> dict[str, Any]:
    def p(name: str, tp: int, dcp: int, passes: list[str], extra=None, **kw) -> dict[str, Any]:
        return _p(name, tp, dcp, passes, extra, ckpt="glmnm", **{**LIGHT, **kw})

    ref1, refd = f"p-glmnm-tp{tp}-dcp1", f"p-glmnm-tp{tp}-dcp{dcp}"
    runs = [
        p("p-glmnm-tp1-dcp1", 1, 1, ["clean", "repeat", "sensitivity"], warmup=True),
        # TP = 2: a warm-up run too (the 04:03Z lease); TP = 4 waits for the warm-ups
        p(ref1, tp, 1, ["clean", "repeat"], warmup=tp == 2),
        p(refd, tp, dcp, ["clean", "repeat", "fault"]),
    ]
    gates: dict[str, Any] = {}
    for k in depths:
        spec = {"speculative_config": _mtp(k)}
        one, two = f"{ref1}-mtp{k}", f"{refd}-mtp{k}"
        runs += [p(two, tp, dcp, ["clean", "fault"], spec), p(one, tp, 1, ["clean"], spec)]
        gates[f"{two}-vs-nospec"] = {
            "ref": refd,
            "cand": two,
            "kind": "spec",
            "noise": MTP_ACCEPT_NOISE,
        }
        gates[f"{two}-accept"] = {
            "ref": one,
            "cand": two,
            "kind": "accept",
            "noise": MTP_ACCEPT_NOISE,
        }
    noise = _patched_noise(
        {
            f"TP={tp} DCP=1 vs TP=1": ["p-glmnm-tp1-dcp1", ref1, "clean", "clean"],
            "TP=1 repeated": ["p-glmnm-tp1-dcp1", "p-glmnm-tp1-dcp1", "clean", "repeat"],
            f"TP={tp} repeated": [ref1, ref1, "clean", "repeat"],
            f"TP={tp} DCP={dcp} repeated": [refd, refd, "clean", "repeat"],
        },
        MTP_ACCEPT_NOISE,
    )
    return {"checkpoints": {"glmnm": MTP_ACCEPT_CKPT}, "runs": runs, "noise": noise, "gates": gates}


SUITES["patched-mtp-accept"] = _mtp_accept_suite((2, "adaptive", 4))


# DeepSeek-V3.2 at DCP = 4 (TP = 4: 8 local heads, 32 gathered), stock FlashMLA-sparse, eager:
# the issue-12 matrix's DCP = 4 row for the V3.2 geometry (its A2A-free AG+RS combine).
NEEDLE_V32_TP4: dict[str, Any] = {
    "checkpoints": {"v32n": NEEDLE_CKPTS["v32n"]},
    "runs": [
        _run("v32n-tp1-dcp1", "v32n", 1, 1, ["clean", "repeat", "sensitivity"], warmup=True),
        _run("v32n-tp4-dcp1", "v32n", 4, 1, ["clean", "repeat", "sensitivity"]),
        _run("v32n-tp4-dcp4", "v32n", 4, 4, ["clean", "fault"]),
    ],
    "noise": {
        "v32n: TP=4 DCP=1 vs TP=1": ["v32n", "v32n-tp1-dcp1", "v32n-tp4-dcp1", "clean", "clean"],
        "v32n: v32n-tp4-dcp1 repeated": [
            "v32n",
            "v32n-tp4-dcp1",
            "v32n-tp4-dcp1",
            "clean",
            "repeat",
        ],
    },
    "gates": {"v32n-tp4-dcp4-eager": ["v32n-tp4-dcp1", "v32n-tp4-dcp4"]},
}
SUITES["needle-v32-tp4"] = NEEDLE_V32_TP4
# The other MTP depths at DCP = 4 (patched-dcp4-extras has k = 2), each against the
# non-speculative TP = 4 DCP = 4 run: the matrix asks for k = 1, 2, 4, 5 and the adaptive
# ladder at DCP = 2 and 4.
_V4_MTP = _variant_rows(4, 4, [], [2, "adaptive", 4, 5, 1], False)
SUITES["patched-dcp4-mtp"] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": _V4_MTP["runs"],
    "noise": {},
    "gates": _V4_MTP["gates"],
}
# After the 2026-12-02 01:20Z lease, what issue 12 still lacks: MTP with accepted drafts,
# the DCP = 4 rows of the series (its TP = 4 DCP = 4 run served a clean pass before the
# deadline cut it), then V3.2 at DCP = 4, then the other MTP depths at DCP = 4.
LEASE_OPEN = [
    "patched-mtp-accept",
    "patched-dcp4",
    "patched-dcp4-extras",
    "needle-v32-tp4",
    "patched-dcp4-mtp",
]

# After the 2026-12-02 04:03Z lease: what it did not reach. The series' DCP = 4 references
# (TP = 1, TP = 4 DCP = 1 and the non-speculative TP = 4 DCP = 4 run, which the MTP gates
# compare against) without the route, wire and merge runs that passed there, then MTP
# k = 2 and the adaptive ladder at DCP = 4, V3.2 at TP = 4 DCP = 4, the other depths.
SUITES["patched-dcp4-core"] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [r for r in PATCHED_DCP4["runs"] if r["name"].endswith(("-dcp1", "-dcp4"))],
    "noise": PATCHED_DCP4["noise"],
    "gates": {k: v for k, v in PATCHED_DCP4["gates"].items() if k.endswith("fp8_ds_mla")},
}
SUITES["dcp4-rest-first"] = _first(
    [
        "p-glmn-tp4-dcp1",
        "p-glmn-tp4-dcp4",
        "p-glmn-tp4-dcp4-mtp2",
        "p-glmn-tp4-dcp4-mtpadaptive",
        "v32n-tp4-dcp1",
        "v32n-tp4-dcp4",
    ],
    ["patched-dcp4-core", "patched-dcp4-mtp", "needle-v32-tp4"],
)
LEASE_DCP4_REST = [
    "dcp4-rest-first",
    "patched-dcp4-core",
    "patched-dcp4-mtp",
    "needle-v32-tp4",
]


def merge_suites(suites: list[dict[str, Any]]) -> dict[str, Any]:
    """Several suites as one queue: runs in the given order (first definition of a name
    wins), warm-up runs moved to the front, checkpoints, noise pairs and gates united."""
    out: dict[str, Any] = {"checkpoints": {}, "runs": [], "noise": {}, "gates": {}}
    seen = set()
    for suite in suites:
        for k, v in suite.get("checkpoints", {}).items():
            if out["checkpoints"].setdefault(k, v) != v:
                raise ValueError(f"checkpoint {k!r} is defined twice, differently")
        for run in suite.get("runs", []):
            if run["name"] not in seen:
                seen.add(run["name"])
                out["runs"].append(run)
        out["noise"].update(suite.get("noise", {}))
        out["gates"].update(suite.get("gates", {}))
    out["runs"].sort(key=lambda r: not r.get("warmup", False))  # stable: priority kept
    return out


def patched_suite(backend: str, kv_cache_dtype: str | None = "fp8_ds_mla") -> dict[str, Any]:
    """The series' backend on the patched tree, DCP=2 against DCP=1 (GLM at TP=2: 32 local
    heads, the case stock FlashMLA-sparse refuses), plus the reference for the noise floor,
    on the needle checkpoint."""
    b = {"backend": backend, "kv_cache_dtype": kv_cache_dtype, "variant": "patched"}
    runs = [
        {**_run("p-glmn-tp1-dcp1", "glmn", 1, 1, ["clean", "repeat", "sensitivity"]), **b},
        {**_run("p-glmn-tp2-dcp1", "glmn", 2, 1, ["clean", "repeat"]), **b},
        {**_run("p-glmn-tp2-dcp2", "glmn", 2, 2, ["clean", "fault"]), **b},
    ]
    return {
        "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
        "runs": runs,
        "noise": _noise(
            "glmn", "p-glmn-tp1-dcp1", "p-glmn-tp2-dcp1", ["p-glmn-tp1-dcp1", "p-glmn-tp2-dcp1"]
        ),
        "gates": {f"p-glmn-tp2-dcp2-{backend.lower()}": ["p-glmn-tp2-dcp1", "p-glmn-tp2-dcp2"]},
    }


# After the 2026-12-02 06:15Z lease, the rest of the issue-12 matrix at DCP = 4, in priority
# order: accepted drafts at DCP = 4 (glmnm, k = 2: the draft's own attention over a
# four-way-sharded cache), the series' DCP = 4 references, the series at DCP = 4 on a 32k
# prompt, the series under FULL CUDA graphs at
# DCP = 4, the MTP depths the lease left running (k = 4, 5, 1), the Triton merge
# end to end at DCP = 4 (torch ran there), FA-sparse on a bf16 cache at DCP = 4, and V3.2
# under FULL graphs at DCP = 4.
SUITES["patched-mtp-accept-dcp4"] = _mtp_accept_suite((2,), tp=4, dcp=4)
SUITES["patched-graphs-dcp4"] = _dcp_pair(
    4,
    4,
    "graphs",
    "p-glmn-tp4-dcp4-graphs-triton_mla_sparse_fp8_ds_mla",
    "TP=4 graphs repeated",
    graphs=True,
    **LIGHT,
)
# The series at DCP = 4 on a 32k prompt (the DCP = 4 rows above are 1k/8k + batch): its own
# TP = 4 DCP = 1 reference, and a noise pair against the TP = 1 run, which serves 32k.
_LONG = {"lens": [32000], "batch_lens": []}


def _long_core(tp: int, dcp: int) -> dict[str, Any]:
    """The series' Triton backend at TP = tp, DCP = dcp against DCP = 1 on the 32k prompt
    alone (runs ``p-glmn-tp{tp}-dcp{1|dcp}-32k``), with the TP = 1 run as the reference's
    noise partner."""
    ref, cand = f"p-glmn-tp{tp}-dcp1-32k", f"p-glmn-tp{tp}-dcp{dcp}-32k"
    return {
        "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
        "runs": [
            _p(ref, tp, 1, ["clean"], **_LONG),
            _p(cand, tp, dcp, ["clean", "fault"], **_LONG),
            P_GLMN_TP1,
        ],
        "noise": _patched_noise(
            {f"TP={tp} DCP=1 vs TP=1 (32k)": ["p-glmn-tp1-dcp1", ref, "clean", "clean"]}
        ),
        "gates": {
            f"{cand}-triton_mla_sparse_fp8_ds_mla": {
                "ref": ref,
                "cand": cand,
                "noise": PATCHED_NOISE,
            }
        },
    }


SUITES["patched-dcp4-32k"] = _long_core(4, 4)
SUITES["patched-dcp4-mtp-rest"] = _select(_variant_rows(4, 4, [], [4, 5, 1], False), "-mtp")
# CuTe DSL is what `auto` runs at DCP = 4 (2048 candidates a row; every rank of the 06:15Z
# lease's p-glmn-tp4-dcp4 and its MTP runs recorded merge_backends_seen == ["cutedsl"]), so
# the DCP = 4 core gate already runs it end to end: only the Triton merge gets its own run.
SUITES["patched-dcp4-merges"] = _select(_variant_rows(4, 4, ["triton"], [], False), "-merge-")
SUITES["patched-fa-dcp4"] = _dcp_pair(
    4,
    4,
    "fa",
    "p-glmn-tp4-dcp4-flash_attn_mla_sparse-bf16",
    "FA bf16 TP=4 repeated",
    **FA_BF16,
    **LIGHT,
)
SUITES["needle-v32-tp4-graphs"] = {
    "checkpoints": {"v32n": NEEDLE_CKPTS["v32n"]},
    "runs": [
        _run("v32n-tp4-dcp1-graphs", "v32n", 4, 1, ["clean", "repeat", "sensitivity"], True),
        _run("v32n-tp4-dcp4-graphs", "v32n", 4, 4, ["clean", "fault"], True),
        # V3.2's TP = 1 reference, not a warm-up here: the graph rows come last
        {**NEEDLE_V32_TP4["runs"][0], "warmup": False},
    ],
    "noise": {
        "v32n: TP=4 DCP=1 vs TP=1 (graphs)": [
            "v32n",
            "v32n-tp1-dcp1",
            "v32n-tp4-dcp1-graphs",
            "clean",
            "clean",
        ],
        "v32n: v32n-tp4-dcp1-graphs repeated": [
            "v32n",
            "v32n-tp4-dcp1-graphs",
            "v32n-tp4-dcp1-graphs",
            "clean",
            "repeat",
        ],
    },
    "gates": {"v32n-tp4-dcp4-graphs": ["v32n-tp4-dcp1-graphs", "v32n-tp4-dcp4-graphs"]},
}
SUITES["dcp4-final-first"] = _first(
    [
        "p-glmnm-tp4-dcp1",
        "p-glmnm-tp4-dcp4",
        "p-glmnm-tp4-dcp4-mtp2",
        "p-glmnm-tp4-dcp1-mtp2",
        "p-glmn-tp4-dcp1",
        "p-glmn-tp4-dcp4",
        "p-glmn-tp4-dcp1-32k",
        "p-glmn-tp4-dcp4-32k",
        "p-glmn-tp4-dcp1-graphs",
        "p-glmn-tp4-dcp4-graphs",
    ],
    ["patched-mtp-accept-dcp4", "patched-dcp4-core", "patched-dcp4-32k", "patched-graphs-dcp4"],
)
LEASE_DCP4_FINAL = [
    "dcp4-final-first",
    "patched-mtp-accept-dcp4",
    "patched-dcp4-core",
    "patched-dcp4-32k",
    "patched-graphs-dcp4",
    "patched-dcp4-mtp-rest",
    "patched-dcp4-merges",
    "patched-fa-dcp4",
    "needle-v32-tp4-graphs",
]

# After the 2026-12-02 09:58Z lease (accepted drafts, the series' core, 32k and FULL-graph rows
# at DCP = 4 gated there): what its deadline cut, in the matrix's order of need. MTP k = 4, 5
# and 1 at DCP = 4 (k = 4 served its clean pass equivalent, its fault pass never ran), each
# against the non-speculative TP = 4 DCP = 4 run; FA-sparse on a bf16 cache at DCP = 4; V3.2
# under FULL graphs at DCP = 4; the Triton merge at DCP = 4 last (the series' own selector:
# `auto` runs CuTe DSL at that size).
SUITES["dcp4-last-first"] = _first(
    [
        "p-glmn-tp4-dcp1",
        "p-glmn-tp4-dcp4",
        "p-glmn-tp4-dcp4-mtp4",
        "p-glmn-tp4-dcp4-mtp5",
        "p-glmn-tp4-dcp4-mtp1",
        "p-glmn-tp4-dcp1-fa",
        "p-glmn-tp4-dcp4-fa",
    ],
    ["patched-dcp4-core", "patched-dcp4-mtp-rest", "patched-fa-dcp4"],
)
LEASE_DCP4_LAST = [
    "dcp4-last-first",
    "patched-dcp4-core",
    "patched-dcp4-mtp-rest",
    "patched-fa-dcp4",
    "needle-v32-tp4-graphs",
    "patched-dcp4-merges",
]

# After the 2026-12-02 12:35Z lease (MTP k = 1/4/5 and FA-sparse bf16 gated at DCP = 4
# there): the rows still open, in the matrix's order of need. V3.2 under FULL graphs at
# DCP = 4 (cut by the deadline in its clean pass, after serving the 1k, 8k and 32k prompts
# under graphs without a hang); the attention paths gated eager only so far, under FULL
# graphs: FlashMLA-sparse with 32 local heads (TP = 2 DCP = 2, the case stock refuses) and
# FA-sparse on a bf16 cache (DCP = 2, then DCP = 4 last); the Triton merge at DCP = 4.
# Both backends declare UNIFORM_BATCH CUDA-graph support in 0.33, so FULL_AND_PIECEWISE
# captures their uniform decode batches.
SUITES["patched-flashmla-graphs"] = _dcp_pair(
    2,
    2,
    "flashmla-graphs",
    "p-glmn-tp2-dcp2-graphs-flashmla_sparse",
    "FlashMLA TP=2 graphs repeated",
    graphs=True,
    **FLASHMLA,
)
SUITES["patched-fa-graphs"] = _dcp_pair(
    2,
    2,
    "fa-graphs",
    "p-glmn-tp2-dcp2-graphs-flash_attn_mla_sparse-bf16",
    "FA bf16 TP=2 graphs repeated",
    graphs=True,
    **FA_BF16,
)
SUITES["patched-fa-graphs-dcp4"] = _dcp_pair(
    4,
    4,
    "fa-graphs",
    "p-glmn-tp4-dcp4-graphs-flash_attn_mla_sparse-bf16",
    "FA bf16 TP=4 graphs repeated",
    graphs=True,
    **FA_BF16,
    **LIGHT,
)
# the TP = 1 reference whose sensitivity pass the glmn gates above state
SUITES["patched-tp1"] = {
    "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
    "runs": [P_GLMN_TP1],
    "noise": {},
    "gates": {},
}
# After the 2026-12-02 15:27Z lease (every row above gated, eager and under FULL graphs):
# FlashMLA-sparse with >= 32 local heads at DCP = 4. 64-head glmn reaches 32 local heads
# only at TP = 2 (DCP <= 2); DeepSeek-V3.2's own 128 heads give 32 local heads at TP = 4 and
# DCP = 4 gathers 128, the widest envelope 0006 serves (the 4-GPU deployment of the real
# model). Patched tree, FLASHMLA_SPARSE fp8_ds_mla, its own noise group and sensitivity;
# eager and FULL graphs at TP = 4 DCP = 4, and TP = 2 DCP = 2 (64 local heads) eager.
V32W_NOISE = "v32w/patched"


def _w(name: str, tp: int, dcp: int, passes: list[str], **kw: Any) -> dict[str, Any]:
    return _p(name, tp, dcp, passes, ckpt="v32w", **{**FLASHMLA, **kw})


SUITES["patched-wide-heads"] = {
    "checkpoints": {"v32w": NEEDLE_CKPTS["v32w"]},
    "runs": [
        _w("p-v32w-tp1-dcp1", 1, 1, ["clean", "repeat", "sensitivity"], warmup=True),
        _w("p-v32w-tp4-dcp1", 4, 1, ["clean", "repeat", "sensitivity"]),
        _w("p-v32w-tp4-dcp4", 4, 4, ["clean", "fault"]),
        _w("p-v32w-tp4-dcp1-graphs", 4, 1, ["clean", "repeat"], graphs=True),
        _w("p-v32w-tp4-dcp4-graphs", 4, 4, ["clean", "fault"], graphs=True),
        _w("p-v32w-tp2-dcp1", 2, 1, ["clean", "repeat"], **LIGHT),
        _w("p-v32w-tp2-dcp2", 2, 2, ["clean", "fault"], **LIGHT),
    ],
    "noise": _patched_noise(
        {
            "TP=4 DCP=1 vs TP=1": ["p-v32w-tp1-dcp1", "p-v32w-tp4-dcp1", "clean", "clean"],
            "TP=4 repeated": ["p-v32w-tp4-dcp1", "p-v32w-tp4-dcp1", "clean", "repeat"],
            "TP=4 graphs repeated": [
                "p-v32w-tp4-dcp1-graphs",
                "p-v32w-tp4-dcp1-graphs",
                "clean",
                "repeat",
            ],
            "TP=2 repeated": ["p-v32w-tp2-dcp1", "p-v32w-tp2-dcp1", "clean", "repeat"],
        },
        V32W_NOISE,
    ),
    "gates": {
        "p-v32w-tp4-dcp4-flashmla_sparse": {
            "ref": "p-v32w-tp4-dcp1",
            "cand": "p-v32w-tp4-dcp4",
            "noise": V32W_NOISE,
        },
        "p-v32w-tp4-dcp4-graphs-flashmla_sparse": {
            "ref": "p-v32w-tp4-dcp1-graphs",
            "cand": "p-v32w-tp4-dcp4-graphs",
            "noise": V32W_NOISE,
        },
        "p-v32w-tp2-dcp2-flashmla_sparse": {
            "ref": "p-v32w-tp2-dcp1",
            "cand": "p-v32w-tp2-dcp2",
            "noise": V32W_NOISE,
        },
    },
}
LEASE_WIDE_HEADS = ["patched-wide-heads"]


# After the 2026-12-02 23:26Z lease (every row gated, FlashMLA-sparse at 32 local heads and
# DCP = 4 included): the 32k prompt on the rows that served only the 1k and 8k singles and
# the batch (LIGHT; its longest request is 17000 tokens). Each suite has its own 32k-only
# references, so nothing depends on an earlier lease's runs or series revision: the TP = 1
# run (sensitivity, noise partner), the Triton pair at TP = 4 (the patched-dcp4-32k runs,
# measured at 111 s and 265 s in the 09:58Z lease), FA-sparse on a bf16 cache and both
# backends under FULL graphs at DCP = 4; then every DCP = 4 variant (merges, routes + wire,
# MTP depths) and the same at DCP = 2. Priority: the attention paths, DCP = 4 before DCP = 2.
def _long_pair(tp: int, dcp: int, tag: str, gate: str, label: str, **kw: Any) -> dict[str, Any]:
    """_dcp_pair on the 32k prompt alone."""
    return _dcp_pair(tp, dcp, tag, gate, f"{label} (32k)", **_LONG, **kw)


def _long_variants(tp: int, dcp: int, merges: list[str], mtps: list) -> dict[str, Any]:
    """The variant rows at TP = tp, DCP = dcp on the 32k prompt, against the 32k-only Triton
    references ``p-glmn-tp{tp}-dcp{1|dcp}-32k``."""
    rows = _variant_rows(tp, dcp, merges, mtps, True, suffix="-32k", prompts=_LONG)
    return _select(rows, "-32k")


SUITES["patched-32k-dcp4"] = merge_suites(
    [
        SUITES["patched-dcp4-32k"],
        _long_pair(
            4,
            4,
            "fa-32k",
            "p-glmn-tp4-dcp4-32k-flash_attn_mla_sparse-bf16",
            "FA bf16 TP=4 repeated",
            **FA_BF16,
        ),
        _long_pair(
            4,
            4,
            "graphs-32k",
            "p-glmn-tp4-dcp4-32k-graphs-triton_mla_sparse_fp8_ds_mla",
            "TP=4 graphs repeated",
            graphs=True,
        ),
        _long_pair(
            4,
            4,
            "fa-graphs-32k",
            "p-glmn-tp4-dcp4-32k-graphs-flash_attn_mla_sparse-bf16",
            "FA bf16 TP=4 graphs repeated",
            graphs=True,
            **FA_BF16,
        ),
    ]
)
SUITES["patched-32k-dcp4-variants"] = _long_variants(
    4, 4, ["triton", "torch"], [2, "adaptive", 4, 5, 1]
)
SUITES["patched-32k-dcp2"] = merge_suites(
    [
        _long_core(2, 2),
        _long_variants(2, 2, ["triton", "torch", "cutedsl"], [2, "adaptive", 4, 5, 1]),
    ]
)
LEASE_LONG = ["patched-32k-dcp4", "patched-32k-dcp4-variants", "patched-32k-dcp2"]

LEASE_GRAPHS_END = [
    "patched-tp1",
    "needle-v32-tp4-graphs",
    "patched-flashmla-graphs",
    "patched-fa-graphs",
    "patched-dcp4-core",
    "patched-dcp4-merges",
    "patched-fa-graphs-dcp4",
]

# The queues `--suites <name>` accepts, each what the leases before it did not reach.
LEASES: dict[str, list[str]] = {
    "lease": LEASE,
    "lease-next": LEASE_NEXT,
    "lease-rest": LEASE_REST,
    "lease-open": LEASE_OPEN,
    "lease-dcp4-rest": LEASE_DCP4_REST,
    "lease-dcp4-final": LEASE_DCP4_FINAL,
    "lease-dcp4-last": LEASE_DCP4_LAST,
    "lease-graphs-end": LEASE_GRAPHS_END,
    "lease-wide-heads": LEASE_WIDE_HEADS,
    "lease-long": LEASE_LONG,
}
