# SPDX-License-Identifier: Apache-2.0
"""The agreeing MTP checkpoint (mtp_agree_ckpt.py) drafts what the target writes: its tensors,
rounded to bf16 as written, run through the closed-form target and MTP layer in the test venv,
which has torch (``$PATCHSET_TEST_VENV`` or ``build/testenv``; skipped without it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
from venv_probe import needs_venv, run_probe  # noqa: E402

AGREE_PROBE = r"""
import json
import torch
import make_dsa_gate_ckpt as mk
import mtp_agree_ckpt as agree

cfg = mk.make_config("glm", 2)
cfg.update(vocab_size=512, hidden_size=64, intermediate_size=32, moe_intermediate_size=16,
           q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
           v_head_dim=16, num_attention_heads=2, num_key_value_heads=2, index_n_heads=2,
           index_head_dim=16)
t = {k: v.float() for k, v in mk.to_checkpoint(agree.agree_tensors(cfg, 0)).items()}
eps = cfg["rms_norm_eps"]
p = f"model.layers.{cfg['num_hidden_layers']}"

def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

ids = torch.arange(cfg["vocab_size"])
emb, head = t["model.embed_tokens.weight"], t["lm_head.weight"]
# every layer is the identity: the final hidden state of token x is its embedding
target = (rms(emb) * t["model.norm.weight"] @ head.T).argmax(-1)
# the MTP layer: eh_proj over [enorm(E[x]), hnorm(previous hidden)], an identity block, the
# shared head; the previous hidden state is random (eh_proj must drop it)
prev = torch.randn(len(ids), cfg["hidden_size"], generator=torch.Generator().manual_seed(1))
inp = torch.cat([rms(t[f"{p}.embed_tokens.weight"]) * t[f"{p}.enorm.weight"],
                 rms(prev) * t[f"{p}.hnorm.weight"]], -1)
hidden = inp @ t[f"{p}.eh_proj.weight"].T
draft = (rms(hidden) * t[f"{p}.shared_head.norm.weight"] @ t[f"{p}.shared_head.head.weight"].T)
outputs = [k for k in t if k.endswith(("self_attn.o_proj.weight", "down_proj.weight"))]
print(json.dumps({
    "target_is_tau": bool((target == agree.tau(ids, len(ids) // 2)).all()),
    "draft_is_target": bool((draft.argmax(-1) == target).all()),
    "outputs": len(outputs),
    "outputs_zero": all(bool((t[k] == 0).all()) for k in outputs),
    "mtp_layer_outputs": sum(k.startswith(p + ".") for k in outputs),
}))
"""


@needs_venv
def test_the_mtp_draft_of_every_token_is_the_targets_next_token() -> None:
    got = run_probe(AGREE_PROBE, timeout=300)
    assert got["target_is_tau"], got
    assert got["draft_is_target"], got
    assert got["outputs_zero"], got
    # 2 target layers (o_proj + dense down_proj) and the MoE MTP layer (o_proj, 8 experts, shared)
    assert got["mtp_layer_outputs"] == 1 + 8 + 1, got
    assert got["outputs"] == 2 * 2 + 10, got
