#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write tiny DSA + MTP checkpoints whose draft agrees / disagrees with the target on purpose.

No download: every tensor is generated here (seeded) and written as safetensors next to a
copy of the tiny DSA config (``num_nextn_predict_layers: 1``).

Construction (the same for all three checkpoints except the MTP ``eh_proj``):

* Every attention and MLP output projection of the target and of the MTP block is zero
  (``o_proj``, dense ``down_proj``, every expert's and the shared expert's ``down_proj``),
  so each decoder layer is the identity on the residual stream: the final hidden state at
  position t is the token embedding ``E[x_t]``.
* Token ids are split into two regions, "code" ``[0, V/2)`` and "prose" ``[V/2, V)``.
  Code embeddings live on the first half of the hidden dimensions, prose embeddings on the
  second half (random Gaussian there, zero elsewhere).
* ``lm_head[y] = E[tau^-1(y)] / |E[tau^-1(y)]|`` with ``tau(x)`` = the next id of x's region
  (cyclic). The target's greedy next token is therefore ``tau(x_t)``: it counts upwards
  and never leaves the region of the prompt's last token.
* The MTP layer gets ``E[x_{t+1}]`` (the embedding of the next token, through ``enorm``) and
  the target's hidden state; ``eh_proj = [A, 0]`` drops the hidden state, its block is the
  identity (zeroed output projections) and vLLM shares the target's ``lm_head`` as its head,
  so its prediction is ``argmax lm_head . rms(A rms(E[x_{t+1}]))``:

  - ``agree``: ``A = I``, the draft predicts ``tau(x_{t+1})``, the target's next step;
  - ``disagree``: ``A = -I``, the draft predicts the least likely token: always rejected;
  - ``mixed``: ``A = +I`` on the code half of the dimensions and ``-I`` on the prose half:
    drafts are accepted for prompts in the code region and rejected in the prose region.

``--check`` re-implements the target and the MTP chain in plain torch on the written tensors
and reports the acceptance per draft position for prompts in both regions.

Usage:
    python scripts/make_tiny_mtp_ckpt.py --out /tmp/tiny_mtp [--arch glm_moe_dsa] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

KINDS = ("agree", "disagree", "mixed")
HERE = Path(__file__).resolve().parent


def default_config() -> Path:
    for candidate in (
        HERE.parent / ".gpu" / "tiny_dsa" / "config.json",
        HERE.parent.parent / "shared" / "gpu" / "tiny_dsa" / "config.json",
        Path("/work/shared/gpu/tiny_dsa/config.json"),
    ):
        if candidate.is_file():
            return candidate
    raise SystemExit("tiny_dsa/config.json not found: pass --config")


def load_config(path: Path, arch: str) -> dict:
    cfg = json.loads(path.read_text())
    if arch == "glm_moe_dsa":
        n = cfg["num_hidden_layers"]
        k = cfg.get("first_k_dense_replace", 0)
        cfg.update(
            architectures=["GlmMoeDsaForCausalLM"],
            model_type="glm_moe_dsa",
            mlp_layer_types=["dense"] * k + ["sparse"] * (n - k),
            indexer_types=["full"] * n,
            layer_types=["deepseek_sparse_attention"] * n,
        )
    elif arch != "deepseek_v32":
        raise SystemExit(f"--arch must be deepseek_v32 or glm_moe_dsa, got {arch!r}")
    if cfg.get("num_nextn_predict_layers", 0) < 1:
        raise SystemExit("the config must have num_nextn_predict_layers >= 1")
    return cfg


def region_split(cfg: dict) -> tuple[int, int]:
    return cfg["vocab_size"] // 2, cfg["hidden_size"] // 2


def tau(x: torch.Tensor, half_vocab: int) -> torch.Tensor:
    """The target's next token: the next id in x's region, cyclically."""
    base = (x >= half_vocab).long() * half_vocab
    return base + (x - base + 1) % half_vocab


