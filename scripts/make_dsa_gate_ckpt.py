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
  v 128, indexer 64 x 128, ``index_topk`` 2048.

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

Usage:
    python scripts/make_dsa_gate_ckpt.py --arch glm --out /tmp/gate-ckpt/glm
    python scripts/make_dsa_gate_ckpt.py --arch v32 --out /tmp/gate-ckpt/v32
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


def make_config(arch: str, layers: int = 4) -> dict[str, Any]:
    """The HF config of one geometry (dense MLPs on every layer; see the module docstring)."""
    cfg = dict(COMMON, num_hidden_layers=layers, first_k_dense_replace=layers)
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
        keep_fp32 = name.endswith("e_score_correction_bias")
        out[name] = (t if keep_fp32 else t.to(torch.bfloat16)).contiguous()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=ARCHS)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=4)
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
    args = ap.parse_args(argv)
    from safetensors.torch import save_file

    cfg = make_config(args.arch, args.layers)
    gains = {"qk": args.qk_gain, "o": args.o_gain, "down": args.down_gain, "head": args.head_gain}
    tensors = build(cfg, args.seed, gains, args.shared_indexer_weights)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    path = args.out / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    info = {
        "arch": args.arch,
        "architectures": cfg["architectures"],
        "seed": args.seed,
        "gains": gains,
        "shared_indexer_weights": args.shared_indexer_weights,
        "tensors": len(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "safetensors_sha256": digest,
        "script": "scripts/make_dsa_gate_ckpt.py",
        "argv": sys.argv[1:] if argv is None else argv,
    }
    (args.out / "gate_ckpt.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
