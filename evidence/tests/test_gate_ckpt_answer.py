# SPDX-License-Identifier: Apache-2.0
"""The needle checkpoints' answer knobs (make_dsa_gate_ckpt.add_answer, add_mtp_answer), run
through the fp32 reference forward (gate_refmodel.py) in the test venv, which has torch
(``$PATCHSET_TEST_VENV`` or ``build/testenv``; skipped without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from venv_probe import needs_venv, run_probe  # noqa: E402

ANSWER_PROBE = r"""
import json, random, sys
import torch
import make_dsa_gate_ckpt as mk
from gate_refmodel import last_logits

cfg = mk.make_config("glm", 4)
gains = {"qk": 1.0, "o": 3.0, "down": 0.25, "head": 1.0}
out = {}
for answer_logit in (0.0, 7.0):
    t = mk.build(cfg, 1234, gains, "include")
    knobs = dict(mk.NEEDLE_DEFAULTS, attn_margin=9.0, answer_logit=answer_logit)
    mk.add_needle(t, cfg, 1234, 7, knobs)
    head = t["lm_head.weight"].clone()
    info = mk.add_answer(t, cfg, 1234, 7, knobs)
    changed = (t["lm_head.weight"] != head).any(dim=1).nonzero().flatten().tolist()
    # a prompt the calibration never saw (another seed, longer than index_topk)
    rng = random.Random("test/answer")
    ids = [rng.randrange(2, 31999) for _ in range(1100)]
    ids = [x if x != 7 else 8 for x in ids]
    without = list(ids)
    ids[5] = 7
    with torch.no_grad():
        a, b = last_logits(cfg, t, ids), last_logits(cfg, t, without)
    out[str(answer_logit)] = {
        "info": info,
        "changed_rows": changed,
        "answer_with": float(a[31999]),
        "answer_without": float(b[31999]),
        "top_with": int(a.argmax()),
        "max_logit": float(max(a.max(), b.max())),
    }
print(json.dumps(out))
"""


MTP_PROBE = r"""
import json, random
import torch
import make_dsa_gate_ckpt as mk
from gate.plans import MTP_ACCEPT_CKPT, NEEDLE_ARGS
from gate_refmodel import mtp_draft_logits

def tensors(argv):
    return mk.make_tensors(mk.parser().parse_args([*argv, "--out", "/nonexistent"]))

cfg, _, plain, _ = tensors(["--arch", "glm", *NEEDLE_ARGS])
cfg, _, t, needle = tensors(MTP_ACCEPT_CKPT)
mtp = f"model.layers.{cfg['num_hidden_layers']}."
differ = sorted(k for k in t if not torch.equal(t[k], plain[k]))
# a prompt the calibration never saw, then the target's answers: the draft steps of decoding
rng = random.Random("test/mtp-answer")
ids = [rng.randrange(2, 31999) for _ in range(1100)]
ids = [x if x != 7 else 8 for x in ids]
without = list(ids)
ids[5] = 7
out = {"record": {k: v for k, v in needle.items() if k.startswith("mtp")}, "differ": differ}
with torch.no_grad():
    for name, seq in (("with", ids), ("without", without)):
        d = mtp_draft_logits(cfg, t, seq + [31999] * 3)[-3:]
        others = d.clone()
        others[:, 31999] = -float("inf")
        out[name] = {"drafts": d.argmax(-1).tolist(),
                     "margin": float((d[:, 31999] - others.max(-1).values).min())}
out["mtp_prefix"] = mtp
print(json.dumps(out))
"""


ORTHO_PROBE = r"""
import json, random
import torch
import make_dsa_gate_ckpt as mk
from gate_refmodel import last_logits

