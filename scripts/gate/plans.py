# SPDX-License-Identifier: Apache-2.0
"""The named suites of scripts/dcp_gate.py: which runs, which noise pairs, which gates.

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
"""

from __future__ import annotations

from typing import Any

FLASHMLA = {"backend": "FLASHMLA_SPARSE", "kv_cache_dtype": "fp8_ds_mla"}
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


def _noise(ckpt: str, tp1: str, tp2: str, repeats: list[str]) -> dict[str, list]:
    out = {f"{ckpt}: TP=2 DCP=1 vs TP=1": [ckpt, tp1, tp2, "clean", "clean"]}
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
NEEDLE_ARGS = [
    "--qk-gain",
    "1",
    "--o-gain",
    "1",
    "--down-gain",
    "0.25",
    "--head-gain",
    "1",
    "--needle",
    "7",
    "--needle-knob",
    "attn_margin=9",
]
NEEDLE_CKPTS = {"glmn": ["--arch", "glm", *NEEDLE_ARGS], "v32n": ["--arch", "v32", *NEEDLE_ARGS]}


def _needle_suite(graphs: bool) -> dict[str, Any]:
    tag = "-graphs" if graphs else ""
    runs = [
        _run("glmn-tp1-dcp1", "glmn", 1, 1, ["clean", "repeat", "sensitivity"]),
        _run("glmn-tp2-dcp1", "glmn", 2, 1, ["clean"]),
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
            "v32n", "v32n-tp1-dcp1", f"v32n-tp2-dcp1{tag}", ["v32n-tp1-dcp1", f"v32n-tp2-dcp1{tag}"]
        ),
        "gates": {
            f"glmn-tp4-dcp2{gate}": [f"glmn-tp4-dcp1{tag}", f"glmn-tp4-dcp2{tag}"],
            f"glmn-tp4-dcp4{gate}": [f"glmn-tp4-dcp1{tag}", f"glmn-tp4-dcp4{tag}"],
            f"v32n-tp2-dcp2{gate}": [f"v32n-tp2-dcp1{tag}", f"v32n-tp2-dcp2{tag}"],
        },
    }


SUITES = {
    "needle-eager": _needle_suite(False),
    "needle-graphs": _needle_suite(True),
    "stock-eager": STOCK_EAGER,
    "smoke": SMOKE,
}


def patched_suite(backend: str, kv_cache_dtype: str | None = "fp8_ds_mla") -> dict[str, Any]:
    """The series' backend on the patched tree, DCP=2 against DCP=1 (GLM at TP=2: 32 local
    heads, the case stock FlashMLA-sparse refuses), plus the reference for the noise floor,
    on the needle checkpoint."""
    b = {"backend": backend, "kv_cache_dtype": kv_cache_dtype}
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
