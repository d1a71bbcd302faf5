# SPDX-License-Identifier: Apache-2.0
"""An fp32 torch forward of the DCP gates' DSA checkpoints (CPU; torch only).

It follows vLLM's DSA MLA layers in what the gates' measures depend on: RMSNorm, the q / kv
low-rank projections, the indexer (per head ``relu(q . k)`` weighted by ``weights_proj`` and
summed, top ``index_topk`` of the causal keys, LayerNorm on its keys), attention over the
selected keys only with scale (nope + rope) ** -0.5, dense SiLU MLPs, final norm and head.
Simplified: RoPE (GPT-J pairs on the MLA rope part, NeoX halves on the indexer's first rope
dims), no fp8 anywhere (vLLM stores fp8 records and fp8 indexer keys), fp32 activations (vLLM:
bf16). Used by ``make_dsa_gate_ckpt.py`` (the needle's answer direction, the MTP layer's
draft) and by ``gate_ckpt_reference.py`` (predicted sensitivity).
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


def attention(
    cfg: dict[str, Any], t: dict[str, Any], prefix: str, x, chunk: int = 128, o_proj=True
):
    """One DSA MLA attention layer (``prefix``: ``model.layers.<i>.self_attn.``) over the
    normed inputs ``x`` [n, hidden] at positions 0..n-1, causal: its output after ``o_proj``,
    or (``o_proj=False``) the heads' values before it, [n, heads * v_head_dim]."""
    import torch

    n = x.shape[0]
    heads, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ih, idim, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    theta = float(cfg["rope_theta"])
    scale = (nope + rope) ** -0.5
    pos = torch.arange(n)
    a = prefix
    # keys for every position (small: [n, 576] and [n, 128])
    kv = x @ t[a + "kv_a_proj_with_mqa.weight"].T
    latent = _rms(kv[:, :kv_lora], t[a + "kv_a_layernorm.weight"])
    keys = torch.cat((latent, _rope_pairs(kv[:, kv_lora:], pos, theta)), -1)
    ik = torch.nn.functional.layer_norm(
        x @ t[a + "indexer.wk.weight"].T,
        (idim,),
        t[a + "indexer.k_norm.weight"],
        t[a + "indexer.k_norm.bias"],
    )
    ik = torch.cat((_rope_halves(ik[:, :rope], pos, theta), ik[:, rope:]), -1)
    kv_b = t[a + "kv_b_proj.weight"].view(heads, nope + vd, kv_lora)
    out_dim = x.shape[1] if o_proj else heads * vd
    attn = torch.empty((n, out_dim), dtype=x.dtype)
    # queries chunk by chunk (a 32k prompt's [n, heads, 576] queries would not fit)
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        xs, ps = x[s:e], pos[s:e]
        q_c = _rms(xs @ t[a + "q_a_proj.weight"].T, t[a + "q_a_layernorm.weight"])
        q = (q_c @ t[a + "q_b_proj.weight"].T).view(e - s, heads, nope + rope)
        # absorbed query against the shared [n, kv_lora + rope] keys
        q_lat = torch.einsum("nhd,hdl->nhl", q[..., :nope], kv_b[:, :nope])
        q_full = torch.cat((q_lat, _rope_pairs(q[..., nope:], ps, theta)), -1)
        iq = (q_c @ t[a + "indexer.wq_b.weight"].T).view(e - s, ih, idim)
        iq = torch.cat((_rope_halves(iq[..., :rope], ps, theta), iq[..., rope:]), -1)
        w = (xs @ t[a + "indexer.weights_proj.weight"].T) * ih**-0.5 * idim**-0.5
        score = torch.einsum("qhd,kd->qhk", iq, ik[:e]).relu_()
        score = torch.einsum("qh,qhk->qk", w, score)
        causal = pos[:e][None, :] > ps[:, None]
        score.masked_fill_(causal, -math.inf)
        sel = score.topk(min(topk, e), dim=-1).indices  # [q, k]
        valid = torch.gather(~causal, 1, sel)
        ks = keys[sel]  # [q, k, 576]
        logits = torch.einsum("qhl,qkl->qhk", q_full, ks) * scale
        logits.masked_fill_(~valid[:, None, :], -math.inf)
        out = torch.einsum("qhk,qkl->qhl", logits.softmax(-1), ks[..., :kv_lora])
        v = torch.einsum("nhl,hdl->nhd", out, kv_b[:, nope:]).reshape(e - s, heads * vd)
        attn[s:e] = v @ t[a + "o_proj.weight"].T if o_proj else v
    return attn


def final_hidden(cfg: dict[str, Any], t: dict[str, Any], ids: list[int], chunk: int = 128):
    """The final-norm hidden states [len(ids), hidden] (fp32) of a causal prefill of
    ``ids``: what the LM head multiplies."""
    import torch

    h = t["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(cfg["num_hidden_layers"]):
        x = _rms(h, t[f"model.layers.{i}.input_layernorm.weight"])
        h = h + attention(cfg, t, f"model.layers.{i}.self_attn.", x, chunk)
        m = f"model.layers.{i}."
        x = _rms(h, t[m + "post_attention_layernorm.weight"])
        g = x @ t[m + "mlp.gate_proj.weight"].T
        u = x @ t[m + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ t[m + "mlp.down_proj.weight"].T
    return _rms(h, t["model.norm.weight"])


def mtp_inputs(cfg: dict[str, Any], t: dict[str, Any], ids: list[int]):
    """The MTP (NextN) layer's normed block inputs [len(ids), hidden] for a prompt ``ids``
    whose position p takes the next token ``ids[p + 1]``, as vLLM's DeepSeek MTP layer
    builds them (embedding zeroed at position 0, ``enorm``) when its ``eh_proj`` reads the
    embedding half only (``make_dsa_gate_ckpt.add_mtp_answer``); ``ids`` holds one token
    more than the positions."""
    import torch

    p = f"model.layers.{cfg['num_hidden_layers']}."
    e = t["model.embed_tokens.weight"][torch.tensor(ids[1:])].clone()
    e[0] = 0.0
    e = _rms(e, t[p + "enorm.weight"])
    h = cfg["hidden_size"]
    return e @ t[p + "eh_proj.weight"][:, :h].T


def mtp_draft_logits(cfg: dict[str, Any], t: dict[str, Any], ids: list[int], chunk: int = 128):
    """The MTP layer's logits [len(ids) - 1, vocab] over a prompt (see ``mtp_inputs``), for a
    layer whose MLP writes nothing (its down projections zero)."""
    p = f"model.layers.{cfg['num_hidden_layers']}."
    h = mtp_inputs(cfg, t, ids)
    x = _rms(h, t[p + "input_layernorm.weight"])
    h = h + attention(cfg, t, p + "self_attn.", x, chunk)
    return _rms(h, t[p + "shared_head.norm.weight"]) @ t[p + "shared_head.head.weight"].T


def last_logits(cfg: dict[str, Any], t: dict[str, Any], ids: list[int]):
    """fp32 logits of the next token after ``ids`` (the first generated step)."""
    return final_hidden(cfg, t, ids)[-1] @ t["lm_head.weight"].T
