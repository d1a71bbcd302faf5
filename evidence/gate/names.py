# SPDX-License-Identifier: Apache-2.0
"""What a gate run's name says, and whether its configuration says the same.

A run name reads ``[KIND-]CHECKPOINT[-tpN-dcpM][-TOKEN...]``, e.g. ``p-glmn-tp4-dcp4-ckv-graphs``:
the patched series on the ``glmn`` checkpoint at TP 4 DCP 4, prefill over the packed-CKV route,
under CUDA graphs. :data:`KINDS`, :data:`CHECKPOINT_FAMILIES` and :data:`TOKENS` hold every
word; :func:`decode` turns a name into its claims and :func:`contradictions` lists where a run's
configuration says otherwise (evidence/tests/test_gate_names.py checks every committed run).
A name says at least its kind, checkpoint, TP and DCP; a token it leaves out means the
default: eager, fp8_ds_mla records on the Triton sparse-MLA backend (FlashMLA-sparse for stock
vLLM, which has no Triton backend, and for the wide-heads checkpoint ``v32w``), the query
route, no speculation, 1k/8k prompts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

KINDS: dict[str, str] = {
    "p": "the patched series (variant patched)",
    "s": "stock vLLM (variant stock)",
    "m": "memory test: per-rank memory record of the patched series",
    "c": "capacity: the largest KV pool a fixed budget holds",
    "x": "experiment: a checkpoint's needle scanned over prompt lengths",
    "smoke": "smoke run: does an engine start and answer",
    "": "stock vLLM, the needle checkpoints' first runs (no kind prefix)",
}
"""Name prefix -> what kind of run it is."""

CHECKPOINT_FAMILIES: dict[str, str] = {
    "glmn": "GLM-5 geometry (64 heads, top-k 2048 over a 256-token indexer), with a needle",
    "glmnm": "glmn plus an MTP head that predicts the answer (accepted drafts)",
    "glmn1m": "glmn with room for 1M-token prompts",
    "glmns1m": "glmn1m with a stronger needle (attention margin 13, answer logit 10)",
    "glmno1m": "glmns1m whose answer is gone without the needle (ortho_embed=1)",
    "v32n": "DeepSeek-V3.2 geometry (32 heads), with a needle",
    "v32w": "V3.2 geometry with 128 heads (wide); its runs use FLASHMLA_SPARSE (patch 0006)",
    "v32n1m": "v32n with room for 1M-token prompts (its a/l/i/w suffixes: needle knobs)",
    "v32": "V3.2 geometry without a needle",
}
"""Checkpoint family (the longest that starts the checkpoint word) -> what it is; the suites'
``checkpoints`` give the exact make_dsa_gate_ckpt.py arguments."""

TOKENS: dict[str, str] = {
    "graphs": "FULL_AND_PIECEWISE CUDA graphs (else eager)",
    "fa": "backend FLASH_ATTN_MLA_SPARSE (bf16 records)",
    "flashmla": "backend FLASHMLA_SPARSE",
    "bf16": "bf16 KV records (kv_cache_dtype auto)",
    "fp8": "fp8_ds_mla KV records, named where the suite compares formats",
    "nvfp4": "4-bit nvfp4_ds_mla KV records",
    "ckv": "DCP prefill over the packed-CKV route",
    "fp8wire": "DCP collectives carry fp8",
    "b12x": "DCP collectives over b12x's PCIe channel (dcp_comm_backend b12x, 0015)",
    "ledger": "the DCP comm ledger on",
    "noledger": "the comm ledger's reference run, ledger off",
    "merge-torch": "top-k merge backend torch",
    "merge-triton": "top-k merge backend triton",
    "merge-cutedsl": "top-k merge backend cutedsl",
    "mtpN": "MTP speculation with N draft tokens",
    "mtpadaptive": "MTP with the adaptive depth (acceptance-driven)",
    "seqsN": "max_num_seqs N (the rows of vLLM's DCP workspaces and of a b12x channel)",
    "prefixcache": "the prefix cache on (the repeat pass is a hit)",
    "unreserved": "memory control: the series' DCP reservation dropped entirely",
    "noalloc": "memory control: the DCP reservation's allocation dropped",
    "len": "a length scan (several prompt lengths)",
    "o2": "needle calibration at o-gain 2",
    "o4": "needle calibration at o-gain 4",
    "Nk": "prompts of N x 1024 tokens (32k, 128k, 256k, 512k; 1m: 2^20)",
}
"""Name token -> what the run does differently from the default."""

_NAME = re.compile(r"^(?P<ckpt>[a-z0-9]+(?:-o[24])?)(?P<rest>(?:-[a-z0-9]+)*)$")
_LENGTH = re.compile(r"^(\d+)k$|^1m$")
_MTP = re.compile(r"mtp(\d+)")
_SEQS = re.compile(r"seqs(\d+)")
_BACKENDS = {"fa": "FLASH_ATTN_MLA_SPARSE", "flashmla": "FLASHMLA_SPARSE"}
_KIND_VARIANT = {"p": "patched", "m": "patched", "c": "patched", "s": "stock"}
"""The variant each kind runs; these kinds' names must say TP and DCP."""