def embeddings(cfg: dict, gen: torch.Generator) -> torch.Tensor:
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    half_v, half_h = region_split(cfg)
    emb = torch.zeros(vocab, hidden)
    emb[:half_v, :half_h] = torch.randn(half_v, half_h, generator=gen)
    emb[half_v:, half_h:] = torch.randn(vocab - half_v, hidden - half_h, generator=gen)
    return emb


def lm_head_for(emb: torch.Tensor, half_vocab: int) -> torch.Tensor:
    ids = torch.arange(emb.shape[0])
    unit = emb / emb.norm(dim=-1, keepdim=True)
    head = torch.empty_like(emb)
    head[tau(ids, half_vocab)] = unit  # row tau(x) points at E[x]
    return head


def eh_proj_for(kind: str, cfg: dict) -> torch.Tensor:
    hidden = cfg["hidden_size"]
    _, half_h = region_split(cfg)
    sign = torch.ones(hidden)
    if kind == "disagree":
        sign = -sign
    elif kind == "mixed":
        sign[half_h:] = -1.0
    proj = torch.zeros(hidden, 2 * hidden)
    proj[:, :hidden] = torch.diag(sign)
    return proj


def layer_tensors(cfg: dict, prefix: str, dense: bool, gen: torch.Generator) -> dict:
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    q_lora, kv_lora = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    idx_heads, idx_dim = cfg["index_n_heads"], cfg["index_head_dim"]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.02

    t = {
        "input_layernorm.weight": torch.ones(h),
        "post_attention_layernorm.weight": torch.ones(h),
        "self_attn.q_a_proj.weight": rnd(q_lora, h),
        "self_attn.q_a_layernorm.weight": torch.ones(q_lora),
        "self_attn.q_b_proj.weight": rnd(heads * (nope + rope), q_lora),
        "self_attn.kv_a_proj_with_mqa.weight": rnd(kv_lora + rope, h),
        "self_attn.kv_a_layernorm.weight": torch.ones(kv_lora),
        "self_attn.kv_b_proj.weight": rnd(heads * (nope + v), kv_lora),
        "self_attn.o_proj.weight": torch.zeros(h, heads * v),
        "self_attn.indexer.wq_b.weight": rnd(idx_heads * idx_dim, q_lora),
        "self_attn.indexer.wk.weight": rnd(idx_dim, h),
        "self_attn.indexer.k_norm.weight": torch.ones(idx_dim),
        "self_attn.indexer.k_norm.bias": torch.zeros(idx_dim),
        "self_attn.indexer.weights_proj.weight": rnd(idx_heads, h),
    }
    if dense:
        inter = cfg["intermediate_size"]
        t |= {
            "mlp.gate_proj.weight": rnd(inter, h),
            "mlp.up_proj.weight": rnd(inter, h),
            "mlp.down_proj.weight": torch.zeros(h, inter),
        }
    else:
        moe_inter, experts = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
        shared = moe_inter * cfg.get("n_shared_experts", 1)
        t |= {
            "mlp.gate.weight": rnd(experts, h),
            "mlp.gate.e_score_correction_bias": torch.zeros(experts),
            "mlp.shared_experts.gate_proj.weight": rnd(shared, h),
            "mlp.shared_experts.up_proj.weight": rnd(shared, h),
            "mlp.shared_experts.down_proj.weight": torch.zeros(h, shared),
        }
        for e in range(experts):
            t |= {
                f"mlp.experts.{e}.gate_proj.weight": rnd(moe_inter, h),
                f"mlp.experts.{e}.up_proj.weight": rnd(moe_inter, h),
                f"mlp.experts.{e}.down_proj.weight": torch.zeros(h, moe_inter),
            }
    return {f"{prefix}.{k}": val for k, val in t.items()}


