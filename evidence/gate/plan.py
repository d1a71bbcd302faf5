# SPDX-License-Identifier: Apache-2.0
"""What a gate run serves: its configuration, its seeded token-id prompts, and the launch
environment of each rank (N processes on one GPU with their own NCCL host identities, or one
rank per GPU when there are N GPUs). Pure Python: no vLLM, no torch."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

# Token ids drawn for prompts: skip bos/eos (0, 1), stay below every gate vocabulary (32000).
PROMPT_ID_RANGE = (2, 31999)
SINGLE_LENS = (1024, 8192, 32000)
# One batch of requests of different lengths arriving together: prefill chunks and decode
# rows of different requests share steps.
BATCH_LENS = (700, 2600, 9100, 17000)
# The sensitivity pass changes the token at this position ("near the start").
PERTURB_POSITION = 5
PASSES = ("clean", "repeat", "sensitivity", "fault")
TRANSPORT_EMULATED = "one-GPU emulation (socket transport)"
TRANSPORT_NATIVE = "one rank per GPU (NCCL's own transport)"
VARIANTS = ("stock", "patched")
# engine_extra: what the series adds to EngineArgs (patched only) and MTP (both trees).
PREFILL_ROUTES = ("query", "packed_ckv", "ckv", "auto")  # packed_ckv: vLLM 0.34; ckv, auto: 0.33
WIRE_DTYPES = ("auto", "fp8")
# vLLM's ag_rs and a2a; b12x: the series' 0015 (its PCIe DCP channel)
COMM_BACKENDS = ("ag_rs", "a2a", "b12x")
MERGE_BACKENDS = ("auto", "cutedsl", "triton", "torch")
ENGINE_EXTRA_KEYS = (
    "dcp_comm_backend",
    "dcp_prefill_route",
    "dcp_wire_dtype",
    "dcp_comm_ledger_size",
    "kernel_config",
    "speculative_config",
)
# engine_extra keys the harness consumes itself and never passes to vLLM: the gate's comm ledger
# (gate/comm_ledger.py; vLLM 0.33's series had it as patch 0009), eager runs only.
HARNESS_KEYS = ("dcp_comm_ledger_size",)
KERNEL_CONFIG_KEYS = ("sparse_indexer_dcp_merge_backend",)
SPEC_KEYS = (
    "method",
    "num_speculative_tokens",
    "adaptive_speculative_tokens",
    "adaptive_speculative_tokens_ladder",
    "adaptive_speculative_tokens_window",
)
ADAPTIVE_MODES = ("off", "acceptance")
PATCHED_ONLY_BACKENDS = ("TRITON_MLA_SPARSE_FP8_DS_MLA",)
# Set in an emulated run's rank environment (ranks sharing a GPU): the worker then keeps
# vLLM off the paths whose symmetric memory needs one device per rank (worker.engine_kwargs).
EMULATED_ENV = "GATE_EMULATED"
# The memory test's negative controls (gate/memory_probe.py reads the rank environment).
DROP_RESERVATION_ENV = "GATE_DROP_DCP_RESERVATION"
DROP_RESERVATION = ("alloc", "all")
# The packed-CKV prefill route (0007) gathers fp8_ds_mla records and attends bf16 queries:
# vLLM 0.34 refuses another KV dtype (MLADCPPackedCKVPrefill) and a backend whose impl takes a
# quantized query (DeepseekV32Attention._init_packed_ckv_prefill: FLASHINFER_MLA_SPARSE).
# These two take bf16 queries on an fp8_ds_mla cache (supports_quant_query_input False).
PACKED_CKV_BACKENDS = ("TRITON_MLA_SPARSE_FP8_DS_MLA", "FLASHMLA_SPARSE")
# vLLM 0.34.0 refuses the 4-bit nvfp4_ds_mla cache with DCP > 1 (VllmConfig); the series'
# 0014 lifts that for its Triton sparse-MLA backend only (patched tree, PATCHED_ONLY_BACKENDS).
NVFP4_DCP_BACKENDS = ("TRITON_MLA_SPARSE_FP8_DS_MLA",)


def engine_extra_problems(extra: dict[str, Any], variant: str, dcp: int) -> list[str]:
    """What is wrong with a run's engine_extra (merged into LLM(**kwargs)): unknown keys or
    values name the valid ones; the series' fields need the patched tree."""
    out = []
    if not isinstance(extra, dict):
        return [f"engine_extra must be a dict, got {type(extra).__name__}"]
    unknown = sorted(set(extra) - set(ENGINE_EXTRA_KEYS))
    if unknown:
        out.append(f"unknown engine_extra keys {unknown}; valid: {', '.join(ENGINE_EXTRA_KEYS)}")
    series = []
    route = extra.get("dcp_prefill_route", "query")
    if route not in PREFILL_ROUTES:
        out.append(f"dcp_prefill_route {route!r}; valid: {', '.join(PREFILL_ROUTES)}")
    if "dcp_prefill_route" in extra:
        series.append("dcp_prefill_route")
    wire = extra.get("dcp_wire_dtype", "auto")
    if wire not in WIRE_DTYPES:
        out.append(f"dcp_wire_dtype {wire!r}; valid: {', '.join(WIRE_DTYPES)}")
    if "dcp_wire_dtype" in extra:
        series.append("dcp_wire_dtype")
    comm = extra.get("dcp_comm_backend")
    if comm is not None and comm not in COMM_BACKENDS:
        out.append(f"dcp_comm_backend {comm!r}; valid: {', '.join(COMM_BACKENDS)}")
    if comm == "b12x":
        series.append("dcp_comm_backend b12x")
        if dcp < 2:
            out.append("dcp_comm_backend b12x needs dcp >= 2")
    ledger = extra.get("dcp_comm_ledger_size", 0)
    if isinstance(ledger, bool) or not isinstance(ledger, int) or ledger < 0:
        out.append(f"dcp_comm_ledger_size must be an int >= 0, got {ledger!r}")
    if "dcp_comm_ledger_size" in extra:
        series.append("dcp_comm_ledger_size")
    if (route != "query" or wire != "auto" or (isinstance(ledger, int) and ledger > 0)) and (
        dcp < 2
    ):
        out.append("dcp_prefill_route, dcp_wire_dtype and the ledger need dcp >= 2")
    kc = extra.get("kernel_config", {})
    if not isinstance(kc, dict):
        out.append("kernel_config must be a dict")
    else:
        bad = sorted(set(kc) - set(KERNEL_CONFIG_KEYS))
        if bad:
            out.append(f"unknown kernel_config keys {bad}; valid: {', '.join(KERNEL_CONFIG_KEYS)}")
        mb = kc.get("sparse_indexer_dcp_merge_backend", "auto")
        if mb not in MERGE_BACKENDS:
            out.append(
                f"sparse_indexer_dcp_merge_backend {mb!r}; valid: {', '.join(MERGE_BACKENDS)}"
            )
        if "sparse_indexer_dcp_merge_backend" in kc:
            series.append("kernel_config.sparse_indexer_dcp_merge_backend")
    spec = extra.get("speculative_config")
    if spec is not None:
        out += _spec_problems(spec, series)
    if series and variant != "patched":
        out.append(f"{', '.join(series)} exist only in the patched series: set variant='patched'")
    return out


