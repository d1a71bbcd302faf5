#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the cost-realistic MTP checkpoint the adaptive-depth benchmark runs on (seeded, no
download): a GLM-5-class MoE whose step cost grows with the number of query tokens, and whose
draft acceptance is set by construction (mtp_acceptance.py).

Cost: every decoder layer is a GLM-5 MoE layer as one rank of a TP 4 GLM-5 deployment sees it:
hidden 6144, 16 query heads of GLM-5's MLA (``q_lora_rank`` 2048, latent 512 + rope 64,
``qk_nope`` 192, ``v_head_dim`` 256), the DSA indexer (64 x 128, top-k 2048, GLM-5's full/shared
pattern), 128 routed experts of intermediate 512 (a TP 4 slice of GLM-5's 2048) with top-8
sigmoid routing and one shared expert; 12 such layers and one MTP layer, about 34 GB in bf16.
The router weights are random, so the ``q`` query tokens of one verification pick different
experts and read more expert weights than one token: about 8, 15, 22, 29, 35, 41 distinct
experts for q = 1..6, against the attention's fixed weights. At batch 1 the step is
memory-bound; the benchmark measures what that makes of t(q).

Values: every projection that writes into the residual stream is zero (attention and indexer
weights, every expert and the shared expert), so each layer is the identity and the final
hidden state at position t is the token's embedding ``E[x_t]``. Zero tensors are written as
holes of a sparse ``model.safetensors``: the file is 34 GB long and takes about 1 GB of disk;
the kernels read their zeros like any other bytes. What is not zero:

* ``E`` (seeded Gaussian): a member's embedding (mtp_acceptance.build_tables) lives on the
  first half of the hidden dimensions, a miss's on the second half;
* ``lm_head[succ[x]] = E[x] / |E[x]|``: the target's greedy next token is ``succ[x_t]``;
* the MTP layer reads only the next token's embedding, through ``eh_proj = [M, 0]`` with ``M``
  the identity on the first half and minus the identity on the second. vLLM
  0.34 gives an MTP layer the target's ``lm_head`` (``load_eagle_model`` replaces every
  ``shared_head.head``; this file's copy equals it), so the MTP layer drafts ``succ[x]`` for a
  member and, for a miss, the successor of the token whose embedding points most nearly
  opposite its own: a wrong draft, by a wide margin (its own successor's logit is the most
  negative). ``check_drafts`` computes both argmaxes from the written bf16 tensors;
* norms (ones) and the routers (seeded, N(0, 1/hidden)).

``mtp_cost_ckpt.json`` beside the weights records the geometry, the byte counts, the seed, the
layout and the sha256 of the tables, so the benchmark rebuilds them and refuses a mismatch.

Usage:
    python evidence/make_mtp_cost_ckpt.py --out <work>/mtp-cost
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import make_dsa_gate_ckpt as gate_ckpt
import mtp_acceptance

RECORD = "mtp_cost_ckpt.json"
GEOMETRY: dict[str, int] = {
    "layers": 12,
    "hidden": 6144,
    "heads": 16,
    "experts": 128,
    "top_k": 8,
    "moe_intermediate": 512,
    "vocab": 16384,
    "max_positions": 16384,
}
DTYPE_BYTES = {"BF16": 2, "F32": 4}
MIN_MISS_MARGIN = 1.0
"""A miss's right token must trail its (wrong) draft by this many logits: bf16 reordering on
the GPU moves a logit by far less, so the draft stays wrong there too."""


def make_config(g: dict[str, int]) -> dict[str, Any]:
    """The HF config (GlmMoeDsaForCausalLM, every layer MoE) of geometry ``g``."""
    for key, value in g.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SystemExit(f"--{key.replace('_', '-')} must be an int >= 1, got {value!r}")
    if g["top_k"] > g["experts"]:
        raise SystemExit(f"--top-k ({g['top_k']}) must not exceed --experts ({g['experts']})")
    cfg = gate_ckpt.make_config("glm", g["layers"], g["heads"], g["max_positions"])
    cfg.update(
        vocab_size=g["vocab"],
        hidden_size=g["hidden"],
        intermediate_size=4 * g["moe_intermediate"],
        moe_intermediate_size=g["moe_intermediate"],
        n_routed_experts=g["experts"],
        num_experts_per_tok=g["top_k"],
        q_lora_rank=2048,
        index_topk=2048,
        first_k_dense_replace=0,
        mlp_layer_types=["sparse"] * g["layers"],
    )
    return cfg


def tensor_plan(cfg: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """name -> (shape, safetensors dtype, fill) for the whole checkpoint. Fills: ``zero``
    (a hole), ``ones``, ``embed``, ``head``, ``eh_proj``, ``router``."""
    n, h, vocab = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]

    def fill(name: str, kind: str) -> str:
        if kind == "ones":
            return "ones"
        if name.endswith("mlp.gate.weight"):
            return "router"
        return "zero"

    def dtype(name: str) -> str:
        return "F32" if name.endswith("e_score_correction_bias") else "BF16"

    plan: dict[str, tuple[tuple[int, ...], str, str]] = {
        "model.embed_tokens.weight": ((vocab, h), "BF16", "embed"),
        "model.norm.weight": ((h,), "BF16", "ones"),
        "lm_head.weight": ((vocab, h), "BF16", "head"),
    }
    # indexer tensors on every layer: well defined whether or not a tree honours the pattern
    for i in range(n + 1):
        for k, (shape, kind) in gate_ckpt.layer_shapes(cfg, True, dense=False).items():
            name = f"model.layers.{i}.{k}"
            plan[name] = (shape, dtype(name), fill(name, kind))
    p = f"model.layers.{n}"
    plan |= {
        f"{p}.embed_tokens.weight": ((vocab, h), "BF16", "embed"),
        f"{p}.enorm.weight": ((h,), "BF16", "ones"),
        f"{p}.hnorm.weight": ((h,), "BF16", "ones"),
        f"{p}.eh_proj.weight": ((h, 2 * h), "BF16", "eh_proj"),
        f"{p}.shared_head.norm.weight": ((h,), "BF16", "ones"),
        f"{p}.shared_head.head.weight": ((vocab, h), "BF16", "head"),
    }
    return plan


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def make_fills(
    cfg: dict[str, Any], tables: mtp_acceptance.Tables, seed: int
) -> dict[str, Callable[[tuple[int, ...]], Any]]:
    """fill -> function(shape) giving the torch tensor (checkpoint dtype) of every fill that
    is not a hole. The embedding is drawn once and shared."""
    import torch

    h = cfg["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randn(cfg["vocab_size"], h, generator=gen)
    member = torch.tensor(tables.member)
    emb[member, h // 2 :] = 0
    emb[~member, : h // 2] = 0
    emb = emb.to(torch.bfloat16)
    unit = emb.float() / emb.float().norm(dim=-1, keepdim=True)

    def head(shape: tuple[int, ...]) -> Any:
        out = torch.empty_like(unit)
        out[torch.tensor(tables.succ)] = unit
        return out.to(torch.bfloat16)

    def eh_proj(shape: tuple[int, ...]) -> Any:
        w = torch.zeros(shape, dtype=torch.bfloat16)
        w[:, :h] = flip_matrix(h).to(torch.bfloat16)
        return w

    def router(shape: tuple[int, ...]) -> Any:
        return (torch.randn(shape, generator=gen) / math.sqrt(shape[1])).to(torch.bfloat16)

    return {
        "ones": lambda shape: torch.ones(shape, dtype=torch.bfloat16),
        "embed": lambda shape: emb,
        "head": head,
        "eh_proj": eh_proj,
        "router": router,
    }


def flip_matrix(h: int) -> Any:
    """``M``: the identity on the first ``h // 2`` coordinates, minus the identity on the rest
    (exact in bf16)."""
    import torch

    m = torch.eye(h)
    m[h // 2 :, h // 2 :] *= -1
    return m


def check_drafts(
    tensors: dict[str, Any], cfg: dict[str, Any], tables: mtp_acceptance.Tables
) -> dict[str, Any]:
    """The greedy next token of the target and the MTP layer's draft for every token, from the
    checkpoint's bf16 tensors in closed form (identity layers; vLLM's MTP head = the target's
    lm_head), against the tables: the target must give ``succ``, the MTP layer ``succ`` exactly
    for the members, and a miss's draft must lose to its wrong winner by ``min_miss_margin``."""
    import torch

    n, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    p = f"model.layers.{n}"

    def rms(x: Any) -> Any:
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16).float()

    emb = tensors["model.embed_tokens.weight"].float()
    head = tensors["lm_head.weight"].float()
    succ = torch.tensor(tables.succ)
    member = torch.tensor(tables.member)
    target_ok = drafts_ok = True
    min_margin = float("inf")
    for lo in range(0, emb.shape[0], 2048):
        x = emb[lo : lo + 2048]
        logits = rms(x) @ head.T
        target_ok &= bool((logits.argmax(-1) == succ[lo : lo + 2048]).all())
        e = rms(x) * tensors[f"{p}.enorm.weight"].float()
        hid = (e @ tensors[f"{p}.eh_proj.weight"].float()[:, : x.shape[1]].T).to(torch.bfloat16)
        logits = rms(hid.float()) @ head.T
        drafts = logits.argmax(-1)
        right = drafts == succ[lo : lo + 2048]
        drafts_ok &= bool((right == member[lo : lo + 2048]).all())
        miss = ~member[lo : lo + 2048]
        if miss.any():
            own = logits[miss].gather(1, succ[lo : lo + 2048][miss][:, None])[:, 0]
            min_margin = min(min_margin, float((logits[miss].max(-1).values - own).min()))
    return {
        "target_is_succ": target_ok,
        "drafts_match_members": drafts_ok,
        "min_miss_margin": min_margin,
    }


def raw_bytes(tensor: Any) -> bytes:
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().tobytes()
    return tensor.contiguous().numpy().tobytes()


def write_sparse_safetensors(
    path: Path,
    plan: dict[str, tuple[tuple[int, ...], str, str]],
    produce: Callable[[str, tuple[int, ...], str], bytes | None],
) -> dict[str, int]:
    """Write a safetensors file of ``plan`` whose tensors ``produce`` returns None for as
    holes (zeros on read). Returns the file's length and the bytes written."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, (shape, dtype, _) in plan.items():
        size = nbytes(shape, dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + size]}
        at += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    start = 8 + len(blob)
    written = 0
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, (shape, dtype, _) in plan.items():
            data = produce(name, shape, dtype)
            if data is None:
                continue
            expected = nbytes(shape, dtype)
            if len(data) != expected:
                raise ValueError(f"{name}: {len(data)} bytes, expected {expected}")
            f.seek(start + header[name]["data_offsets"][0])
            f.write(data)
            written += len(data)
        f.truncate(start + at)
    os.replace(tmp, path)
    return {"file_bytes": start + at, "bytes_written": written}


def weight_bytes(cfg: dict[str, Any]) -> dict[str, int]:
    """Bytes per decoder layer: its weights apart from the routed experts (attention, indexer,
    shared expert, router, norms) and one routed expert."""
    shapes = gate_ckpt.layer_shapes(cfg, True, dense=False)
    expert = sum(
        nbytes(s, "BF16") for k, (s, _) in shapes.items() if k.startswith("mlp.experts.0.")
    )
    layer = sum(
        nbytes(s, "F32" if k.endswith("bias") else "BF16")
        for k, (s, _) in shapes.items()
        if not k.startswith("mlp.experts.")
    )
    return {"per_layer_fixed": layer, "per_expert": expert}


def profile_rates() -> dict[str, list[float]]:
    """The acceptance profiles the tables are drawn from, as the record keeps them."""
    return {k: list(p.rates) for k, p in mtp_acceptance.PROFILES.items()}


def tables_digest(tables: mtp_acceptance.Tables) -> str:
    blob = json.dumps({"succ": tables.succ, "draft": tables.draft}).encode()
    return hashlib.sha256(blob).hexdigest()


def write(out: Path, geometry: dict[str, int], seed: int = 0) -> dict[str, Any]:
    """Write ``config.json``, the sparse ``model.safetensors`` and the record into ``out``;
    returns the record."""
    cfg = make_config(geometry)
    layout = mtp_acceptance.Layout()
    tables = mtp_acceptance.build_tables(cfg["vocab_size"], seed, layout)
    errors = mtp_acceptance.check_tables(tables)
    if errors:
        raise SystemExit(f"tables: {'; '.join(errors)}")
    plan = tensor_plan(cfg)
    fills = make_fills(cfg, tables, seed)
    # every tensor that is not a hole, made once (in plan order: the routers draw in turn)
    data = {name: fills[kind](shape) for name, (shape, _, kind) in plan.items() if kind != "zero"}
    drafts = check_drafts(data, cfg, tables)
    if not (drafts["target_is_succ"] and drafts["drafts_match_members"]) or not (
        drafts["min_miss_margin"] > MIN_MISS_MARGIN
    ):
        raise SystemExit(f"the weights do not draft the tables: {drafts}")

    def produce(name: str, shape: tuple[int, ...], dtype: str) -> bytes | None:
        return raw_bytes(data[name]) if name in data else None

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    sizes = write_sparse_safetensors(out / "model.safetensors", plan, produce)
    record = {
        "script": "evidence/make_mtp_cost_ckpt.py",
        "geometry": geometry,
        "seed": seed,
        "layout": dataclasses.asdict(layout),
        "profiles": profile_rates(),
        "tables_sha256": tables_digest(tables),
        "draft_check": drafts,
        "tensors": len(plan),
        "parameters": sum(math.prod(s) for s, _, _ in plan.values()),
        "weight_bytes": weight_bytes(cfg),
        **sizes,
    }
    (out / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_tables(ckpt: Path) -> tuple[dict[str, Any], mtp_acceptance.Tables]:
    """The record of a written checkpoint and its tables, rebuilt; raises if the rebuilt
    tables differ from the ones the weights encode (another seed, layout or profile)."""
    record = json.loads((ckpt / RECORD).read_text())
    cfg = json.loads((ckpt / "config.json").read_text())
    layout = mtp_acceptance.Layout(**record["layout"])
    profiles = profile_rates()
    if profiles != record["profiles"]:
        raise ValueError(f"{ckpt}: written with profiles {record['profiles']}, now {profiles}")
    tables = mtp_acceptance.build_tables(cfg["vocab_size"], record["seed"], layout)
    if tables_digest(tables) != record["tables_sha256"]:
        raise ValueError(f"{ckpt}: the rebuilt tables differ from the ones written")
    return record, tables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    for key, value in GEOMETRY.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    args = ap.parse_args(argv)
    geometry = {key: getattr(args, key) for key in GEOMETRY}
    record = write(args.out, geometry, args.seed)
    print(json.dumps({k: v for k, v in record.items() if k != "profiles"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