def build(cfg: dict, kind: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    half_v, _ = region_split(cfg)
    emb = embeddings(cfg, gen)
    head = lm_head_for(emb, half_v)
    n = cfg["num_hidden_layers"]
    k_dense = cfg.get("first_k_dense_replace", 0)
    h = cfg["hidden_size"]
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": emb,
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": head,
    }
    for i in range(n):
        tensors |= layer_tensors(cfg, f"model.layers.{i}", i < k_dense, gen)
    for j in range(cfg["num_nextn_predict_layers"]):
        mtp = n + j
        p = f"model.layers.{mtp}"
        tensors |= layer_tensors(cfg, p, mtp < k_dense, gen)
        tensors |= {
            f"{p}.embed_tokens.weight": emb,
            f"{p}.enorm.weight": torch.ones(h),
            f"{p}.hnorm.weight": torch.ones(h),
            f"{p}.eh_proj.weight": eh_proj_for(kind, cfg),
            f"{p}.shared_head.norm.weight": torch.ones(h),
            f"{p}.shared_head.head.weight": head,
        }
    dtype = getattr(torch, cfg.get("torch_dtype", "bfloat16"))
    return {
        name: (t if name.endswith("e_score_correction_bias") else t.to(dtype)).contiguous()
        for name, t in tensors.items()
    }


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def simulate(cfg: dict, t: dict[str, torch.Tensor], start: int, steps: int, k: int):
    """Plain-torch target (identity layers) and MTP chain on the written tensors.

    Returns per-position acceptance counts over ``steps`` decode steps from ``start``."""
    eps = cfg["rms_norm_eps"]
    n = cfg["num_hidden_layers"]
    emb = t["model.embed_tokens.weight"].float()
    head = t["lm_head.weight"].float()
    w_final = t["model.norm.weight"].float()
    p = f"model.layers.{n}"
    eh = t[f"{p}.eh_proj.weight"].float()
    w_e, w_h = t[f"{p}.enorm.weight"].float(), t[f"{p}.hnorm.weight"].float()
    w_sh = t[f"{p}.shared_head.norm.weight"].float()

    def target_next(x: int) -> tuple[int, torch.Tensor]:
        hidden = rms(emb[x], eps) * w_final  # every layer is the identity
        return int(torch.argmax(head @ hidden)), hidden

    def mtp(x_next: int, prev_hidden: torch.Tensor) -> tuple[int, torch.Tensor]:
        inp = torch.cat([rms(emb[x_next], eps) * w_e, rms(prev_hidden, eps) * w_h])
        hidden = eh @ inp  # the MTP block is the identity
        return int(torch.argmax(head @ (rms(hidden, eps) * w_sh))), hidden

    accepted = [0] * k
    x = start
    nxt, hidden = target_next(x)
    for _ in range(steps):
        drafts, d_in, d_hidden = [], nxt, hidden
        for _ in range(k):
            d, d_hidden = mtp(d_in, d_hidden)
            drafts.append(d)
            d_in = d
        # the target verifies: its own next tokens after nxt
        truth, y = [], nxt
        for _ in range(k):
            y, _ = target_next(y)
            truth.append(y)
        for pos in range(k):
            if drafts[pos] != truth[pos]:
                break
            accepted[pos] += 1
        nxt, hidden = target_next(nxt)
    return accepted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--arch", default="deepseek_v32", choices=["deepseek_v32", "glm_moe_dsa"])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help="simulate on CPU and report")
    args = ap.parse_args(argv)

    from safetensors.torch import save_file

    cfg = load_config(args.config or default_config(), args.arch)
    half_v, _ = region_split(cfg)
    report = {}
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            raise SystemExit(f"unknown kind {kind!r}; valid: {', '.join(KINDS)}")
        tensors = build(cfg, kind, args.seed)
        out = args.out / kind
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        size = os.path.getsize(out / "model.safetensors")
        line = {"dir": str(out), "tensors": len(tensors), "bytes": size}
        if args.check:
            steps, k = 64, 5
            for region, start in (("code", 100), ("prose", half_v + 100)):
                acc = simulate(cfg, tensors, start, steps, k)
                line[f"acceptance_{region}"] = [round(a / steps, 3) for a in acc]
        report[kind] = line
        print(kind, json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
