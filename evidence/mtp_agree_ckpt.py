#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write a seeded DSA + MTP checkpoint whose MTP draft always agrees with the target.

No download: the gate checkpoint's config and tensors (make_dsa_gate_ckpt.py, geometry ``glm``
or ``v32``, one MTP layer), changed so that the target's greedy next token and the MTP layer's
draft are known in closed form:

* every output projection of the target and of the MTP layer is zero (attention ``o_proj``,
  dense ``down_proj``, every expert's and the shared expert's ``down_proj``), so each decoder
  layer is the identity on the residual stream: the final hidden state at position t is the
  token embedding ``E[x_t]``;
* token ids are split into two regions, ``[0, V/2)`` and ``[V/2, V)``; the first region's
  embeddings live on the first half of the hidden dimensions, the second's on the second half
  (seeded Gaussian there, zero elsewhere);
* ``lm_head[tau(x)] = E[x] / |E[x]|`` with ``tau(x)`` the next id of x's region (cyclic): the
  target's greedy next token is ``tau(x_t)``, it counts upwards within the prompt's region;
* the MTP layer's ``eh_proj = [I, 0]`` reads ``E[x_{t+1}]`` only (through ``enorm``), its
  block is the identity and its head is the target's ``lm_head``, so it drafts
  ``tau(x_{t+1})``: the target's next step. Every draft is accepted, and an adaptive depth
  climbs to the top of its ladder.

Usage:
    python evidence/mtp_agree_ckpt.py --arch glm --out <work>/mtp-agree
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import make_dsa_gate_ckpt as gate_ckpt

# make_dsa_gate_ckpt's default gains; the zeroed output projections make the agreement
# independent of them
GAINS = {"qk": 3.0, "o": 1.0, "down": 0.5, "head": 2.5}


def tau(x: Any, half_vocab: int) -> Any:
    """The target's next token: the next id in x's region, cyclically."""
    base = (x >= half_vocab).long() * half_vocab
    return base + (x - base + 1) % half_vocab


def agree_tensors(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """The fp32 tensors of an agreeing checkpoint of ``cfg`` (make_dsa_gate_ckpt's names)."""
    import torch

    t = gate_ckpt.build(cfg, seed, GAINS, "include")
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    half_v, half_h = vocab // 2, hidden // 2
    gen = torch.Generator().manual_seed(seed + 1)
    emb = torch.zeros(vocab, hidden)
    emb[:half_v, :half_h] = torch.randn(half_v, half_h, generator=gen)
    emb[half_v:, half_h:] = torch.randn(vocab - half_v, hidden - half_h, generator=gen)
    head = torch.empty_like(emb)
    head[tau(torch.arange(vocab), half_v)] = emb / emb.norm(dim=-1, keepdim=True)
    mtp = f"model.layers.{cfg['num_hidden_layers']}"
    eh_proj = torch.zeros(hidden, 2 * hidden)
    eh_proj[:, :hidden] = torch.eye(hidden)
    for name, tensor in t.items():
        if name.endswith(("self_attn.o_proj.weight", "down_proj.weight")):
            t[name] = torch.zeros_like(tensor)
    t |= {
        "model.embed_tokens.weight": emb,
        f"{mtp}.embed_tokens.weight": emb,
        "lm_head.weight": head,
        f"{mtp}.shared_head.head.weight": head,
        f"{mtp}.eh_proj.weight": eh_proj,
    }
    return t


def write(out: Path, arch: str, seed: int = 0) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of an agreeing checkpoint to ``out``."""
    cfg = gate_ckpt.make_config(arch)
    gate_ckpt.write_checkpoint(out, cfg, gate_ckpt.to_checkpoint(agree_tensors(cfg, seed)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="glm", choices=gate_ckpt.ARCHS)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"wrote {write(args.out, args.arch, args.seed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
