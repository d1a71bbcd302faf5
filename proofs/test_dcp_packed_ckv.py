# SPDX-License-Identifier: Apache-2.0
"""CPU proofs of the packed-CKV ownership inversion for DCP sparse-MLA prefill (on the pinned
vLLM base, pins.toml).

Shipped code under test, all from the patched tree: the cores
(vllm/v1/attention/ops/dcp_packed_ckv.py: layout, Triton pack and its torch reference), the
byte model and route choice (dcp_wire_model.py), and vLLM's own index kernels the route
reuses (vllm/v1/attention/backends/mla/sparse_utils.py: the prefill-workspace remap with
``prefill_workspace_rank_stride``, and the DCP filter of the stock route), run under
TRITON_INTERPRET=1. The stock route is simulated independently (query all-gather, each rank
attends its shard with the stock filtered indices, LSE merge); both routes use the same
reference attention over dequantised fp8_ds_mla records, or the shipped Triton kernel.
Top-k ids follow the indexer's contract: within the row's causal length, or -1.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from conftest import load_leaf  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from shipped_triton import load_shipped_triton  # noqa: E402

ckv = load_shipped_triton("vllm/v1/attention/ops/dcp_packed_ckv.py")
wire = load_leaf("vllm/v1/attention/ops/dcp_wire_model.py")

RB = ckv.FP8_DS_MLA_RECORD_BYTES
BLOCK_SIZE = 16
BLOCK_STRIDE_ROWS = 2 * BLOCK_SIZE  # other layers' pages sit between blocks
PROOF_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load_jit_helpers():
    """vLLM's real kernel-launch machinery from the tree (jit_warmup and
    jit_warmup_triton_helper), with stand-ins for the platform and env lookups."""
    jit_warmup = load_leaf("vllm/model_executor/warmup/jit_warmup.py")
    helper = load_shipped_triton(
        "vllm/model_executor/warmup/jit_warmup_triton_helper.py",
        {
            "vllm.triton_utils": {"triton": triton, "tl": tl, "HAS_TRITON": True},
            "vllm.envs": {"VLLM_TRITON_JIT_WARMUP_NUM_THREADS": 1},
            "vllm.platforms": {
                "current_platform": SimpleNamespace(device_type="cpu", is_cuda=lambda: False)
            },
            "vllm.model_executor.warmup.jit_warmup": vars(jit_warmup),
        },
    )
    return jit_warmup, helper


def load_sparse_utils():
    """vLLM's sparse-MLA index kernels (shipped file) with the real launch helpers and
    stand-ins only for names used at start-up or in annotations."""
    jit_warmup, helper = load_jit_helpers()
    return load_shipped_triton(
        "vllm/v1/attention/backends/mla/sparse_utils.py",
        {
            "vllm.config": {"VllmConfig": object},
            "vllm.distributed": {"get_dcp_group": None},
            "vllm.model_executor.warmup.jit_warmup": vars(jit_warmup),
            "vllm.model_executor.warmup.jit_warmup_triton_helper": vars(helper),
            "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b)},
            # vLLM 0.34: get_block_table_width moved to kv_cache_interface.
            "vllm.v1.kv_cache_interface": {
                "AttentionSpec": object,
                "get_block_table_width": None,
            },
        },
    )


su = load_sparse_utils()


# --- fp8_ds_mla records (512 e4m3 + 4 fp32 scales + 64 bf16 RoPE) ----------


def encode_records(latent: torch.Tensor) -> torch.Tensor:
    """[n, 576] float -> [n, 656] uint8 fp8_ds_mla records."""
    n = latent.shape[0]
    nope = latent[:, :512].float().view(n, 4, 128)
    scale = (nope.abs().amax(dim=-1) / 448.0).clamp_min(1e-8)
    q = (nope / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    rope = latent[:, 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat(
        [
            q.reshape(n, 512),
            scale.contiguous().view(torch.uint8).reshape(n, 16),
            rope.reshape(n, 128),
        ],
        dim=1,
    )


def decode_records(rec: torch.Tensor) -> torch.Tensor:
    """[n, 656] uint8 -> [n, 576] fp32."""
    n = rec.shape[0]
    q = rec[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(n, 4, 128)
    scale = rec[:, 512:528].contiguous().view(torch.float32).view(n, 4, 1)
    rope = rec[:, 528:656].contiguous().view(torch.bfloat16).float()
    return torch.cat([(q * scale).view(n, 512), rope], dim=1)


def ref_attention(q, kv_deq, idx, scale):
    """One reference sparse attention: q [T,H,576], kv_deq [slots,576],
    idx [T,K] slots (-1 empty) -> out [T,H,512], lse [T,H] (natural log)."""
    valid = idx >= 0
    k = kv_deq[idx.clamp_min(0).long()]  # [T, K, 576]
    k = torch.where(valid[..., None], k, torch.zeros_like(k))
    logits = torch.einsum("thd,tkd->thk", q.double(), k.double()) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("thk,tkd->thd", p, k[..., :512].double())
    out[~valid.any(dim=1)] = 0.0
    return out, lse


# --- geometry ---------------------------------------------------------------


@dataclass
class Geometry:
    n: int
    interleave: int
    seq_lens: list[int]
    query_lens: list[int]
    heads_local: int
    topk: int
    seed: int


@st.composite
def geometries(draw):
    n = draw(st.sampled_from([2, 3, 4]))
    interleave = draw(st.sampled_from([1, 2, 4, 16]))
    nreq = draw(st.integers(1, 3))
    seq_lens = [draw(st.integers(1, 260)) for _ in range(nreq)]
    query_lens = [draw(st.integers(1, min(s, 12))) for s in seq_lens]
    return Geometry(
        n=n,
        interleave=interleave,
        seq_lens=seq_lens,
        query_lens=query_lens,
        heads_local=draw(st.sampled_from([1, 2])),
        topk=draw(st.sampled_from([8, 16, 32])),
        seed=draw(st.integers(0, 2**16)),
    )


class Sim:
    """Simulated DCP group: per-rank paged caches (flat rows + block tables), the
    step's prefill rows and their global top-k ids."""

    def __init__(self, geo: Geometry):
        g = torch.Generator().manual_seed(geo.seed)
        self.geo = geo
        n, i = geo.n, geo.interleave
        self.records = [encode_records(torch.randn(s, 576, generator=g)) for s in geo.seq_lens]
        self.nreq = len(geo.seq_lens)
        max_local = max(ckv.dcp_local_len(s, n, i, 0) for s in geo.seq_lens)
        self.max_blocks = -(-max_local // BLOCK_SIZE) + 1
        nb = self.nreq * self.max_blocks + 3
        self.kv, self.bt = [], []
        for p in range(n):
            rows = torch.randint(
                0, 256, (nb * BLOCK_STRIDE_ROWS, RB), dtype=torch.uint8, generator=g
            )
            bt = torch.randperm(nb, generator=g)[: self.nreq * self.max_blocks]
            bt = bt.view(self.nreq, self.max_blocks).to(torch.int32).contiguous()
            for r, s in enumerate(geo.seq_lens):
                for t in range(s):
                    owner, loc = self.owner_local(t)
                    if owner == p:
                        blk = int(bt[r, loc // BLOCK_SIZE])
                        rows[blk * BLOCK_STRIDE_ROWS + loc % BLOCK_SIZE] = self.records[r][t]
            self.kv.append(rows)
            self.bt.append(bt)
        self.seq_lens = torch.tensor(geo.seq_lens, dtype=torch.int32)
        qlens = torch.tensor(geo.query_lens, dtype=torch.int32)
        self.req_id = torch.repeat_interleave(torch.arange(self.nreq, dtype=torch.int32), qlens)
        causal = []
        for s, q in zip(geo.seq_lens, geo.query_lens, strict=True):
            causal += list(range(s - q + 1, s + 1))
        self.causal = causal
        rows_ids = []
        for c in causal:
            cand = torch.randperm(c, generator=g)[: geo.topk].to(torch.int32)
            ids = torch.full((geo.topk,), -1, dtype=torch.int32)
            ids[: cand.numel()] = cand
            ids[torch.rand(geo.topk, generator=g) < 0.2] = -1
            rows_ids.append(ids)
        self.topk = torch.stack(rows_ids)
        self.layout = ckv.packed_ckv_layout(geo.seq_lens, n, i)
        self.starts = torch.tensor(self.layout.starts, dtype=torch.int32)

    def owner_local(self, t: int) -> tuple[int, int]:
        n, i = self.geo.n, self.geo.interleave
        return (t // i) % n, (t // (n * i)) * i + t % i

    def gather(self, pack=None, poison: int | None = None) -> torch.Tensor:
        """Every rank packs its section; the all-gather is their concatenation."""
        pack = pack or ckv.pack_local_records
        sections = []
        for p in range(self.geo.n):
            shape = (self.layout.rank_rows, RB)
            if poison is None:
                sec = torch.randint(0, 256, shape, dtype=torch.uint8)
            else:
                sec = torch.full(shape, poison, dtype=torch.uint8)
            pack(
                self.kv[p],
                BLOCK_STRIDE_ROWS,
                BLOCK_SIZE,
                self.bt[p],
                self.seq_lens,
                self.starts,
                sec,
                self.layout,
                dcp_size=self.geo.n,
                dcp_rank=p,
                interleave=self.geo.interleave,
            )
            sections.append(sec)
        return torch.cat(sections)

    def remap(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's prefill-workspace remap (shipped kernel) as the route calls it."""
        return su.triton_convert_req_index_to_global_index(
            self.req_id,
            self.bt[rank],
            self.topk,
            BLOCK_SIZE=BLOCK_SIZE,
            NUM_TOPK_TOKENS=self.geo.topk,
            BLOCK_N=min(128, self.geo.topk),
            HAS_PREFILL_WORKSPACE=True,
            prefill_workspace_request_ids=self.req_id,
            prefill_workspace_starts=self.starts,
            prefill_workspace_rank_stride=self.layout.rank_rows,
            dcp_size=self.geo.n,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=self.geo.interleave,
            return_valid_counts=True,
        )

    def stock_local_indices(self, rank: int) -> torch.Tensor:
        """The stock route's indices on ``rank`` (shipped DCP filter kernel)."""
        out, _ = su.triton_filter_and_convert_dcp_index(
            self.req_id,
            self.bt[rank],
            self.topk,
            dcp_size=self.geo.n,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=self.geo.interleave,
            BLOCK_SIZE=BLOCK_SIZE,
            BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
            NUM_TOPK_TOKENS=self.geo.topk,
            BLOCK_N=min(128, self.geo.topk),
            return_valid_counts=True,
        )
        return out


def stock_route(sim: Sim, q_local, attend):
    """Query all-gather, each rank attends its shard, LSE merge -> [T, N*H_l, 512]."""
    q_all = torch.cat(q_local, dim=1)
    outs, lses = [], []
    for p in range(sim.geo.n):
        o, lse = attend(q_all, sim.kv[p], sim.stock_local_indices(p))
        outs.append(o.double())
        lses.append(lse.double())
    lse_stack = torch.stack(lses)
    lse_glob = torch.logsumexp(lse_stack, dim=0)
    w = torch.exp(lse_stack - lse_glob).nan_to_num(0.0)
    return (w[..., None] * torch.stack(outs)).sum(0), lse_glob


# --- proofs -------------------------------------------------------------------


@PROOF_SETTINGS
@given(geometries())
def test_inverted_route_equals_stock_route(geo):
    """For any DCP geometry the packed-CKV route's per-rank output (pack, gather, vLLM's
    prefill-workspace remap, local heads over the global top-k) equals the stock route's
    (query all-gather, per-shard attention, LSE merge) within fp64 rounding."""
    sim = Sim(geo)
    n, hl = geo.n, geo.heads_local
    g = torch.Generator().manual_seed(geo.seed + 1)
    q_local = [torch.randn(sim.topk.shape[0], hl, 576, generator=g) for _ in range(n)]
    scale = 576**-0.5

    def attend(q, rows, idx):
        return ref_attention(q, decode_records(rows), idx, scale)

    stock, lse_glob = stock_route(sim, q_local, attend)
    gathered = sim.gather()
    kv_deq = decode_records(gathered)
    for p in range(n):
        idx, _ = sim.remap(p)
        o, lse = ref_attention(q_local[p], kv_deq, idx, scale)
        heads = slice(p * hl, (p + 1) * hl)
        torch.testing.assert_close(o, stock[:, heads], rtol=1e-9, atol=1e-9)
        finite = torch.isfinite(lse_glob[:, heads])
        assert torch.equal(finite, torch.isfinite(lse))
        torch.testing.assert_close(lse[finite], lse_glob[:, heads][finite], rtol=1e-9, atol=1e-9)


@PROOF_SETTINGS
@given(geometries())
def test_remap_reads_owner_record(geo):
    """On every rank, each remapped row reads exactly the record the owner holds for that
    global token, in top-k order, -1 entries dropped; the shipped remap kernel equals the
    leaf's torch statement of it."""
    sim = Sim(geo)
    gathered = sim.gather()
    for rank in range(geo.n):
        idx, counts = sim.remap(rank)
        ref_idx, ref_counts = ckv.remap_prefill_topk_ref(
            sim.topk,
            sim.req_id,
            sim.starts,
            sim.layout.rank_rows,
            dcp_size=geo.n,
            interleave=geo.interleave,
            block_size=BLOCK_SIZE,
            max_blocks=sim.max_blocks,
        )
        assert torch.equal(idx, ref_idx) and torch.equal(counts, ref_counts)
        for row in range(idx.shape[0]):
            r = int(sim.req_id[row])
            kept = [gid for gid in sim.topk[row].tolist() if gid >= 0]
            assert int(counts[row]) == len(kept)
            assert (idx[row, len(kept) :] == -1).all()
            for c, gid in enumerate(kept):
                assert torch.equal(gathered[int(idx[row, c])], sim.records[r][gid])


@PROOF_SETTINGS
@given(geometries(), st.integers(0, 255))
def test_gather_layout_is_byte_exact(geo, poison):
    """Each record lands exactly once at owner * rank_rows + starts[p] + local, the Triton
    pack equals the torch reference, rows past a rank's shard keep their bytes, and the
    remap addresses only written rows."""
    sim = Sim(geo)
    n, rank_rows = geo.n, sim.layout.rank_rows
    gathered = sim.gather(poison=poison)
    assert torch.equal(gathered, sim.gather(pack=ckv.pack_local_records_ref, poison=poison))
    image: set[int] = set()
    for r, s in enumerate(geo.seq_lens):
        for t in range(s):
            owner, loc = sim.owner_local(t)
            row = owner * rank_rows + sim.layout.starts[r] + loc
            assert row not in image
            image.add(row)
            assert torch.equal(gathered[row], sim.records[r][t])
    for row in range(n * rank_rows):
        if row not in image:
            assert (gathered[row] == poison).all()
    for rank in range(n):
        idx, _ = sim.remap(rank)
        assert set(idx[idx >= 0].tolist()) <= image


def bf16_route_bytes(rows, rank_rows, n, heads_local, comm):
    """Bytes one rank receives per layer on each route, stated from the collectives'
    buffers: the peers' [T, H_l, 576] bf16 queries plus the combine (a2a: [T, H_l, 514]
    bf16 partials with the fp32 LSE in two slots; ag_rs: fp32 [T, N * H_l] LSEs and
    [T, H_l, 512] bf16 partials), against the peers' 656-byte record sections."""
    peers = n - 1
    gather = peers * rows * heads_local * 576 * 2
    if comm == "a2a":
        combine = peers * rows * heads_local * (512 + 2) * 2
    else:
        combine = peers * rows * (n * heads_local * 4 + heads_local * 512 * 2)
    return gather + combine, peers * rank_rows * RB


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["query", "packed_ckv"]),
    n=st.sampled_from([2, 4, 8]),
    interleave=st.sampled_from([1, 4, 64]),
    seq_lens=st.lists(st.integers(1, 400_000), min_size=1, max_size=8),
    decode_rows=st.integers(0, 16),
    can_split=st.booleans(),
    heads_local=st.sampled_from([1, 8, 16, 32, 64]),
    comm=st.sampled_from(["a2a", "ag_rs"]),
    data=st.data(),
)
def test_route_decision_is_rank_invariant(
    mode, n, interleave, seq_lens, decode_rows, can_split, heads_local, comm, data
):
    """Every simulated rank, seeing its own shard plus the replicated metadata, takes the
    same route with the same layout; packed_ckv is taken only for steps with prefill rows
    whose section fits and whose records are fewer bytes per rank than the query route's
    queries and partials, and a mixed step only when the backend can split off the decode
    rows."""
    capacity = ckv.packed_ckv_capacity_rows(131072, 8, n, interleave)
    rows = data.draw(st.integers(0, 8192))
    decisions = set()
    for rank in range(n):
        local = [ckv.dcp_local_len(s, n, interleave, rank) for s in seq_lens]
        assert sum(local) <= sum(seq_lens)  # a rank's own view, not an input
        layout = ckv.packed_ckv_layout(seq_lens, n, interleave)
        route = wire.select_prefill_route(
            mode,
            rank_rows=layout.rank_rows,
            capacity_rows=capacity,
            num_prefill_rows=rows,
            num_decode_rows=decode_rows,
            can_split_decode_rows=can_split,
            num_local_heads=heads_local,
            dcp_size=n,
            comm_backend=comm,
        )
        decisions.add((route, layout))
    assert len(decisions) == 1
    route, layout = decisions.pop()
    assert layout.rank_rows == sum(ckv.dcp_local_len(s, n, interleave, 0) for s in seq_lens)
    query_bytes, packed_bytes = bf16_route_bytes(rows, layout.rank_rows, n, heads_local, comm)
    eligible = (
        mode != "query"
        and rows > 0
        and (decode_rows == 0 or can_split)
        and layout.rank_rows <= capacity
        and packed_bytes < query_bytes
    )
    assert (route == "packed_ckv") == eligible


def test_route_decision_follows_the_bytes_at_the_gate_shapes():
    """The GLM-5-shaped gates (64 heads, TP = DCP = 2 or 4, a2a, prefix caching off,
    8192-token steps) prefill 1024- and 8192-token prompts and the 700/2600/9100/17000
    batch: every step with prefill rows moves fewer bytes on the packed route, while a
    prefix-cache hit of 64 new rows over 17000 tokens of context stays on the query
    route."""
    budget = 8192
    for n in (2, 4):
        capacity = ckv.packed_ckv_capacity_rows(32768, 8, n, 1)

        def route(seq_lens, rows, n=n, capacity=capacity):
            return wire.select_prefill_route(
                "packed_ckv",
                rank_rows=ckv.packed_ckv_layout(seq_lens, n, 1).rank_rows,
                capacity_rows=capacity,
                num_prefill_rows=rows,
                num_decode_rows=0,
                can_split_decode_rows=True,
                num_local_heads=64 // n,
                dcp_size=n,
                comm_backend="a2a",
            )

        for prompts in ([1024], [8192], [700, 2600, 9100, 17000]):
            for seq_lens, rows in chunked_prefill_steps(prompts, budget):
                assert route(seq_lens, rows) == "packed_ckv", (n, prompts, seq_lens, rows)
        assert route([17000], 64) == "query"


def chunked_prefill_steps(prompts, budget):
    """(seq lens of the prefill requests, prefill rows) of every step that has prefill
    rows when the prompts arrive together and each step schedules at most ``budget``
    tokens: requests already running first (a finished prompt decodes one token), then
    the rest in order, each taking what the budget leaves (vLLM's chunked prefill)."""
    done = [0] * len(prompts)
    steps = []
    while any(d < p for d, p in zip(done, prompts, strict=True)):
        left = budget - sum(d >= p for d, p in zip(done, prompts, strict=True))
        seq_lens, rows = [], 0
        for i, p in enumerate(prompts):
            if done[i] >= p or left == 0:
                continue
            take = min(p - done[i], left)
            done[i] += take
            left -= take
            seq_lens.append(done[i])
            rows += take
        steps.append((seq_lens, rows))
    return steps


@settings(max_examples=300, deadline=None)
@given(
    n=st.sampled_from([2, 4, 8]),
    interleave=st.sampled_from([1, 2, 16, 64]),
    max_model_len=st.integers(1, 300_000),
    max_num_seqs=st.integers(1, 64),
    data=st.data(),
)
def test_workspace_holds_every_step_up_to_max_model_len(
    n, interleave, max_model_len, max_num_seqs, data
):
    """Every step of at most max_num_seqs prefill requests holding at most max_model_len
    tokens in total fits the workspace sized at start-up."""
    capacity = ckv.packed_ckv_capacity_rows(max_model_len, max_num_seqs, n, interleave)
    nreq = data.draw(st.integers(1, max_num_seqs))
    total = data.draw(st.integers(nreq, max(nreq, max_model_len)))
    cuts = sorted(
        data.draw(st.lists(st.integers(1, max(1, total - 1)), min_size=0, max_size=nreq - 1))
    )
    bounds = [0, *cuts, total]
    lens = [b - a for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    assert sum(lens) <= max(max_model_len, nreq)
    if sum(lens) <= max_model_len:
        assert ckv.packed_ckv_layout(lens, n, interleave).rank_rows <= capacity


def test_workspace_sizing_rejects_int32_overflow():
    """A workspace whose gathered rows would overflow int32 slots fails at start-up."""
    with pytest.raises(ValueError, match="int32.*max_model_len=8589934592"):
        ckv.packed_ckv_capacity_rows(2**33, 16, 4, 1)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(geometries())
def test_inverted_route_equals_stock_route_with_shipped_kernel(geo):
    """With the shipped Triton sparse-MLA kernel (patch 0002) on both sides, the
    packed-CKV route's per-rank output equals the stock route's (bf16 query all-gather,
    kernel over each localised shard, fp32 LSE merge) within bf16 rounding."""
    kernel = load_shipped_triton("vllm/v1/attention/ops/triton_sparse_mla.py")
    sim = Sim(geo)
    n, hl = geo.n, geo.heads_local
    g = torch.Generator().manual_seed(geo.seed + 2)
    t = sim.topk.shape[0]
    q_local = [torch.randn(t, hl, 576, generator=g).to(torch.bfloat16) for _ in range(n)]
    scale = 576**-0.5

    def attend(q, rows, idx):
        return kernel.sparse_mla_fp8_ds_mla_attention(q, rows, idx, scale)

    stock, lse_glob = stock_route(sim, q_local, attend)
    gathered = sim.gather()
    for p in range(n):
        idx, counts = sim.remap(p)
        o, lse = kernel.sparse_mla_fp8_ds_mla_attention(
            q_local[p], gathered, idx, scale, valid_counts=counts
        )
        heads = slice(p * hl, (p + 1) * hl)
        torch.testing.assert_close(o.double(), stock[:, heads], rtol=2e-2, atol=2e-2)
        finite = torch.isfinite(lse_glob[:, heads])
        assert torch.equal(finite, torch.isfinite(lse))
        torch.testing.assert_close(
            lse[finite].double(), lse_glob[:, heads][finite], rtol=1e-4, atol=1e-4
        )