def default_backend(kind: str, checkpoint: str) -> str:
    """The backend a name without ``fa``/``flashmla`` means: stock vLLM's runs (kinds ``s``,
    ``smoke`` and none) use FlashMLA-sparse, it having no Triton sparse-MLA backend, and so does
    the wide-heads checkpoint, which tests FlashMLA-sparse's wide heads."""
    if kind in ("s", "", "smoke") or family(checkpoint) == "v32w":
        return "FLASHMLA_SPARSE"
    return "TRITON_MLA_SPARSE_FP8_DS_MLA"


@dataclass
class Claims:
    """What a name says about its run; ``None``: the name does not say."""

    kind: str
    checkpoint: str
    tp: int | None
    dcp: int | None
    tokens: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def family(checkpoint: str) -> str | None:
    """The longest checkpoint family the checkpoint word starts with."""
    word = checkpoint.split("-")[0]
    found = [f for f in CHECKPOINT_FAMILIES if word.startswith(f)]
    return max(found, key=len) if found else None


def decode(name: str) -> Claims:
    """Split a run name into its claims; words outside the vocabulary land in ``unknown``."""
    kind, checkpoint = "", name
    head, _, tail = name.partition("-")
    if head in KINDS and tail:
        kind, checkpoint = head, tail
    if kind == "smoke":
        checkpoint, rest = "", tail
    else:
        m = _NAME.match(checkpoint)
        if m is None:
            return Claims(kind, "", None, None, unknown=[name])
        checkpoint, rest = m["ckpt"], m["rest"]
    claims = Claims(kind, checkpoint, None, None)
    words = iter(w for w in rest.split("-") if w)
    for w in words:
        if w.startswith("tp") and w[2:].isdigit():
            claims.tp = int(w[2:])
        elif w.startswith("dcp") and w[3:].isdigit():
            claims.dcp = int(w[3:])
        elif w == "merge":
            follow = next(words, None)
            token = w if follow is None else f"merge-{follow}"
            (claims.tokens if token in TOKENS else claims.unknown).append(token)
        elif w in TOKENS or _MTP.fullmatch(w) or _SEQS.fullmatch(w) or _LENGTH.match(w):
            claims.tokens.append(w)
        else:
            claims.unknown.append(w)
    if checkpoint and family(checkpoint) is None:
        claims.unknown.append(checkpoint)
    return claims


def _prompt_len(token: str) -> int | None:
    m = _LENGTH.match(token)
    if m is None:
        return None
    return 1 << 20 if token == "1m" else int(m[1]) * 1000


