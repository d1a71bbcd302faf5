# SPDX-License-Identifier: Apache-2.0
"""evidence/make_mtp_cost_ckpt.py: the cost-realistic MTP checkpoint. The geometry's byte
counts in pure Python; the written weights, read back and run through the closed-form target
and MTP layer in the test venv (torch, safetensors: skipped without it), draft exactly the
tables of mtp_acceptance.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import make_mtp_cost_ckpt as mk  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

TINY = {
    "layers": 2,
    "hidden": 256,
    "heads": 2,
    "experts": 8,
    "top_k": 2,
    "moe_intermediate": 32,
    "vocab": 15000,
    "max_positions": 4096,
}


def test_default_geometry_is_34_gb_of_which_under_1_gb_is_written() -> None:
    """The defaults: 12 MoE layers + the MTP layer, 128 experts each; every expert, attention
    and indexer weight is a hole, so the file is long and the data written is small."""
    cfg = mk.make_config(mk.GEOMETRY)
    plan = mk.tensor_plan(cfg)
    total = sum(mk.nbytes(s, d) for s, d, _ in plan.values())
    written = sum(mk.nbytes(s, d) for s, d, f in plan.values() if f != "zero")
    assert 34e9 < total < 35e9
    assert written < 1e9
    experts = [n for n in plan if ".mlp.experts." in n]
    assert len(experts) == 13 * 128 * 3
    assert all(plan[n][2] == "zero" for n in experts)
    assert all(plan[f"model.layers.{i}.mlp.gate.weight"][2] == "router" for i in range(13))
    # one token reads the layer's fixed weights and 8 experts: the experts are about half
    wb = mk.weight_bytes(cfg)
    assert 0.8 < 8 * wb["per_expert"] / wb["per_layer_fixed"] < 1.2


@pytest.mark.parametrize(
    ("change", "match"),
    [({"top_k": 200}, "--top-k"), ({"experts": 0}, "--experts"), ({"hidden": True}, "--hidden")],
)
def test_bad_geometry_is_refused(change: dict, match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        mk.make_config(mk.GEOMETRY | change)


CKPT_PROBE = r"""
import json, os, sys
from pathlib import Path
import torch
from safetensors import safe_open
import make_mtp_cost_ckpt as mk

out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(os.environ["CKPT_OUT"])
geometry = json.loads(os.environ["GEOMETRY"])
record = mk.write(out, geometry, seed=3)
_, tables = mk.load_tables(out)
cfg = json.loads((out / "config.json").read_text())
n, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
path = out / "model.safetensors"
with safe_open(str(path), "pt") as f:
    t = {k: f.get_tensor(k) for k in f.keys()}
plan = mk.tensor_plan(cfg)
holes_zero = all(not t[k].any() for k, (_, _, fill) in plan.items() if fill == "zero")
p = f"model.layers.{n}"

def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

# the target: identity layers, final norm, lm_head
emb = t["model.embed_tokens.weight"].float()
h = rms(emb).bfloat16().float() * t["model.norm.weight"].float()
target = (h @ t["lm_head.weight"].float().T).argmax(-1).tolist()
# the MTP layer: eh_proj reads enorm(E[next]); identity block; shared_head's norm, then the
# target's lm_head, which vLLM 0.34 puts in place of shared_head.head
e = rms(t[f"{p}.embed_tokens.weight"].float()) * t[f"{p}.enorm.weight"].float()
hid = torch.cat([e, torch.ones_like(e)], -1) @ t[f"{p}.eh_proj.weight"].float().T
hid = rms(hid.bfloat16().float()) * t[f"{p}.shared_head.norm.weight"].float()
draft = (hid @ t["lm_head.weight"].float().T).argmax(-1).tolist()
same_head = torch.equal(t["lm_head.weight"], t[f"{p}.shared_head.head.weight"])
st = os.stat(path)
print(json.dumps({
    "target_is_succ": target == tables.succ,
    "drafts_right_for_members_only": [d == s for d, s in zip(draft, tables.succ)] == tables.member,
    "same_head": same_head,
    "members": sum(tables.member),
    "holes_zero": holes_zero,
    "file_bytes": st.st_size,
    "allocated": st.st_blocks * 512,
    "record": record,
}))
"""


@needs_venv
def test_written_weights_draft_right_exactly_for_the_members(tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    res = run_probe(
        CKPT_PROBE,
        timeout=600,
        env={"CKPT_OUT": str(out), "GEOMETRY": json.dumps(TINY)},
    )
    assert res["target_is_succ"] and res["drafts_right_for_members_only"] and res["same_head"]
    assert res["record"]["draft_check"]["min_miss_margin"] > mk.MIN_MISS_MARGIN
    assert 0 < res["members"] < TINY["vocab"]
    assert res["holes_zero"]
    assert res["file_bytes"] == res["record"]["file_bytes"]
    # the holes take no disk: what is allocated is about what was written
    assert res["allocated"] < res["record"]["bytes_written"] + (4 << 20)
    assert res["allocated"] < res["file_bytes"] / 2


def test_tables_of_another_layout_are_refused(tmp_path: Path) -> None:
    """load_tables rebuilds the tables from the record and refuses a record whose tables
    would differ from the ones its weights encode."""
    out = tmp_path / "ckpt"
    out.mkdir()
    cfg = mk.make_config(TINY)
    (out / "config.json").write_text(json.dumps(cfg))
    layout = mk.mtp_acceptance.Layout()
    tables = mk.mtp_acceptance.build_tables(cfg["vocab_size"], 0, layout)
    record = {
        "seed": 0,
        "layout": layout.__dict__,
        "profiles": mk.profile_rates(),
        "tables_sha256": mk.tables_digest(tables),
    }
    (out / mk.RECORD).write_text(json.dumps(record))
    assert mk.load_tables(out)[1].succ == tables.succ
    (out / mk.RECORD).write_text(json.dumps(record | {"seed": 1}))
    with pytest.raises(ValueError, match="differ"):
        mk.load_tables(out)