# top-k 16 instead of 512: prompts of 4x and 32x the top-k stand for the long prompts' ratio
cfg = mk.make_config("glm", 4)
cfg["index_topk"] = 16
gains = {"qk": 1.0, "o": 3.0, "down": 0.25, "head": 1.0}
out = {}
for ortho in (0, 1):
    t = mk.build(cfg, 1234, gains, "include")
    knobs = dict(mk.NEEDLE_DEFAULTS, attn_margin=13.0, answer_logit=10.0)
    if ortho:
        knobs[mk.ORTHO_EMBED] = 1.0
    mk.add_needle(t, cfg, 1234, 7, knobs)
    mk.add_answer(t, cfg, 1234, 7, knobs)
    for n in (64, 512):
        rng = random.Random(f"test/ortho/{n}")
        ids = [rng.randrange(2, 31999) for _ in range(n)]
        ids = [x if x != 7 else 8 for x in ids]
        without = list(ids)
        ids[5] = 7
        margins = []
        for seq in (ids, without):
            with torch.no_grad():
                lp = torch.log_softmax(last_logits(cfg, t, seq), -1)
            others = lp.clone()
            others[31999] = -float("inf")
            margins.append(float(lp[31999] - others.max()))
        out[f"{ortho}/{n}"] = {"with": margins[0], "without": margins[1]}
print(json.dumps(out))
"""


@needs_venv
def test_ortho_embed_keeps_the_answer_absent_without_the_needle_in_long_prompts() -> None:
    """The answer's log-prob margin over the best other token, with and without the needle,
    on prompts of 4x and 32x the indexer's top-k: with ortho_embed=1 the needle's answer
    leads by over 5 with the needle and trails by over 3 without it at both lengths; without
    the knob it trails by less than 3 without the needle (glmns1m on the GPU led without the
    needle from 256k tokens, 512x its top-k, on)."""
    got = run_probe(ORTHO_PROBE, timeout=900)
    for n in (64, 512):
        assert got[f"1/{n}"]["with"] > 5.0 and got[f"1/{n}"]["without"] < -3.0, got
        assert got[f"0/{n}"]["with"] > 5.0 and got[f"0/{n}"]["without"] > -3.0, got


@needs_venv
def test_answer_knob_makes_the_retrieved_needle_raise_one_logit() -> None:
    """With answer_logit=7 only the answer's LM-head row changes, and on an unseen prompt the
    needle lifts that logit by several units to the top while the largest logit stays below
    8 (the bf16 ULP, so the noise floor, unchanged); with 0 nothing changes."""
    got = run_probe(ANSWER_PROBE, timeout=600)
    off, on = got["0.0"], got["7.0"]
    assert off["info"] == {} and off["changed_rows"] == []
    assert abs(off["answer_with"] - off["answer_without"]) < 1.5
    assert on["changed_rows"] == [31999] and on["info"]["answer_id"] == 31999
    assert on["answer_with"] - on["answer_without"] > 3.0
    assert on["top_with"] == 31999 and on["max_logit"] < 8.0


@needs_venv
def test_mtp_answer_knob_drafts_the_answer_only_through_the_retrieved_needle() -> None:
    """With mtp_answer_logit=14 only MTP-layer tensors change (the target is glmn's, bit for
    bit); on an unseen prompt followed by the target's answers the MTP layer drafts the answer
    at every draft step with a margin of several logits while its attention retrieves the
    needle, and never drafts it without the needle."""
    got = run_probe(MTP_PROBE, timeout=900)
    assert got["differ"] and all(k.startswith(got["mtp_prefix"]) for k in got["differ"])
    rec = got["record"]
    assert rec["mtp_calibration_answer_logit"] == pytest.approx(14.0, abs=0.01)
    assert rec["mtp_calibration_drafts_answer_with"] == 1.0
    assert rec["mtp_calibration_drafts_answer_without"] == 0.0
    assert got["with"]["drafts"] == [31999] * 3 and got["with"]["margin"] > 3.0
    assert 31999 not in got["without"]["drafts"] and got["without"]["margin"] < -3.0