def contradictions(run: dict[str, Any]) -> list[str]:
    """Where the run's configuration says something its name does not, or the reverse; empty
    when the name says what the run is."""
    name = run["name"]
    c = decode(name)
    out = [f"{name}: unknown word {w!r}" for w in c.unknown]
    extra = run.get("engine_extra") or {}
    spec = extra.get("speculative_config") or {}
    merge = (extra.get("kernel_config") or {}).get("sparse_indexer_dcp_merge_backend")
    variant = run.get("variant", "stock")
    want = _KIND_VARIANT.get(c.kind)
    if want and variant != want:
        out.append(f"{name}: kind {c.kind!r} but variant {variant!r}")
    model = str(run.get("model", "")).removeprefix("@")
    if c.checkpoint and family(c.checkpoint) != family(model):
        out.append(f"{name}: checkpoint {c.checkpoint!r} but model {model!r}")
    for label, said, real in (("tp", c.tp, run.get("tp")), ("dcp", c.dcp, run.get("dcp"))):
        if said is not None and said != real:
            out.append(f"{name}: {label} {said} but configured {real}")
        if said is None and c.kind in _KIND_VARIANT:
            out.append(f"{name}: the name does not say its {label}")
    tokens = set(c.tokens)
    checks = {
        "graphs": bool(run.get("graphs")),
        "nvfp4": run.get("kv_cache_dtype") == "nvfp4_ds_mla",
        # packed_ckv on vLLM 0.34; ckv in the suites written on 0.33.0
        "ckv": extra.get("dcp_prefill_route") in ("packed_ckv", "ckv"),
        "fp8wire": extra.get("dcp_wire_dtype") == "fp8",
        "b12x": extra.get("dcp_comm_backend") == "b12x",
        "prefixcache": bool(run.get("enable_prefix_caching")),
        "mtpadaptive": bool(spec.get("adaptive_speculative_tokens")),
    }
    for token, configured in checks.items():
        if (token in tokens) != configured:
            said = "says" if token in tokens else "does not say"
            out.append(f"{name}: the name {said} {token!r}, the configuration disagrees")
    word = next((t for t in ("fa", "flashmla") if t in tokens), None)
    backend = _BACKENDS[word] if word else default_backend(c.kind, c.checkpoint or model)
    if run.get("backend") != backend:
        out.append(f"{name}: backend {run.get('backend')!r} but the name means {backend}")
    if "bf16" in tokens and run.get("kv_cache_dtype") != "auto":
        out.append(f"{name}: says bf16, kv_cache_dtype {run.get('kv_cache_dtype')!r}")
    if "fp8" in tokens and run.get("kv_cache_dtype") != "fp8_ds_mla":
        out.append(f"{name}: says fp8, kv_cache_dtype {run.get('kv_cache_dtype')!r}")
    said_merge = next((t.removeprefix("merge-") for t in tokens if t.startswith("merge-")), None)
    if said_merge != merge:
        out.append(f"{name}: merge backend {merge!r} but the name says {said_merge!r}")
    depth = next((int(m[1]) for t in tokens if (m := _MTP.fullmatch(t))), None)
    if depth is not None and (
        spec.get("num_speculative_tokens") != depth or spec.get("adaptive_speculative_tokens")
    ):
        out.append(f"{name}: says mtp{depth}, speculative_config {spec!r}")
    if depth is None and "mtpadaptive" not in tokens and spec:
        out.append(f"{name}: speculates ({spec.get('method')}) but the name does not say mtp")
    seqs = next((int(m[1]) for t in tokens if (m := _SEQS.fullmatch(t))), None)
    if seqs != run.get("max_num_seqs"):
        out.append(f"{name}: max_num_seqs {run.get('max_num_seqs')!r} but the name says {seqs!r}")
    lens = [n for n in map(_prompt_len, c.tokens) if n]
    if lens and max(run.get("lens") or [0]) < lens[0] * 0.9:
        out.append(f"{name}: says {lens[0]}-token prompts, lens {run.get('lens')}")
    return out
