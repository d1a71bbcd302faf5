# SPDX-License-Identifier: Apache-2.0
"""Memory you can plan with: weights per GPU and KV-cache tokens per request for every recipe
checkpoint on every machine of docs/serving.md, computed from the checkpoints' ``config.json``
(``tests/support/serving_models/*``) and written to ``docs/memory.md``.

    python tools/serving_plan.py            # exit 1 (with a diff) when docs/memory.md is stale
    python tools/serving_plan.py --write    # rewrite docs/memory.md

Standard library only: ``tests/test_serving_recipes.py`` imports it to regenerate and compare, and
to check every recipe's ``--max-model-len`` against :func:`kv_tokens_per_request`.

The model, and where each number comes from (vLLM 0.34.0, read in its source):

* KV bytes per token per layer: ``fp8_ds_mla`` is one 656-byte record
  (``AttentionImpl.get_fp8_ds_mla_row_bytes``: 512 fp8 NoPE values, 4 fp32 scales, 64 bf16
  RoPE values); ``auto`` stores the 576-wide latent in bf16 (1,152 bytes); ``nvfp4_ds_mla`` is
  352 bytes (stock 0.34: SM100 only, refused with DCP > 1; with 0013/0014 the series' Triton
  backend writes and reads it on SM90/SM12x, DCP included). Every layer with an indexer adds
  its key cache: ``index_head_dim`` fp8 bytes plus one fp32 scale per 128
  (``DeepseekV32Indexer``: 132 bytes). vLLM sums the layers' pages
  (``UniformTypeKVCacheSpecs``), so a token costs the sum.
* MLA keeps one latent per token (``num_kv_heads=1``), so every TP rank stores every layer's
  latent for the tokens it holds; DCP shards the tokens (``dcp_sharded``): a request's context
  is DCP times what one GPU holds.
* KV memory per GPU = GPU memory x ``--gpu-memory-utilization`` - weights on that GPU -
  ``RESERVE_GIB`` (activations, CUDA graphs, NCCL and workspaces: an assumption; vLLM logs the
  real figure as "Available KV cache memory" at start).
* Weights per GPU: parameters counted from the config's geometry, bytes per parameter from the
  checkpoint's quantization (``checkpoint.json`` next to the config names each module class's
  format); TP-sharded modules divide by TP, replicated ones (the latent down-projections, the
  indexer, the router) do not. Checked against the published size where there is one.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "support" / "serving_models"
OUTPUT = REPO / "docs" / "memory.md"

GIB = 1024**3
GB = 1000**3
RESERVE_GIB = 5.0
"""Per-GPU memory that is neither weights nor KV cache (assumed; see the module docstring)."""

FP8_DS_MLA_RECORD = 656
NVFP4_DS_MLA_RECORD = 352
INDEXER_SCALE_BLOCK = 128

KV_DTYPES: dict[str, str] = {
    "fp8_ds_mla": "656-byte record; SM90 (FLASHMLA_SPARSE), SM12x (TRITON_MLA_SPARSE_FP8_DS_MLA)",
    "auto": "bf16 latent; SM90 only (FLASH_ATTN_MLA_SPARSE, FLASHMLA_SPARSE)",
    "nvfp4_ds_mla": (
        "352-byte record; stock vLLM 0.34: SM100 only, refused with DCP > 1; the series: SM90 "
        "and SM12x with DCP (TRITON_MLA_SPARSE_FP8_DS_MLA, 0013/0014; its DCP 2 and 4 gates "
        "passed on one H100, nothing ran on SM12x)"
    ),
}

FORMAT_BITS: dict[str, float] = {
    "bf16": 16.0,
    "fp8-b128": 8.0 + 32.0 / (128 * 128),  # e4m3 + one fp32 scale per 128 x 128 block
    "int8-g128": 8.0 + 16.0 / 128,  # + one bf16 scale per group of 128
    "int4-g128": 4.0 + 16.0 / 128,
    "awq4-g128": 4.0 + 16.0 / 128 + 4.0 / 128,  # + a 4-bit zero point per group
    "nvfp4": 4.0 + 8.0 / 16,  # e2m1 + one e4m3 scale per 16
}


@dataclass(frozen=True)
class Machine:
    key: str
    heading: str
    """The docs/serving.md section heading that names this machine (its start)."""
    gpu: str
    gpus: int
    nodes: int
    gib_per_gpu: float
    capability: tuple[int, int]
    utilization: float


MACHINES: tuple[Machine, ...] = (
    Machine(
        "rtx-pro-6000-x4",
        "## 4 x RTX PRO 6000",
        "RTX PRO 6000 Blackwell",
        4,
        1,
        97887 / 1024,
        (12, 0),
        0.92,
    ),
    Machine(
        "spark-x2", "## DGX Spark, 2 nodes", "GB10 (DGX Spark)", 2, 2, 128 * GB / GIB, (12, 1), 0.90
    ),
    Machine(
        "spark-x4", "## DGX Spark, 4 nodes", "GB10 (DGX Spark)", 4, 4, 128 * GB / GIB, (12, 1), 0.90
    ),
    Machine("h100-x4", "## 4 x H100", "H100 80GB HBM3", 4, 1, 79.2, (9, 0), 0.92),
    Machine("h200-x4", "## 4 x H200", "H200", 4, 1, 139.8, (9, 0), 0.92),
    Machine("h200-x8", "## 8 x H200", "H200", 8, 1, 139.8, (9, 0), 0.92),
)
"""GPU memory in GiB as torch's CUDA device properties report it (what vLLM's
``--gpu-memory-utilization`` is a fraction of). H100 80GB HBM3 and H200: measured, the
``machine.gpus`` records of the project's gate runs on those cards (79.2 and 139.8 GiB).
RTX PRO 6000 Blackwell (97,887 MiB) and GB10 (128 GB shared with its OS, hence the lower
utilization) are not measured here: the cards' nominal totals."""


