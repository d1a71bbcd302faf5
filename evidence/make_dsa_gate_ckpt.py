#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the attention-sensitive DSA checkpoints the DCP gates run on (seeded, no download).

Two geometries, each a ``config.json`` + ``model.safetensors`` (bf16) + ``gate_ckpt.json`` (how
it was made):

* ``glm`` (``GlmMoeDsaForCausalLM``, ``glm_moe_dsa``): GLM-5 attention geometry at a small
  hidden size: 64 query heads, MLA ``kv_lora_rank`` 512 + rope 64 (576-wide latent records),
  ``qk_nope`` 192, ``v_head_dim`` 256, indexer 64 heads x 128 with ``index_topk`` 512 (well below
  the 1k/8k/32k gate prompts, so the selection decides what attention sees), ``indexer_types``
  with full and shared layers, one MTP (NextN) layer.
* ``v32`` (``DeepseekV32ForCausalLM``): DeepSeek-V3.2 geometry: 32 query heads, qk_nope 128,
  v 128, indexer 64 x 128, ``index_topk`` 2048. ``--heads 128`` gives the real model's head
  count (32 local heads at TP = 4: the case stock FlashMLA-sparse refuses under DCP).

Stock vLLM 0.33.0 ignores ``indexer_types`` (every layer builds and runs an indexer), so by
default every layer ships indexer tensors and the checkpoint is well defined on stock and on a
tree that honours the pattern alike (``--shared-indexer-weights omit`` writes the realistic
GLM-5 layout instead, with no indexer tensors on shared layers).

Init (why the output depends on the whole prompt): token embeddings are N(0, 1); every
projection is N(0, 1/fan_in) times a gain, so each layer's activations stay at unit scale
rather than shrinking to the residual stream's noise as with the usual std 0.02 (the dummy
loader's near-uniform logits). The query/key gain (``--qk-gain``, default 3) makes the
attention logits of one head have a standard deviation of about 2.6, so a head attends to a
few of the selected records instead of averaging all of them; the output projection gain
(``--o-gain``) makes attention write into the residual stream at the scale of the token's own
embedding, and ``--head-gain`` gives logits of standard deviation ~2.5 (a few clear
candidates per step, not -ln(vocab) everywhere). MLPs are dense (``first_k_dense_replace`` =
all layers): MoE routing flips under bf16 reordering and would turn the noise floor into
chaos; the gates test attention, not routing. The dependence is measured, not assumed: the
gate's sensitivity pass changes one prompt token near the start and records how far the first
generated step's log-probs move.

``--max-position-embeddings N`` (default 65536, what every checkpoint before it had) writes
``config.json``'s ``max_position_embeddings``: vLLM refuses a ``max_model_len`` above it, so the
long-prompt gates (256k, 1M) need a larger one. It changes ``config.json`` only. No tensor
depends on it: the seeded init draws no position, and the needle's answer calibration
(``add_answer``, ``add_mtp_answer``) runs gate_refmodel.py's forward over prompts of 2 x
``index_topk`` (+ 1) tokens with its own RoPE angles (position x theta^(-2i/d), no table), so the
safetensors bytes are those of the same arguments without it. vLLM builds two RoPE tables per
rank from it (``get_rope`` in vllm/models/deepseek_v32/attention.py: the MLA rope, GPT-J pairs,
and the indexer's, NeoX halves; plain ``rope_theta`` 10000, no scaling in these configs): row p
is cos/sin of p x inv_freq, computed element by element, so a longer table holds the same rows
below 65536 and more after them. Their cost is memory: 2 tables x N x 64 x 2 bytes (bf16) per
rank, 0.29 GB at N = 1,114,112.

Usage:
    python evidence/make_dsa_gate_ckpt.py --arch glm --out <work>/gate-ckpt/glm
    python evidence/make_dsa_gate_ckpt.py --arch v32 --out <work>/gate-ckpt/v32
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

ARCHS = ("glm", "v32")

COMMON: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 768,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "num_nextn_predict_layers": 1,
    "attention_bias": False,
    "initializer_range": 0.02,
}


