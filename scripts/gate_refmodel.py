# SPDX-License-Identifier: Apache-2.0
"""An fp32 torch forward of the DCP gates' DSA checkpoints (CPU; torch only).

It follows vLLM's DSA MLA layers in what the gates' measures depend on: RMSNorm, the q / kv
low-rank projections, the indexer (per head ``relu(q . k)`` weighted by ``weights_proj`` and
summed, top ``index_topk`` of the causal keys, LayerNorm on its keys), attention over the
selected keys only with scale (nope + rope) ** -0.5, dense SiLU MLPs, final norm and head.
Simplified: RoPE (GPT-J pairs on the MLA rope part, NeoX halves on the indexer's first rope
dims), no fp8 anywhere (vLLM stores fp8 records and fp8 indexer keys), fp32 activations (vLLM:
bf16). Used by ``make_dsa_gate_ckpt.py`` (the needle's answer direction) and by
``gate_ckpt_reference.py`` (predicted sensitivity).
"""

from __future__ import annotations

import math
from typing import Any


def _rms(x, w, eps: float = 1e-6):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w


def _rope_angles(x, pos, theta: float):
    """cos and sin of pos * theta ** (-2i / d), shaped to broadcast over x's middle dims."""
    import torch

    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    return ang.cos().view(shape), ang.sin().view(shape)


def _rope_pairs(x, pos, theta: float):
    """GPT-J style: rotate (x[2i], x[2i+1])."""
    import torch

    cos, sin = _rope_angles(x, pos, theta)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


def _rope_halves(x, pos, theta: float):
    """NeoX style: rotate (x[i], x[i + d/2])."""
    import torch

    cos, sin = _rope_angles(x, pos, theta)
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


def final_hidden(cfg: dict[str, Any], t: dict[str, Any], ids: list[int], chunk: int = 256):
    """The final-norm hidden states [len(ids), hidden] (fp32) of a causal prefill of
    ``ids``: what the LM head multiplies."""
    import torch

    n = len(ids)
    heads, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ih, idim, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    theta = float(cfg["rope_theta"])
    scale = (nope + rope) ** -0.5
    pos = torch.arange(n)
    h = t["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms(h, t[p + "input_layernorm.weight"])
        q_c = _rms(
            x @ t[p + "self_attn.q_a_proj.weight"].T, t[p + "self_attn.q_a_layernorm.weight"]
        )
        q = (q_c @ t[p + "self_attn.q_b_proj.weight"].T).view(n, heads, nope + rope)
        kv = x @ t[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        latent = _rms(kv[:, :kv_lora], t[p + "self_attn.kv_a_layernorm.weight"])
        k_pe = _rope_pairs(kv[:, kv_lora:], pos, theta)
        kv_b = t[p + "self_attn.kv_b_proj.weight"].view(heads, nope + vd, kv_lora)
        # absorbed query: [n, heads, kv_lora + rope] against the shared [n, kv_lora + rope] keys
        q_lat = torch.einsum("nhd,hdl->nhl", q[..., :nope], kv_b[:, :nope])
        q_full = torch.cat((q_lat, _rope_pairs(q[..., nope:], pos, theta)), -1)
        keys = torch.cat((latent, k_pe), -1)
        # indexer
        iq = (q_c @ t[p + "self_attn.indexer.wq_b.weight"].T).view(n, ih, idim)
        iq = torch.cat((_rope_halves(iq[..., :rope], pos, theta), iq[..., rope:]), -1)
        ik = torch.nn.functional.layer_norm(
            x @ t[p + "self_attn.indexer.wk.weight"].T,
            (idim,),
            t[p + "self_attn.indexer.k_norm.weight"],
            t[p + "self_attn.indexer.k_norm.bias"],
        )
        ik = torch.cat((_rope_halves(ik[:, :rope], pos, theta), ik[:, rope:]), -1)
        w = (x @ t[p + "self_attn.indexer.weights_proj.weight"].T) * ih**-0.5 * idim**-0.5
        out = torch.empty(n, heads, kv_lora)
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            score = torch.einsum("qhd,kd->qhk", iq[s:e], ik[:e]).relu_()
            score = torch.einsum("qh,qhk->qk", w[s:e], score)
            causal = pos[:e][None, :] > pos[s:e][:, None]
            score.masked_fill_(causal, -math.inf)
            k = min(topk, e)
            sel = score.topk(k, dim=-1).indices  # [q, k]
            valid = torch.gather(~causal, 1, sel)
            ks = keys[sel]  # [q, k, 576]
            logits = torch.einsum("qhl,qkl->qhk", q_full[s:e], ks) * scale
            logits.masked_fill_(~valid[:, None, :], -math.inf)
            prob = logits.softmax(-1)
            out[s:e] = torch.einsum("qhk,qkl->qhl", prob, ks[..., :kv_lora])
        v = torch.einsum("nhl,hdl->nhd", out, kv_b[:, nope:])
        h = h + v.reshape(n, heads * vd) @ t[p + "self_attn.o_proj.weight"].T
        x = _rms(h, t[p + "post_attention_layernorm.weight"])
        g = x @ t[p + "mlp.gate_proj.weight"].T
        u = x @ t[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ t[p + "mlp.down_proj.weight"].T
    return _rms(h, t["model.norm.weight"])


def last_logits(cfg: dict[str, Any], t: dict[str, Any], ids: list[int]):
    """fp32 logits of the next token after ``ids`` (the first generated step)."""
    return final_hidden(cfg, t, ids)[-1] @ t["lm_head.weight"].T