@dataclass(frozen=True)
class Checkpoint:
    slug: str
    id: str
    url: str
    config: dict[str, Any]
    meta: dict[str, Any]

    @property
    def quantization(self) -> str:
        qc = self.config.get("quantization_config") or {}
        return str(qc.get("quant_method", "none"))


def load_checkpoints(root: Path = FIXTURES) -> list[Checkpoint]:
    """Every fixture directory with a ``checkpoint.json`` (a recipe checkpoint), by slug."""
    out = []
    for meta_path in sorted(root.glob("*/checkpoint.json")):
        meta = json.loads(meta_path.read_text())
        config = json.loads((meta_path.parent / "config.json").read_text())
        out.append(Checkpoint(meta_path.parent.name, meta["id"], meta["url"], config, meta))
    return out


def machine(key_or_heading: str) -> Machine:
    for m in MACHINES:
        if key_or_heading in (m.key, m.heading) or key_or_heading.startswith(m.heading):
            return m
    raise KeyError(f"no machine for {key_or_heading!r}: {[m.key for m in MACHINES]}")


def checkpoint(model_id: str, checkpoints: Sequence[Checkpoint] | None = None) -> Checkpoint:
    for c in checkpoints if checkpoints is not None else load_checkpoints():
        if c.id == model_id:
            return c
    raise KeyError(f"no fixture for checkpoint {model_id!r}")


# -- KV cache --------------------------------------------------------------------------------


def indexer_layers(cfg: dict[str, Any]) -> int:
    """Layers that build an indexer (and so an indexer key cache): the main model's ``full``
    layers of ``indexer_types`` (all layers without it) plus each MTP layer."""
    kinds = cfg.get("indexer_types")
    main = cfg["num_hidden_layers"] if not kinds else sum(k == "full" for k in kinds)
    return int(main + cfg.get("num_nextn_predict_layers", 0))


def attention_layers(cfg: dict[str, Any]) -> int:
    return int(cfg["num_hidden_layers"] + cfg.get("num_nextn_predict_layers", 0))


