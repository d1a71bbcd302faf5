# SPDX-License-Identifier: Apache-2.0
"""The long-prompt gates (128k, 256k, 1M tokens) on CPU: the checkpoint's
``--max-position-embeddings``, prefix caching in a gate run, the gate's candidate pass and
control run, the needle-retrieval report, the KV-cache and time budget (evidence/gate/budget.py)
and the long suites themselves."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(EVIDENCE / "tests" / "support"))

import make_dsa_gate_ckpt as ck  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

# config.json of the default arguments as every checkpoint before --max-position-embeddings
# wrote it (sha256 of json.dumps(config, indent=1) + "\n", taken from that revision, f84b4bb)
DEFAULT_CONFIG_SHA256 = {
    ("glm", None): "cd25b2167d74d67ec2644910efc27aedb3e9066a4737011b9f411d8f2afd223a",
    ("v32", None): "f797ac0ffc6b534c6e74fd16872c40b42cd3d854fb807491e458eb8848cb0e01",
    ("v32", 128): "ab43f20d32bf701363b6c1fb738b5c70e076e693a6faf4a6cacb405130d8f1ee",
}


def _config_text(cfg: dict) -> str:
    return json.dumps(cfg, indent=1) + "\n"  # what make_dsa_gate_ckpt.main writes


@pytest.mark.parametrize("arch, heads", sorted(DEFAULT_CONFIG_SHA256, key=str))
def test_the_default_max_position_embeddings_keeps_every_config_byte_for_byte(arch, heads):
    """Without the flag (and with its default given) config.json is what it always was."""
    for cfg in (
        ck.make_config(arch, heads=heads),
        ck.make_config(arch, heads=heads, max_position_embeddings=65536),
    ):
        digest = hashlib.sha256(_config_text(cfg).encode()).hexdigest()
        assert digest == DEFAULT_CONFIG_SHA256[(arch, heads)]
    args = ck.parser().parse_args(["--arch", arch, "--out", "/nonexistent"])
    assert args.max_position_embeddings == ck.DEFAULT_MAX_POSITIONS == 65536


def test_max_position_embeddings_changes_that_field_only_and_is_validated():
    base = ck.make_config("glm")
    long = ck.make_config("glm", max_position_embeddings=1_114_112)
    assert long["max_position_embeddings"] == 1_114_112
    assert {k for k in base if base[k] != long[k]} == {"max_position_embeddings"}
    assert list(long) == list(base)  # same key order: the text differs in that value only
    for bad in (0, -1):
        with pytest.raises(SystemExit, match="must be >= 1"):
            ck.make_config("glm", max_position_embeddings=bad)
    with pytest.raises(SystemExit, match="must be an int"):
        ck.make_config("glm", max_position_embeddings=True)
    args = ck.parser().parse_args(
        ["--arch", "v32", "--max-position-embeddings", "1114112", "--out", "/x"]
    )
    assert args.max_position_embeddings == 1_114_112


TENSORS_PROBE = r"""
import json
import torch
import make_dsa_gate_ckpt as mk

# one layer keeps it quick; the needle and the answer calibration (gate_refmodel's forward)
# run as for the named checkpoints
base = ["--arch", "glm", "--layers", "1", "--qk-gain", "1", "--o-gain", "3", "--needle", "7",
        "--needle-knob", "answer_logit=7", "--out", "/nonexistent"]
out = {}
for extra in ([], ["--max-position-embeddings", "1114112"]):
    cfg, _, tensors, needle = mk.make_tensors(mk.parser().parse_args(base + extra))
    out[str(cfg["max_position_embeddings"])] = (tensors, needle)
(a, na), (b, nb) = out.values()
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print(json.dumps({"same": same, "needles_equal": na == nb, "keys": list(out),
                  "answer": na.get("answer_id")}))
"""


@needs_venv
def test_the_tensors_do_not_depend_on_max_position_embeddings():
    """The seeded init, the needle and the answer calibration give the same tensors with a
    longer max_position_embeddings (so glmn1m's weights are glmn's)."""
    got = run_probe(TENSORS_PROBE, timeout=900)
    assert got == {
        "same": True,
        "needles_equal": True,
        "keys": ["65536", "1114112"],
        "answer": 31999,
    }


# --- prefix caching in a gate run -------------------------------------------------------------


def test_prefix_caching_is_off_by_default_and_reaches_the_engine():
    from gate import plan, worker

    off = plan.GateConfig(name="o", model="m")
    assert off.enable_prefix_caching is False
    assert worker.engine_kwargs(off)["enable_prefix_caching"] is False
    on = plan.GateConfig(
        name="p", model="m", tp=4, dcp=4, passes=("clean", "repeat"), enable_prefix_caching=True
    )
    assert worker.engine_kwargs(on)["enable_prefix_caching"] is True
    assert plan.GateConfig.from_json(on.to_json()) == on


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"tp": 2, "dcp": 2, "passes": ("clean", "fault"), "enable_prefix_caching": True},
            "needs enable_prefix_caching false",
        ),
        ({"enable_prefix_caching": 1}, "must be a bool"),
        (
            {
                "tp": 2,
                "dcp": 2,
                "variant": "patched",
                "backend": "TRITON_MLA_SPARSE_FP8_DS_MLA",
                "kv_cache_dtype": "auto",
                "engine_extra": {"dcp_prefill_route": "packed_ckv"},
            },
            "kv_cache_dtype must be 'fp8_ds_mla'",
        ),
        (
            {
                "tp": 2,
                "dcp": 2,
                "variant": "patched",
                "backend": "FLASHINFER_MLA_SPARSE",
                "kv_cache_dtype": "fp8_ds_mla",
                "engine_extra": {"dcp_prefill_route": "packed_ckv"},
            },
            "valid: TRITON_MLA_SPARSE_FP8_DS_MLA, FLASHMLA_SPARSE",
        ),
    ],
)
def test_prefix_caching_and_the_packed_route_are_refused_where_they_cannot_run(kw, message):
    from gate import plan

    with pytest.raises(ValueError, match=message):
        plan.GateConfig(name="x", model="m", **kw)
    # the same configurations without the offending setting are accepted
    fixed = dict(kw)
    if "enable_prefix_caching" in fixed:
        fixed["enable_prefix_caching"] = False
    else:
        fixed.update(kv_cache_dtype="fp8_ds_mla", backend="FLASHMLA_SPARSE")
    plan.GateConfig(name="x", model="m", **fixed)