def _spec_problems(spec: Any, series: list[str]) -> list[str]:
    if not isinstance(spec, dict):
        return ["speculative_config must be a dict"]
    out = []
    bad = sorted(set(spec) - set(SPEC_KEYS))
    if bad:
        out.append(f"unknown speculative_config keys {bad}; valid: {', '.join(SPEC_KEYS)}")
    if spec.get("method") != "mtp":
        out.append(f"speculative_config.method {spec.get('method')!r}; valid: mtp")
    k = spec.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        out.append(f"num_speculative_tokens must be an int >= 1, got {k!r}")
        k = None
    mode = spec.get("adaptive_speculative_tokens", "off")
    if mode not in ADAPTIVE_MODES:
        out.append(f"adaptive_speculative_tokens {mode!r}; valid: {', '.join(ADAPTIVE_MODES)}")
    if "adaptive_speculative_tokens" in spec:
        series.append("speculative_config.adaptive_speculative_tokens")
    ladder = spec.get("adaptive_speculative_tokens_ladder")
    if ladder is not None:
        if mode != "acceptance":
            out.append("adaptive_speculative_tokens_ladder needs adaptive='acceptance'")
        ok = (
            isinstance(ladder, list)
            and ladder
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in ladder)
            and all(a < b for a, b in zip(ladder, ladder[1:], strict=False))
        )
        if not ok:
            out.append(f"the ladder must be strictly increasing ints >= 1, got {ladder!r}")
        elif k is not None and ladder[-1] != k:
            out.append(f"the ladder's largest depth {ladder[-1]} must equal {k}")
    return out