def record_bytes(cfg: dict[str, Any], kv_dtype: str) -> int:
    """KV bytes per token per attention layer (the MLA latent record)."""
    if kv_dtype == "fp8_ds_mla":
        return FP8_DS_MLA_RECORD
    if kv_dtype == "nvfp4_ds_mla":
        return NVFP4_DS_MLA_RECORD
    if kv_dtype == "auto":
        return 2 * int(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    raise ValueError(f"unknown KV dtype {kv_dtype!r}: {sorted(KV_DTYPES)}")


def indexer_bytes(cfg: dict[str, Any]) -> int:
    """Indexer key-cache bytes per token per indexer layer (fp8 keys + fp32 scales)."""
    dim = int(cfg["index_head_dim"])
    return dim + dim // INDEXER_SCALE_BLOCK * 4


def kv_bytes_per_token(cfg: dict[str, Any], kv_dtype: str) -> int:
    """KV bytes one token costs on every GPU that holds it (all layers, MTP included)."""
    return attention_layers(cfg) * record_bytes(cfg, kv_dtype) + indexer_layers(
        cfg
    ) * indexer_bytes(cfg)


# -- weights ---------------------------------------------------------------------------------


def module_params(cfg: dict[str, Any]) -> list[tuple[str, int, bool]]:
    """(format class, parameters, replicated across TP) for the model and its MTP layers."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    nope, rope, v = (int(cfg[k]) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    q_lora, kv_lora = int(cfg["q_lora_rank"]), int(cfg["kv_lora_rank"])
    idx_heads, idx_dim = int(cfg["index_n_heads"]), int(cfg["index_head_dim"])
    experts, shared = int(cfg["n_routed_experts"]), int(cfg.get("n_shared_experts", 0))
    moe_inter, dense_inter = int(cfg["moe_intermediate_size"]), int(cfg["intermediate_size"])
    vocab, layers = int(cfg["vocab_size"]), int(cfg["num_hidden_layers"])
    nextn = int(cfg.get("num_nextn_predict_layers", 0))
    first_dense = int(cfg["first_k_dense_replace"])
    kinds = cfg.get("indexer_types") or ["full"] * layers

    out: list[tuple[str, int, bool]] = []

    def layer(index: int, attn_cls: str, has_indexer: bool, dense: bool) -> None:
        out.append((attn_cls, h * q_lora + h * (kv_lora + rope), True))  # fused q_a + kv_a
        out.append((attn_cls, q_lora * heads * (nope + rope) + kv_lora * heads * (nope + v), False))
        out.append((attn_cls, heads * v * h, False))  # o_proj
        if has_indexer:
            indexer = q_lora * idx_heads * idx_dim + h * idx_dim + h * idx_heads
            out.append(("indexer", indexer, True))
        if dense:
            out.append(("layer0" if index == 0 else "dense_mlp", 3 * h * dense_inter, False))
        else:
            out.append(("routed_experts", experts * 3 * h * moe_inter, False))
            out.append(("shared_experts", shared * 3 * h * moe_inter, False))
            out.append(("router", h * experts, True))

    for i in range(layers):
        layer(i, "layer0" if i == 0 else "attention", kinds[i] == "full", i < first_dense)
    for _ in range(nextn):
        layer(layers, "attention", True, False)
        out.append(("mtp_proj", 2 * h * h, True))  # eh_proj
        out.append(("embeddings", 2 * vocab * h, False))  # the MTP layer's embedding and head
    out.append(("embeddings", 2 * vocab * h, False))  # embed_tokens + lm_head
    return out


def weight_bytes(ckpt: Checkpoint, tp: int = 1) -> float:
    """Bytes of weights on one GPU at tensor parallel size ``tp`` (``tp=1``: the checkpoint)."""
    formats = ckpt.meta["formats"]
    total = 0.0
    for cls, params, replicated in module_params(ckpt.config):
        total += params * FORMAT_BITS[formats[cls]] / 8 / (1 if replicated else tp)
    return total


# -- the plan --------------------------------------------------------------------------------


def kv_gib_per_gpu(ckpt: Checkpoint, m: Machine, utilization: float | None = None) -> float:
    util = m.utilization if utilization is None else utilization
    return m.gib_per_gpu * util - weight_bytes(ckpt, m.gpus) / GIB - RESERVE_GIB


def kv_tokens_per_request(
    ckpt: Checkpoint, m: Machine, dcp: int, kv_dtype: str, utilization: float | None = None
) -> int:
    """Tokens of one request's context the machine's KV cache holds at DCP ``dcp`` (0: the
    weights do not fit)."""
    free = kv_gib_per_gpu(ckpt, m, utilization) * GIB
    if free <= 0:
        return 0
    return int(free // kv_bytes_per_token(ckpt.config, kv_dtype)) * dcp


def dcp_sizes(m: Machine) -> list[int]:
    return [n for n in (1, 2, 4, 8) if n <= m.gpus]


def _kv_dtypes_for(m: Machine) -> list[str]:
    bf16 = ["auto"] if m.capability[0] == 9 else []
    return ["fp8_ds_mla", *bf16, "nvfp4_ds_mla"]


def _k(tokens: int) -> str:
    return f"{tokens / 1000:,.0f}k" if tokens else "-"


def render(checkpoints: Sequence[Checkpoint] | None = None) -> str:
    ckpts = list(checkpoints) if checkpoints is not None else load_checkpoints()
    lines = [
        "# Memory you can plan with",
        "",
        "<!-- generated by tools/serving_plan.py from tests/support/serving_models; "
        "do not edit (make test fails when it is stale) -->",
        "",
        "Weights per GPU and KV-cache tokens per request for every recipe checkpoint on every "
        "machine of [serving.md](serving.md), computed from each checkpoint's `config.json` "
        "(geometry and `quantization_config`). They are estimates to plan with: the engine logs "
        "the real figures at start (`Available KV cache memory`, `GPU KV cache size`). The "
        "bytes-per-token arithmetic below is exact: given a fixed KV memory, the engine's "
        "logged pool equaled it to the token for `nvfp4_ds_mla` at DCP 1, 2 and 4 and for "
        "`fp8_ds_mla` at DCP 1 (seeded GLM-5-shaped checkpoint, one H100: "
        "[results/kv-pool-nvfp4-h100-0.34.0.json](../results/kv-pool-nvfp4-h100-0.34.0.json)). "
        f"Assumed per GPU: {RESERVE_GIB:g} GiB for activations, CUDA graphs and buffers; the "
        "memory CUDA reports; the `--gpu-memory-utilization` of the machine's row. With DCP "
        "the series' patch 0016 reserves the DCP query route's largest step inside that "
        "figure, before vLLM sizes the pool: per GPU, at TP 4 DCP 4, 8,192 batched tokens and "
        "the default `a2a` combine, 2.19 GiB for GLM-5.2's 64 heads and 4.39 GiB for "
        "DeepSeek-V3.2's 128 (its byte model; fewer `--max-num-batched-tokens` shrink it in "
        "proportion), so the engine's logged KV memory can fall below these rows.",
        "",
        "## KV bytes per token",
        "",
        "Per layer, by KV dtype (vLLM 0.34.0's own layouts), plus the indexer's key cache on "
        "every layer that builds an indexer; a token costs the sum over all layers on every GPU "
        "that holds it.",
        "",
        "| checkpoint | layers (+ MTP) | indexer layers | indexer B/token/layer "
        "| `fp8_ds_mla` B/token | `auto` (bf16) B/token | `nvfp4_ds_mla` B/token |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ckpts:
        cfg = c.config
        per = {d: kv_bytes_per_token(cfg, d) for d in ("fp8_ds_mla", "auto", "nvfp4_ds_mla")}
        lines.append(
            f"| `{c.id}` | {cfg['num_hidden_layers']} + {cfg.get('num_nextn_predict_layers', 0)} "
            f"| {indexer_layers(cfg)} | {indexer_bytes(cfg)} "
            f"| {per['fp8_ds_mla']:,} ({record_bytes(cfg, 'fp8_ds_mla')}/layer) "
            f"| {per['auto']:,} ({record_bytes(cfg, 'auto')}/layer) "
            f"| {per['nvfp4_ds_mla']:,} ({record_bytes(cfg, 'nvfp4_ds_mla')}/layer) |"
        )
    lines += ["", "KV dtypes:", ""]
    lines += [f"- `{d}`: {note}." for d, note in KV_DTYPES.items()]
    lines += [
        "",
        "## Weights",
        "",
        "| checkpoint | quantization | max context | weights (computed) | published |",
        "|---|---|---|---|---|",
    ]
    for c in ckpts:
        pub = c.meta.get("published_weights_gb")
        lines.append(
            f"| [`{c.id}`]({c.url}) | `{c.quantization}` "
            f"| {c.config['max_position_embeddings']:,} | {weight_bytes(c) / GB:,.0f} GB "
            f"| {f'{pub:,} GB' if pub else '-'} |"
        )
    lines += [
        "",
        "## Per machine",
        "",
        "KV tokens per request = what one GPU's KV memory holds x the DCP size (TP 4 or 8 "
        "throughout; MLA keeps every layer's latent on every TP rank). `-`: the weights do not "
        "fit. Past the model's max context a larger pool holds more requests, not a longer one.",
    ]
    for m in MACHINES:
        lines += [
            "",
            f"### {m.heading[3:]} ({m.gpus} x {m.gib_per_gpu:.1f} GiB, SM{m.capability[0]}"
            f"{m.capability[1]}, `--gpu-memory-utilization {m.utilization}`)",
            "",
            "| checkpoint | weights / GPU | KV / GPU | KV dtype | "
            + " | ".join(f"DCP {n}" for n in dcp_sizes(m))
            + " |",
            "|---|---|---|---|" + "---|" * len(dcp_sizes(m)),
        ]
        for c in ckpts:
            w = weight_bytes(c, m.gpus) / GIB
            kv = kv_gib_per_gpu(c, m)
            for d in _kv_dtypes_for(m):
                toks = [kv_tokens_per_request(c, m, n, d) for n in dcp_sizes(m)]
                lines.append(
                    f"| `{c.id}` | {w:.1f} GiB | {max(kv, 0):.1f} GiB | `{d}` | "
                    + " | ".join(_k(t) for t in toks)
                    + " |"
                )
    lines += [
        "",
        "## Next to the users' own figures",
        "",
        "| deployment | machine | KV | their figures | here |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in SEEDS]
    lines.append("")
    return "\n".join(lines)


SEEDS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "GLM-5.2 MXFP8/NVFP4/NF3 hybrid, ~341 GB",
        "4 x RTX PRO 6000, TP 4, DCP 4, MTP 3",
        "4-bit records (432 B, a fork's layout)",
        "KV pools of 302,047 and 599,040 tokens; 300k-480k context",
        "NF3 is no vLLM 0.34 quantization method; closest here: the REAP-504B "
        "`nvfp4_ds_mla` row (352 B records)",
    ),
    (
        "`QuantTrio/GLM-5.2-Int4-Int8Mix`, 406 GB",
        "4 x DGX Spark over RoCE, TP 4, DCP 2 (DCP 4 profile)",
        "`fp8_ds_mla`",
        "290,816-327,680 context at DCP 2; 655,360 at DCP 4; ~9.5 GiB KV per rank",
        "the DGX Spark, 4 nodes row (a lower utilization here)",
    ),
    (
        "GLM-5.3 Flash NVFP4",
        "DGX Spark, TP 4, DCP 1/2/4",
        "-",
        "-",
        "another architecture (`Glm5NextForConditionalGeneration`, hybrid linear + sparse "
        "MLA): not served by the series' backends",
    ),
)
"""The users' own deployments (public write-ups; their numbers, not measured here)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {OUTPUT.name}")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        OUTPUT.write_text(text)
        return 0
    current = OUTPUT.read_text() if OUTPUT.is_file() else ""
    if current == text:
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            current.splitlines(True), text.splitlines(True), str(OUTPUT), "generated"
        )
    )
    print(f"serving_plan: {OUTPUT} is stale: run python tools/serving_plan.py --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