DEFAULT_MAX_POSITIONS = COMMON["max_position_embeddings"]
"""Every checkpoint made before ``--max-position-embeddings`` existed has this value."""


def make_config(
    arch: str,
    layers: int = 4,
    heads: int | None = None,
    max_position_embeddings: int = DEFAULT_MAX_POSITIONS,
) -> dict[str, Any]:
    """The HF config of one geometry (dense MLPs on every layer; see the module docstring);
    ``heads`` overrides the geometry's query head count (e.g. DeepSeek-V3.2's real 128);
    ``max_position_embeddings`` the longest ``max_model_len`` vLLM accepts (the default keeps
    every earlier checkpoint's config byte for byte)."""
    if isinstance(max_position_embeddings, bool) or not isinstance(max_position_embeddings, int):
        raise SystemExit(
            f"--max-position-embeddings must be an int, got {max_position_embeddings!r}"
        )
    if max_position_embeddings < 1:
        raise SystemExit(f"--max-position-embeddings must be >= 1, got {max_position_embeddings}")
    cfg = dict(
        COMMON,
        num_hidden_layers=layers,
        first_k_dense_replace=layers,
        max_position_embeddings=max_position_embeddings,
    )
    if arch == "glm":
        cfg.update(
            architectures=["GlmMoeDsaForCausalLM"],
            model_type="glm_moe_dsa",
            num_attention_heads=64,
            num_key_value_heads=64,
            qk_nope_head_dim=192,
            v_head_dim=256,
            index_topk=512,
            mlp_layer_types=["dense"] * layers,
            # full, full, shared, full: layer 2 reuses layer 1's selection where honoured
            indexer_types=["full" if i % 3 != 2 else "shared" for i in range(layers)],
        )
    elif arch == "v32":
        cfg.update(
            architectures=["DeepseekV32ForCausalLM"],
            model_type="deepseek_v32",
            num_attention_heads=32,
            num_key_value_heads=32,
            qk_nope_head_dim=128,
            v_head_dim=128,
            index_topk=2048,
        )
    else:
        raise SystemExit(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if heads is not None:
        if heads < 1:
            raise SystemExit(f"--heads must be >= 1, got {heads}")
        cfg.update(num_attention_heads=heads, num_key_value_heads=heads)
    return cfg


def layer_shapes(
    cfg: dict[str, Any], with_indexer: bool, dense: bool = True
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of one decoder layer: name -> (shape, init kind)."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    inter = cfg["intermediate_size"]
    t: dict[str, tuple[tuple[int, ...], str]] = {
        "input_layernorm.weight": ((h,), "ones"),
        "post_attention_layernorm.weight": ((h,), "ones"),
        "self_attn.q_a_proj.weight": ((q_lora, h), "proj"),
        "self_attn.q_a_layernorm.weight": ((q_lora,), "ones"),
        "self_attn.q_b_proj.weight": ((heads * (nope + rope), q_lora), "qk"),
        "self_attn.kv_a_proj_with_mqa.weight": ((kv_lora + rope, h), "proj"),
        "self_attn.kv_a_layernorm.weight": ((kv_lora,), "ones"),
        "self_attn.kv_b_proj.weight": ((heads * (nope + v), kv_lora), "proj"),
        "self_attn.o_proj.weight": ((h, heads * v), "o"),
    }
    if dense:
        t |= {
            "mlp.gate_proj.weight": ((inter, h), "proj"),
            "mlp.up_proj.weight": ((inter, h), "proj"),
            "mlp.down_proj.weight": ((h, inter), "down"),
        }
    else:  # the MTP layer sits past first_k_dense_replace: vLLM builds it as MoE
        moe, experts = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
        shared = moe * cfg["n_shared_experts"]
        t |= {
            "mlp.gate.weight": ((experts, h), "proj"),
            "mlp.gate.e_score_correction_bias": ((experts,), "zeros"),
            "mlp.shared_experts.gate_proj.weight": ((shared, h), "proj"),
            "mlp.shared_experts.up_proj.weight": ((shared, h), "proj"),
            "mlp.shared_experts.down_proj.weight": ((h, shared), "down"),
        }
        for e in range(experts):
            t |= {
                f"mlp.experts.{e}.gate_proj.weight": ((moe, h), "proj"),
                f"mlp.experts.{e}.up_proj.weight": ((moe, h), "proj"),
                f"mlp.experts.{e}.down_proj.weight": ((h, moe), "down"),
            }
    if with_indexer:
        idx_heads, idx_dim = cfg["index_n_heads"], cfg["index_head_dim"]
        t |= {
            "self_attn.indexer.wq_b.weight": ((idx_heads * idx_dim, q_lora), "proj"),
            "self_attn.indexer.wk.weight": ((idx_dim, h), "proj"),
            "self_attn.indexer.k_norm.weight": ((idx_dim,), "ones"),
            "self_attn.indexer.k_norm.bias": ((idx_dim,), "zeros"),
            "self_attn.indexer.weights_proj.weight": ((idx_heads, h), "proj"),
        }
    return t


def std_of(kind: str, fan_in: int, gains: dict[str, float]) -> float:
    base = 1.0 / math.sqrt(fan_in)
    return base * {"proj": 1.0, "qk": gains["qk"], "o": gains["o"], "down": gains["down"]}[kind]


def tensor_plan(cfg: dict[str, Any], shared_indexer_weights: str) -> dict[str, tuple]:
    """name -> (shape, init kind) for the whole checkpoint, MTP layer included."""
    n, h, vocab = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    types = cfg.get("indexer_types") or ["full"] * n
    plan: dict[str, tuple] = {
        "model.embed_tokens.weight": ((vocab, h), "embed"),
        "model.norm.weight": ((h,), "ones"),
        "lm_head.weight": ((vocab, h), "head"),
    }
    for i in range(n):
        with_idx = shared_indexer_weights == "include" or types[i] == "full"
        for k, v in layer_shapes(cfg, with_idx).items():
            plan[f"model.layers.{i}.{k}"] = v
    for j in range(cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{n + j}"
        dense = n + j < cfg["first_k_dense_replace"]
        for k, v in layer_shapes(cfg, True, dense).items():  # MTP layers always index
            plan[f"{p}.{k}"] = v
        plan |= {
            f"{p}.embed_tokens.weight": ((vocab, h), "embed"),
            f"{p}.enorm.weight": ((h,), "ones"),
            f"{p}.hnorm.weight": ((h,), "ones"),
            f"{p}.eh_proj.weight": ((h, 2 * h), "proj"),
            f"{p}.shared_head.norm.weight": ((h,), "ones"),
            f"{p}.shared_head.head.weight": ((vocab, h), "head"),
        }
    return plan


def build(cfg: dict[str, Any], seed: int, gains: dict[str, float], shared_indexer_weights: str):
    import torch

    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {}
    cache: dict[str, Any] = {}  # the MTP layer shares the target's embedding and head
    for name, (shape, kind) in tensor_plan(cfg, shared_indexer_weights).items():
        if kind == "ones":
            t = torch.ones(shape)
        elif kind == "zeros":
            t = torch.zeros(shape)
        elif kind in ("embed", "head"):
            if kind not in cache:
                scale = 1.0 if kind == "embed" else gains["head"] / math.sqrt(shape[1])
                cache[kind] = torch.randn(shape, generator=gen) * scale
            t = cache[kind]
        else:
            t = torch.randn(shape, generator=gen) * std_of(kind, shape[1], gains)
        out[name] = t.float()
    return out


def to_checkpoint(tensors: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        name: (t if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)).contiguous()
        for name, t in tensors.items()
    }


NEEDLE_DEFAULTS = {
    "alpha": 1.0,
    "gamma": 1.0,
    "index_margin": 3.0,
    "attn_margin": 7.0,
    "weight_bias": 3.0,
    "kappa": 8.0,
    # add_answer: how far the needle raises one answer token's logit (0: no answer token)
    "answer_logit": 0.0,
    "answer_id": 31999.0,  # outside the gates' prompt ids (gate.plan.PROMPT_ID_RANGE)
    # add_mtp_answer: the MTP layer's draft logit of the answer when it retrieves the needle
    # (0: the MTP layer stays random, its drafts are rejected)
    "mtp_answer_logit": 0.0,
}
ORTHO_EMBED = "ortho_embed"
"""A needle knob outside the defaults (so that the records of checkpoints made without it
keep their bytes): 1 removes every ordinary token embedding's component along the needle's
direction (add_needle), 0 keeps it (the tensors of leaving it out; the record names it)."""


def _rms(x: Any) -> Any:
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()


def _plant_needle(
    t: dict[str, Any],
    cfg: dict[str, Any],
    p: str,
    gen: Any,
    sample: Any,
    c_hat: Any,
    n_hat: Any,
    c_along: float,
    knobs: dict[str, float],
) -> None:
    """add_needle's rank-one terms in one attention layer ``p`` (``...self_attn``)."""
    import torch

    heads, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    idx_heads, idx_dim = cfg["index_n_heads"], cfg["index_head_dim"]
    kappa = knobs["kappa"]
    scale = (nope + rope) ** -0.5
    q_c = _rms(sample @ t[f"{p}.q_a_proj.weight"].T)
    u = q_c.mean(0)
    u_hat, u_norm = u / u.norm(), float(u.norm())
    if f"{p}.indexer.wk.weight" in t:
        d = torch.zeros(idx_dim)
        d[idx_dim // 2 :] = torch.randn(idx_dim // 2, generator=gen)
        d -= d.sum() / idx_dim * (d != 0)  # zero mean over all dims: LayerNorm keeps it
        d = d / d.norm()
        wq = t[f"{p}.indexer.wq_b.weight"].view(idx_heads, idx_dim, -1)
        wq += (knobs["index_margin"] / u_norm) * torch.outer(d, u_hat)
        t[f"{p}.indexer.wk.weight"] += kappa * torch.outer(d, n_hat)
        t[f"{p}.indexer.weights_proj.weight"] += (
            (knobs["weight_bias"] / (c_along * idx_heads**-0.5 * idx_dim**-0.5))
            * torch.outer(torch.ones(idx_heads), c_hat)
            * idx_heads**-0.5
            * idx_dim**-0.5
        )
    e = torch.randn(kv_lora, generator=gen)
    e = e / e.norm()
    t[f"{p}.kv_a_proj_with_mqa.weight"][:kv_lora] += kappa * torch.outer(e, n_hat)
    kv_b = t[f"{p}.kv_b_proj.weight"].view(heads, nope + v, kv_lora)
    q_b = t[f"{p}.q_b_proj.weight"].view(heads, nope + rope, -1)
    for hd in range(heads):
        k_needle = kv_b[hd, :nope] @ (e * kv_lora**0.5)
        beta = knobs["attn_margin"] / scale / (u_norm * float(k_needle.norm()))
        q_b[hd, :nope] += beta * torch.outer(k_needle / k_needle.norm(), u_hat)


def add_needle(
    t: dict[str, Any],
    cfg: dict[str, Any],
    seed: int,
    needle_id: int,
    knobs: dict[str, float],
    extra_layers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Make one token id a needle every query retrieves (in place; fp32 tensors).

    Every embedding gets a shared component ``alpha * c`` (so every query has a
    content-independent direction ``u`` after ``q_a_proj`` and its norm); the needle's embedding
    is ``alpha * c + gamma * n``. In every target layer, rank-one terms make
    (1) the needle's indexer key point along a zero-mean direction ``d`` of the indexer head's
        non-rope half (``wk += kappa d n^T``), every query head's indexer query gain
        ``index_margin`` along ``d`` (``wq_b += d u^T``) and every head's indexer weight a
        positive bias ``weight_bias`` (``weights_proj += 1 c^T``): the needle tops the
        indexer's scores for every query, so it is always selected;
    (2) the needle's MLA latent point along a direction ``e`` (``kv_a_proj += kappa e n^T``) and
        every head's no-rope query gain a logit of ``attn_margin`` on the needle's key
        (``q_b_proj += K_h u^T``): attention puts a large weight on the needle.
    With ``ortho_embed`` = 1 no other token's embedding has a component along ``n``, so no
    ordinary token gains from (1) or (2): without it the most needle-like tokens of a long
    prompt do, and the answer (add_answer) wins without the needle (glmns1m on the GPU: from
    256k tokens on).
    Layer 0 is exact up to rope and fp8; deeper layers see the same directions diluted by the
    residual stream. ``--check`` measures layer 0. ``extra_layers`` (e.g. the MTP layer's
    ``model.layers.<n>``) get the same terms from a generator of their own."""
    import torch

    gen = torch.Generator().manual_seed(seed + 7)
    h, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    alpha, gamma = knobs["alpha"], knobs["gamma"]
    c = torch.randn(h, generator=gen)
    c_hat = c / c.norm()
    nv = torch.randn(h, generator=gen)
    nv -= (nv @ c_hat) * c_hat
    n_hat = nv / nv.norm()
    emb = t["model.embed_tokens.weight"]  # shared with the MTP layer's copy
    emb += alpha * c_hat * h**0.5
    if knobs.get(ORTHO_EMBED):
        # no ordinary token keeps a component along the needle's direction: else the most
        # needle-like of a long prompt's tokens win the indexer and attention in its place
        emb -= torch.outer(emb @ n_hat, n_hat)
    emb[needle_id] = alpha * c_hat * h**0.5 + gamma * n_hat * h**0.5
    # the typical normalised input of a layer-0 query: its mean over random tokens
    sample = _rms(emb[torch.randint(2, emb.shape[0], (256,), generator=gen)])
    c_along = float((sample @ c_hat).mean())
    for i in range(n_layers):
        _plant_needle(
            t, cfg, f"model.layers.{i}.self_attn", gen, sample, c_hat, n_hat, c_along, knobs
        )
    # layers past the target (the MTP layer) draw from their own generator, so that the
    # target's tensors do not depend on them
    extra_gen = torch.Generator().manual_seed(seed + 13)
    for prefix in extra_layers:
        _plant_needle(
            t, cfg, f"{prefix}.self_attn", extra_gen, sample, c_hat, n_hat, c_along, knobs
        )
    return {"needle_id": needle_id, **knobs}


def _calibration_prompt(
    seed: int, tag: str, length: int, needle_id: int
) -> tuple[list[int], list[int]]:
    """A seeded calibration prompt of the gates' prompt ids, with the needle where the gates put
    it (``gate.plan.PERTURB_POSITION``) and without it: (with, without)."""
    import random

    from gate.plan import PERTURB_POSITION, PROMPT_ID_RANGE

    rng = random.Random(f"{seed}/{tag}")
    ids = [rng.randrange(*PROMPT_ID_RANGE) for _ in range(length)]
    ids = [x if x != needle_id else x + 1 for x in ids]
    without = list(ids)
    ids[PERTURB_POSITION] = needle_id
    return ids, without


def add_answer(
    t: dict[str, Any], cfg: dict[str, Any], seed: int, needle_id: int, knobs: dict[str, float]
) -> dict[str, Any]:
    """Make the needle's retrieval raise one answer token's logit to about ``answer_logit``
    (in place; fp32 tensors; after ``add_needle``).

    A calibration prompt of 2 x ``index_topk`` tokens (its own seed, the gates' prompt ids, the
    needle where the gates put it: ``gate.plan.PERTURB_POSITION``)
    runs through the fp32 reference forward (gate_refmodel.py) with and without the needle.
    Over its positions from ``index_topk`` on (where the needle competes with a full top-k, as
    in the gates' 1k-32k prompts; before, it wins more weight), ``g`` is the mean change of the
    final-norm hidden state, made orthogonal
    to the mean state without the needle (which every position shares: the embeddings'
    common component), so that without the needle the answer's logit stays at its random
    init level. The LM head row of ``answer_id`` gains ``beta * g_hat``, ``beta`` such that
    the needle's mean contribution to that logit is ``answer_logit``. Without it the needle
    moves the first step's log-probs by about 0.4-0.9 (3.5-4.5x the gates' tolerance,
    2026-12-01 18:20Z); with it, a rank whose partial drops the needle also loses the
    answer."""
    import torch
    from gate_refmodel import final_hidden

    if knobs["answer_logit"] <= 0:
        return {}
    answer = int(knobs["answer_id"])
    full = cfg["index_topk"]
    ids, without = _calibration_prompt(seed, "answer", 2 * full, needle_id)
    with torch.no_grad():
        with_n = final_hidden(cfg, t, ids)[full:]
        without_n = final_hidden(cfg, t, without)[full:]
    shared = without_n.mean(0) / without_n.mean(0).norm()
    g = (with_n - without_n).mean(0)
    g -= (g @ shared) * shared
    g_hat = g / g.norm()
    level = float((with_n @ g_hat).mean())
    beta = knobs["answer_logit"] / level
    t["lm_head.weight"][answer] += beta * g_hat  # the MTP layer's head is the same tensor
    return {
        "answer_id": answer,
        "beta": beta,
        "calibration_level": level,
        "calibration_level_without": float((without_n @ g_hat).mean()),
    }


def add_mtp_answer(
    t: dict[str, Any], cfg: dict[str, Any], seed: int, needle_id: int, knobs: dict[str, float]
) -> dict[str, Any]:
    """Make the MTP layer draft what the target writes, through its own attention (in place;
    fp32 tensors; after ``add_needle`` planted the needle in the MTP layer too and
    ``add_answer`` made the target write the answer at every step).

    The MTP layer's ``eh_proj`` reads the token embedding only (``[I, 0]``: its block input is
    the next token's normed embedding, as layer 0's is the current one's, so the needle's
    rank-one terms hold there exactly up to rope and fp8), its MLP writes nothing (every down
    projection zero: the MoE routing of the layer cannot matter) and its ``o_proj`` maps the
    retrieved needle's value onto the answer's head row: ``o_proj = (s / level) r z^T`` with
    ``z`` the mean change of the heads' values with the needle (a calibration prompt as in
    ``add_answer``, its own seed), ``level`` their mean projection on it, ``r`` the answer's
    unit head row and ``s`` chosen (bisection) so that the mean draft logit of the answer over
    the calibration positions is ``mtp_answer_logit``. So a draft is the answer, the target's
    token, exactly when the MTP layer's attention over its own (DCP-sharded) cache finds the
    needle: a DCP fault in the draft path shows as lost acceptance."""
    import torch
    from gate_refmodel import attention, mtp_draft_logits, mtp_inputs

    goal = knobs["mtp_answer_logit"]
    if goal <= 0:
        return {}
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    p = f"model.layers.{n}."
    answer = int(knobs["answer_id"])
    t[p + "eh_proj.weight"] = torch.cat((torch.eye(h), torch.zeros(h, h)), 1)
    for name in [k for k in t if k.startswith(p + "mlp.") and k.endswith("down_proj.weight")]:
        t[name] = torch.zeros_like(t[name])
    full = cfg["index_topk"]
    # one token more than the positions: the MTP layer's position p takes token p + 1
    ids, without = _calibration_prompt(seed, "mtp-answer", 2 * full + 1, needle_id)
    with torch.no_grad():
        h_with, h_without = mtp_inputs(cfg, t, ids), mtp_inputs(cfg, t, without)
        a = p + "self_attn."
        z_with = attention(cfg, t, a, _rms(h_with), o_proj=False)[full:]
        z_without = attention(cfg, t, a, _rms(h_without), o_proj=False)[full:]
        z = (z_with - z_without).mean(0)
        z_hat = z / z.norm()
        level = float((z_with @ z_hat).mean())
        row = t[p + "shared_head.head.weight"][answer]
        r_hat = row / row.norm()
        base, amount = h_with[full:], (z_with @ z_hat)[:, None] / level

        def answer_logit(scale: float) -> float:
            return float((_rms(base + scale * amount * r_hat) @ row).mean())

        lo, hi = 0.0, float(h)
        if answer_logit(hi) < goal:
            raise SystemExit(
                f"mtp_answer_logit {goal} is out of reach (at most {answer_logit(hi):.1f})"
            )
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if answer_logit(mid) < goal else (lo, mid)
        scale = (lo + hi) / 2
        t[p + "self_attn.o_proj.weight"] = (scale / level) * torch.outer(r_hat, z_hat)
        drafts_with = mtp_draft_logits(cfg, t, ids)[full:]
        drafts_without = mtp_draft_logits(cfg, t, without)[full:]
    return {
        "mtp_answer_id": answer,
        "mtp_scale": scale,
        "mtp_calibration_level": level,
        "mtp_calibration_answer_logit": answer_logit(scale),
        "mtp_calibration_drafts_answer_with": float(
            (drafts_with.argmax(-1) == answer).float().mean()
        ),
        "mtp_calibration_drafts_answer_without": float(
            (drafts_without.argmax(-1) == answer).float().mean()
        ),
    }


def check_layer0(
    t: dict[str, Any],
    cfg: dict[str, Any],
    needle_id: int | None,
    seed: int,
    keys: int = 4096,
    queries: int = 128,
) -> dict[str, Any]:
    """Layer 0 in plain fp32 torch (no rope, no fp8): where the needle (or, without one, a
    random key) ranks in every query's indexer scores, and the MLA attention weight it gets
    among ``index_topk`` keys, averaged over heads and queries."""
    import torch

    gen = torch.Generator().manual_seed(seed + 11)
    p = "model.layers.0.self_attn"
    heads, kv_lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    idx_heads, idx_dim, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    emb = t["model.embed_tokens.weight"]
    special = needle_id if needle_id is not None else 5
    kid = torch.randint(2, emb.shape[0], (keys,), generator=gen)
    kid[0] = special
    qid = torch.randint(2, emb.shape[0], (queries,), generator=gen)
    hk, hq = _rms(emb[kid]), _rms(emb[qid])
    q_c = _rms(hq @ t[f"{p}.q_a_proj.weight"].T)
    out: dict[str, Any] = {"needle_id": needle_id, "keys": keys, "queries": queries}
    if f"{p}.indexer.wk.weight" in t:
        iq = (q_c @ t[f"{p}.indexer.wq_b.weight"].T).view(queries, idx_heads, idx_dim)
        ik = torch.nn.functional.layer_norm(hk @ t[f"{p}.indexer.wk.weight"].T, (idx_dim,))
        w = (hq @ t[f"{p}.indexer.weights_proj.weight"].T) * idx_heads**-0.5 * idx_dim**-0.5
        score = torch.einsum("qh,qhk->qk", w, torch.relu(torch.einsum("qhd,kd->qhk", iq, ik)))
        rank = (score > score[:, :1]).sum(1)
        out["indexer_rank_of_key0"] = {
            "median": int(rank.median()),
            "max": int(rank.max()),
            "in_topk_fraction": float((rank < topk).float().mean()),
        }
    sel = slice(0, topk)
    ckv = _rms(hk[sel] @ t[f"{p}.kv_a_proj_with_mqa.weight"][:kv_lora].T)
    kv_b = t[f"{p}.kv_b_proj.weight"].view(heads, nope + v, kv_lora)
    k_nope = torch.einsum("hdl,kl->hkd", kv_b[:, :nope], ckv)
    q_b = t[f"{p}.q_b_proj.weight"].view(heads, nope + rope, -1)
    q_nope = torch.einsum("hdl,ql->hqd", q_b[:, :nope], q_c)
    logits = torch.einsum("hqd,hkd->hqk", q_nope, k_nope) * (nope + rope) ** -0.5
    weight0 = torch.softmax(logits, -1)[..., 0]
    out["attention_weight_of_key0"] = {
        "mean": float(weight0.mean()),
        "min": float(weight0.min()),
        "uniform_would_be": 1.0 / topk,
    }
    return out


def parser() -> argparse.ArgumentParser:
    """The writer's arguments (also what gate_ckpt_reference.py takes as a checkpoint)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--heads",
        type=int,
        default=None,
        help="query heads (default: the geometry's, glm 64 and v32 32; DeepSeek-V3.2 has 128)",
    )
    ap.add_argument(
        "--max-position-embeddings",
        type=int,
        default=DEFAULT_MAX_POSITIONS,
        help="config.json's max_position_embeddings: vLLM's largest max_model_len "
        f"(default {DEFAULT_MAX_POSITIONS}; the tensors do not depend on it)",
    )
    ap.add_argument("--qk-gain", type=float, default=3.0)
    ap.add_argument("--o-gain", type=float, default=1.0)
    ap.add_argument("--down-gain", type=float, default=0.5)
    ap.add_argument("--head-gain", type=float, default=2.5)
    ap.add_argument(
        "--shared-indexer-weights",
        choices=("include", "omit"),
        default="include",
        help="indexer tensors on 'shared' layers (include: loadable by stock vLLM 0.33.0)",
    )
    ap.add_argument(
        "--needle",
        type=int,
        default=None,
        help="token id to make a needle every query retrieves (see add_needle)",
    )
    ap.add_argument(
        "--needle-knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"override a needle knob ({', '.join((*NEEDLE_DEFAULTS, ORTHO_EMBED))})",
    )
    ap.add_argument("--check", action="store_true", help="measure layer 0 in fp32 torch")
    return ap


def needle_knobs(overrides: list[str]) -> dict[str, float]:
    """NEEDLE_DEFAULTS with ``NAME=VALUE`` overrides; an unknown name, or an ``ortho_embed``
    other than 0 or 1, is an error naming the valid ones."""
    knobs = dict(NEEDLE_DEFAULTS)
    for kv in overrides:
        k, _, val = kv.partition("=")
        if k not in knobs and k != ORTHO_EMBED:
            valid = ", ".join((*knobs, ORTHO_EMBED))
            raise SystemExit(f"unknown needle knob {k!r}; valid: {valid}")
        if k == ORTHO_EMBED and val not in ("0", "1"):
            raise SystemExit(f"needle knob {ORTHO_EMBED} is 0 or 1, not {val!r}")
        knobs[k] = float(val)
    return knobs


def make_tensors(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any], dict[str, Any] | None]:
    """(config, gains, fp32 tensors, needle record or None) of parsed writer arguments."""
    cfg = make_config(args.arch, args.layers, args.heads, args.max_position_embeddings)
    gains = {"qk": args.qk_gain, "o": args.o_gain, "down": args.down_gain, "head": args.head_gain}
    knobs = needle_knobs(args.needle_knob)
    tensors = build(cfg, args.seed, gains, args.shared_indexer_weights)
    needle = None
    if args.needle is not None:
        # an MTP layer that drafts the answer retrieves the needle like the target's layers
        mtp = (f"model.layers.{cfg['num_hidden_layers']}",) if knobs["mtp_answer_logit"] > 0 else ()
        needle = add_needle(tensors, cfg, args.seed, args.needle, knobs, extra_layers=mtp)
        needle |= add_answer(tensors, cfg, args.seed, args.needle, knobs)
        needle |= add_mtp_answer(tensors, cfg, args.seed, args.needle, knobs)
    return cfg, gains, tensors, needle


def write_checkpoint(out: Path, cfg: dict[str, Any], tensors: dict[str, Any]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (``tensors`` in the checkpoint's names
    and dtypes, see :func:`to_checkpoint`) into ``out``; returns the safetensors file."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    path = out / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cfg, gains, tensors, needle = make_tensors(args)
    check = check_layer0(tensors, cfg, args.needle, args.seed) if args.check else None
    tensors = to_checkpoint(tensors)
    path = write_checkpoint(args.out, cfg, tensors)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    info = {
        "arch": args.arch,
        "architectures": cfg["architectures"],
        "seed": args.seed,
        "gains": gains,
        "shared_indexer_weights": args.shared_indexer_weights,
        "needle": needle,
        "layer0_check": check,
        "tensors": len(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "safetensors_sha256": digest,
        "script": "evidence/make_dsa_gate_ckpt.py",
        "argv": sys.argv[1:] if argv is None else argv,
    }
    (args.out / "gate_ckpt.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