@dataclasses.dataclass
class GateConfig:
    """One engine configuration of the gate (all ranks run it, SPMD)."""

    name: str
    model: str
    tp: int = 1
    dcp: int = 1
    backend: str | None = None
    kv_cache_dtype: str | None = None
    graphs: bool = False
    passes: tuple[str, ...] = ("clean",)
    lens: tuple[int, ...] = SINGLE_LENS
    batch_lens: tuple[int, ...] = BATCH_LENS
    max_tokens: int = 32
    logprobs: int = 20
    max_model_len: int = 32768
    max_num_batched_tokens: int = 8192
    kv_cache_memory_bytes: int = 1 << 30
    gpu_memory_utilization: float = 0.03
    cudagraph_capture_sizes: tuple[int, ...] = (1, 2, 4, 8)
    # vLLM's max_num_seqs; None: 8 or the batch's size if larger. It sets the rows of vLLM's
    # DCP workspaces (get_dcp_workspace_max_num_tokens), hence the b12x channel's slab
    max_num_seqs: int | None = None
    # DCP rank whose partial the fault drops: -1 = the last one, or, with a needle
    # checkpoint, the rank that holds the needle (see __post_init__)
    fault_rank: int = -1
    seed: int = 0
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # extra rank environment
    needle: int = -1  # a needle checkpoint's token id, put at PERTURB_POSITION of every prompt
    variant: str = "stock"  # which vLLM tree the ranks import (VARIANTS)
    engine_extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # into LLM(**kw)
    warmup: bool = False  # later runs of the queue wait until this one's engine is up
    # record each rank's memory (gate/memory_probe.py): the profiled peak, each step's peak
    # and vLLM's KV figures, and where each peak happened (forward hooks that read the
    # allocator at every hooked module's entry and exit); it synchronises the device around
    # every step (a run's decode times then include that and the hooks), and needs an eager
    # run: a CUDA graph replay allocates nothing
    memory_probe: bool = False
    # vLLM's prefix cache; off unless a gate tests it: repeated and faulted passes must
    # recompute. On, the repeat pass re-serves the clean prompts from the cache (a cache hit).
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        self.passes = tuple(self.passes)
        self.lens = tuple(int(n) for n in self.lens)
        self.batch_lens = tuple(int(n) for n in self.batch_lens)
        self.cudagraph_capture_sizes = tuple(self.cudagraph_capture_sizes)
        if self.needle != -1 and self.fault_rank == -1 and self.dcp > 1:
            # The needle (token PERTURB_POSITION) lives on DCP rank position % dcp
            # (cp_kv_cache_interleave_size 1). Dropping another rank's partial only
            # removes 1/dcp of the keys the needle outweighs: at DCP=4 that moved the
            # log-probs by 0.1252 against a tolerance of 0.1260 (lease 2026-12-01),
            # a control the gate could not catch. Drop the needle's rank instead.
            self.fault_rank = PERTURB_POSITION % self.dcp
        errors = self.problems()
        if errors:
            raise ValueError(f"gate config {self.name!r}: " + "; ".join(errors))

    def problems(self) -> list[str]:
        out = []
        if self.tp < 1 or self.dcp < 1 or self.tp % self.dcp:
            out.append(f"tp ({self.tp}) must be a multiple of dcp ({self.dcp}), both >= 1")
        bad = [p for p in self.passes if p not in PASSES]
        if bad:
            out.append(f"unknown passes {bad}; valid: {', '.join(PASSES)}")
        if "clean" not in self.passes:
            out.append("every run needs the 'clean' pass")
        if "fault" in self.passes and self.dcp < 2:
            out.append("the 'fault' pass drops one DCP rank's partial: it needs dcp >= 2")
        if not isinstance(self.enable_prefix_caching, bool):
            out.append(f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        elif self.enable_prefix_caching and "fault" in self.passes:
            out.append(
                "the 'fault' pass needs enable_prefix_caching false: a prefix cached by the "
                "clean pass would skip the faulted attention of the prompt"
            )
        if self.max_num_seqs is not None and (
            not isinstance(self.max_num_seqs, int)
            or isinstance(self.max_num_seqs, bool)
            or self.max_num_seqs < len(self.batch_lens)
        ):
            out.append(
                f"max_num_seqs must be an int >= the batch's {len(self.batch_lens)} prompts "
                f"(or null), got {self.max_num_seqs!r}"
            )
        if self.max_tokens < 32:
            out.append(f"max_tokens must be >= 32, got {self.max_tokens}")
        longest = max(self.lens + self.batch_lens, default=0)
        if longest + self.max_tokens > self.max_model_len:
            out.append(f"prompt {longest} + {self.max_tokens} exceeds max_model_len")
        if any(n <= PERTURB_POSITION for n in self.lens + self.batch_lens):
            out.append(f"prompts must be longer than the perturbed position {PERTURB_POSITION}")
        if self.needle != -1 and not PROMPT_ID_RANGE[0] <= self.needle < PROMPT_ID_RANGE[1]:
            out.append(f"needle {self.needle} is outside the prompt id range {PROMPT_ID_RANGE}")
        if self.variant not in VARIANTS:
            out.append(f"unknown variant {self.variant!r}; valid: {', '.join(VARIANTS)}")
        out += engine_extra_problems(self.engine_extra, self.variant, self.dcp)
        if self.graphs and self.engine_extra.get("dcp_comm_ledger_size", 0):
            out.append(
                "dcp_comm_ledger_size needs an eager run (graphs false): a FULL CUDA graph "
                "replays no Python, so the ledger would miss those calls"
            )
        if self.backend in PATCHED_ONLY_BACKENDS and self.variant != "patched":
            out.append(f"backend {self.backend} exists only in the patched series")
        if self.engine_extra.get("dcp_prefill_route") == "packed_ckv":
            if self.kv_cache_dtype != "fp8_ds_mla":
                out.append(
                    "dcp_prefill_route packed_ckv gathers fp8_ds_mla records: kv_cache_dtype "
                    f"must be 'fp8_ds_mla', got {self.kv_cache_dtype!r}"
                )
            if self.backend not in PACKED_CKV_BACKENDS:
                out.append(
                    f"dcp_prefill_route packed_ckv needs a backend that takes bf16 queries, "
                    f"got {self.backend!r}; valid: {', '.join(PACKED_CKV_BACKENDS)}"
                )
        if (
            self.kv_cache_dtype == "nvfp4_ds_mla"
            and self.dcp > 1
            and self.backend not in NVFP4_DCP_BACKENDS
        ):
            out.append(
                f"kv_cache_dtype nvfp4_ds_mla with dcp > 1 needs backend "
                f"{' or '.join(NVFP4_DCP_BACKENDS)} (vLLM 0.34.0 refuses the rest), "
                f"got {self.backend!r}"
            )
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            out.append("env must map str to str")
        if not isinstance(self.memory_probe, bool):
            out.append(f"memory_probe must be a bool, got {self.memory_probe!r}")
        elif self.memory_probe and not (
            isinstance(self.kv_cache_memory_bytes, int) and self.kv_cache_memory_bytes > 0
        ):
            out.append(
                "memory_probe needs kv_cache_memory_bytes (a positive int): without it vLLM "
                "sizes the KV pool from the torch peak that the probe's cuts reset"
            )
        elif self.memory_probe and self.graphs:
            out.append(
                "memory_probe needs an eager run (graphs false): a CUDA graph replay "
                "allocates nothing the probe could see"
            )
        drop = self.env.get(DROP_RESERVATION_ENV)
        if drop is not None and (drop not in DROP_RESERVATION or not self.memory_probe):
            out.append(
                f"{DROP_RESERVATION_ENV} (a memory negative control) takes "
                f"{' or '.join(DROP_RESERVATION)} and needs memory_probe true"
            )
        return out

    @property
    def speculative(self) -> bool:
        return self.engine_extra.get("speculative_config") is not None

    @property
    def world_size(self) -> int:
        return self.tp

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GateConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(
                f"unknown gate config keys {sorted(unknown)}; valid: {', '.join(sorted(fields))}"
            )
        return cls(**d)


def make_prompts(cfg: GateConfig) -> dict[str, list[int]]:
    """The seeded prompts of every run of this seed: key -> token ids. With a needle
    checkpoint every prompt carries the needle at PERTURB_POSITION (and nowhere else)."""

    def draw(key: str, n: int) -> list[int]:
        # one stream per prompt key: a run with fewer prompts gets the same ones
        rng = random.Random(f"{cfg.seed}/{key}")
        ids = [rng.randrange(*PROMPT_ID_RANGE) for _ in range(n)]
        if cfg.needle != -1:
            ids = [x if x != cfg.needle else x + 1 for x in ids]
            ids[PERTURB_POSITION] = cfg.needle
        return ids

    out = {}
    for n in cfg.lens:
        out[f"single/{n}"] = draw(f"single/{n}", n)
    for i, n in enumerate(cfg.batch_lens):
        out[f"batch/{i}/{n}"] = draw(f"batch/{i}/{n}", n)
    return out


def perturb(ids: list[int], position: int = PERTURB_POSITION) -> list[int]:
    """The same prompt with one token changed (to another id of the prompt range; with a
    needle checkpoint: the needle replaced by an ordinary token)."""
    lo, hi = PROMPT_ID_RANGE
    out = list(ids)
    out[position] = lo + (out[position] - lo + 7919) % (hi - lo)
    assert out[position] != ids[position]
    return out


def pass_groups(cfg: GateConfig, pass_name: str) -> list[list[str]]:
    """The generate() calls of one pass of ``cfg`` (see pass_keys)."""
    return pass_keys(cfg.lens, cfg.batch_lens, pass_name)


def pass_keys(lens: Sequence[int], batch_lens: Sequence[int], pass_name: str) -> list[list[str]]:
    """The generate() calls of one pass of a run serving single prompts of ``lens`` and one
    batch of ``batch_lens``, each a list of prompt keys sent together.

    ``clean``: every single prompt on its own, then the batch together. ``repeat`` (identical
    runs) and ``fault`` (the negative control): the two shortest single prompts and the batch.
    ``sensitivity``: every single prompt with the token at PERTURB_POSITION changed
    (keys ``single/<n>~p<pos>``)."""
    singles = [[f"single/{n}"] for n in lens]
    batch = [[f"batch/{i}/{n}" for i, n in enumerate(batch_lens)]] if batch_lens else []
    if pass_name == "clean":
        return singles + batch
    if pass_name in ("repeat", "fault"):
        return singles[:2] + batch
    if pass_name == "sensitivity":
        return [[f"single/{n}~p{PERTURB_POSITION}"] for n in lens]
    raise ValueError(f"unknown pass {pass_name!r}; valid: {', '.join(PASSES)}")


def prompt_for(key: str, prompts: dict[str, list[int]]) -> list[int]:
    base, _, tail = key.partition("~p")
    ids = prompts[base]
    return perturb(ids, int(tail)) if tail else ids


def prompt_digest(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def rank_envs(world: int, gpus: int, port: int, tag: str) -> list[dict[str, str]]:
    """The environment of each rank of one run of ``world`` ranks on a machine with ``gpus``.

    ``gpus >= world``: one rank per GPU (LOCAL_RANK = rank), NCCL picks its own transport.
    Fewer GPUs: rank r runs on GPU r % gpus and claims its own host (NCCL_HOSTID), so NCCL
    accepts several ranks of one communicator on one device and talks over its socket
    transport on the loopback interface. Every rank runs vLLM's external_launcher (SPMD, the
    engine in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0); a single rank runs in-process too.
    """
    if gpus < 1:
        raise ValueError("no GPU visible: the gate needs at least one")
    if world < 1:
        raise ValueError("world size must be >= 1")
    emulated = gpus < world
    envs = []
    for r in range(world):
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model sends a callable
            "OMP_NUM_THREADS": "2",  # many ranks share the machine's cores
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
        if world > 1:
            env |= {
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(r % gpus),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
            if emulated:
                env |= {
                    "NCCL_HOSTID": f"gate-{tag}-{port}-r{r}",
                    "NCCL_SOCKET_IFNAME": "lo",
                    # the symmetric-memory direct DCP collectives map peer GPUs' buffers:
                    # ranks sharing one device take vLLM's NCCL collectives instead
                    **{f"VLLM_USE_DIRECT_DCP_{op}": "0" for op in ("A2A", "Q_GATHER", "KV_GATHER")},
                    EMULATED_ENV: "1",
                }
        envs.append(env)
    return envs


def vllm_tree(variant: str, environ: dict[str, str]) -> str:
    """The vLLM tree a variant's ranks import: $GATE_VLLM_STOCK / $GATE_VLLM_PATCHED, else
    what .gpu/device-env.sh stages (${GPU_ROOT:-$HOME}/gpu-vllm, .../gpu-vllm-patched)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    explicit = environ.get(f"GATE_VLLM_{variant.upper()}")
    if explicit:
        return explicit
    root = environ.get("GPU_ROOT") or environ.get("HOME", "/root")
    return f"{root}/gpu-vllm" + ("-patched" if variant == "patched" else "")


def variant_pythonpath(variant: str, environ: dict[str, str]) -> str:
    """PYTHONPATH for a rank of this variant: its tree first, the other variant's tree
    removed, everything else (dependencies, the worker's helpers) kept in order."""
    trees = {vllm_tree(v, environ).rstrip("/") for v in VARIANTS}
    keep = [p for p in environ.get("PYTHONPATH", "").split(":") if p and p.rstrip("/") not in trees]
    return ":".join([vllm_tree(variant, environ), *keep])


def transport(world: int, gpus: int) -> str:
    if world == 1:
        return "single rank"
    return TRANSPORT_EMULATED if gpus < world else TRANSPORT_NATIVE
