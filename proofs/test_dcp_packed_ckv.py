# SPDX-License-Identifier: Apache-2.0
"""CPU proofs of the packed-CKV ownership inversion for DCP sparse-MLA prefill.

The shipped cores (vllm/v1/attention/ops/dcp_packed_ckv.py: pack, remap, route
selection, workspace sizing) run under TRITON_INTERPRET=1 against simulated DCP
ranks. The stock route is simulated independently (query all-gather, each rank
attends its shard with localised indices, LSE merge) and both routes use the
same reference attention over dequantised fp8_ds_mla records.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import load_leaf  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ckv = load_leaf("vllm/v1/attention/ops/dcp_packed_ckv.py")

RB = ckv.FP8_DS_MLA_RECORD_BYTES
BLOCK_SIZE = 16
PROOF_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


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
    k = torch.where(valid[..., None], k, torch.zeros_like(k))  # -1 lanes read nothing
    logits = torch.einsum("thd,tkd->thk", q.double(), k.double()) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("thk,tkd->thd", p, k[..., :512].double())
    empty = ~valid.any(dim=1)
    out[empty] = 0.0
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
    missing: set[tuple[int, int, int]]  # (owner rank, request, data page)


@st.composite
def geometries(draw, allow_missing=True):
    n = draw(st.sampled_from([2, 3, 4]))
    interleave = draw(st.sampled_from([1, 2, 4, 16]))
    nreq = draw(st.integers(1, 3))
    seq_lens = [draw(st.integers(1, 260)) for _ in range(nreq)]
    query_lens = [draw(st.integers(1, min(s, 12))) for s in seq_lens]
    missing: set[tuple[int, int, int]] = set()
    if allow_missing and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            r = draw(st.integers(0, nreq - 1))
            pages = -(-ckv.dcp_local_len(seq_lens[r], n, interleave, 0) // ckv.PAGE_RECORDS)
            missing.add((draw(st.integers(0, n - 1)), r, draw(st.integers(0, pages - 1))))
    return Geometry(
        n=n,
        interleave=interleave,
        seq_lens=seq_lens,
        query_lens=query_lens,
        heads_local=draw(st.sampled_from([1, 2])),
        topk=draw(st.sampled_from([8, 16, 40])),
        seed=draw(st.integers(0, 2**16)),
        missing=missing,
    )


class Sim:
    """Simulated DCP group: per-rank paged caches, metadata and top-k ids."""

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
            kv = torch.randint(0, 256, (nb, BLOCK_SIZE, RB), dtype=torch.uint8, generator=g)
            bt = torch.randperm(nb, generator=g)[: self.nreq * self.max_blocks]
            bt = bt.view(self.nreq, self.max_blocks).to(torch.int32).contiguous()
            for r, s in enumerate(geo.seq_lens):
                for t in range(s):
                    if (t // i) % n != p:
                        continue
                    loc = (t // (n * i)) * i + t % i
                    kv[bt[r, loc // BLOCK_SIZE], loc % BLOCK_SIZE] = self.records[r][t]
            self.kv.append(kv)
            self.bt.append(bt)
        self.seq_lens = torch.tensor(geo.seq_lens, dtype=torch.int32)
        qlens = torch.tensor(geo.query_lens, dtype=torch.int32)
        self.qsl = torch.cat(
            [torch.zeros(1, dtype=torch.int32), torch.cumsum(qlens, 0, dtype=torch.int32)]
        )
        self.req_id = torch.repeat_interleave(torch.arange(self.nreq, dtype=torch.int32), qlens)
        self.causal = ckv.row_causal_lens(self.seq_lens, self.qsl, self.req_id)
        rows = []
        for row in range(self.req_id.shape[0]):
            s = geo.seq_lens[int(self.req_id[row])]
            # candidates: in-range, out-of-causal (up to s + 8) and empty (-1)
            cand = torch.randperm(s + 8, generator=g)[: geo.topk].to(torch.int32)
            ids = torch.full((geo.topk,), -1, dtype=torch.int32)
            ids[: cand.numel()] = cand
            drop = torch.rand(geo.topk, generator=g) < 0.2
            ids[drop] = -1
            rows.append(ids)
        self.topk = torch.stack(rows)
        self.plan = ckv.plan_chunk(geo.seq_lens, n, i)
        self.req_base = ckv.request_page_base(self.seq_lens, n, i)

    def owner_local(self, t: int) -> tuple[int, int]:
        n, i = self.geo.n, self.geo.interleave
        return (t // i) % n, (t // (n * i)) * i + t % i

    def is_missing(self, r: int, t: int) -> bool:
        p, loc = self.owner_local(t)
        return (p, r, loc // ckv.PAGE_RECORDS) in self.geo.missing

    def gather(self, pack=None, poison: int | None = None) -> torch.Tensor:
        pack = pack or ckv.pack_local_records
        plan = self.plan
        sections = []
        for p in range(self.geo.n):
            sec = torch.full((plan.section_bytes,), poison or 0, dtype=torch.uint8)
            if poison is None:
                sec = torch.randint(0, 256, (plan.section_bytes,), dtype=torch.uint8)
            pack(
                self.kv[p],
                self.bt[p],
                self.seq_lens,
                self.req_base,
                sec,
                plan,
                dcp_size=self.geo.n,
                dcp_rank=p,
                interleave=self.geo.interleave,
            )
            fill = sec[plan.data_pages * plan.page_bytes :]
            for owner, r, page in self.geo.missing:
                if owner == p:
                    fill[int(self.req_base[r]) + page] = 0
            sections.append(sec)
        return torch.cat(sections)  # the all-gather

    def remap(self, gathered, fn=None):
        fn = fn or ckv.remap_topk_to_gathered
        t, k = self.topk.shape
        out = torch.empty((t, k), dtype=torch.int32)
        counts = torch.empty(t, dtype=torch.int32)
        missing = torch.zeros(1, dtype=torch.int32)
        fn(
            self.topk,
            self.req_id,
            self.causal,
            self.req_base,
            gathered,
            self.plan,
            dcp_size=self.geo.n,
            interleave=self.geo.interleave,
            out=out,
            counts=counts,
            missing=missing,
        )
        return out, counts, int(missing[0])

    def expected_kept(self, row: int) -> tuple[list[int], int]:
        r = int(self.req_id[row])
        causal = int(self.causal[row])
        kept, missing = [], 0
        for g in self.topk[row].tolist():
            if g < 0 or g >= causal:
                continue
            if self.is_missing(r, g):
                missing += 1
            else:
                kept.append(g)
        return kept, missing


# --- proofs -------------------------------------------------------------------


@PROOF_SETTINGS
@given(geometries())
def test_inverted_route_equals_stock_route(geo):
    """For any DCP geometry the packed-CKV route's per-rank output equals the
    stock route's (query all-gather, per-shard attention, LSE merge) within fp32
    tolerance."""
    sim = Sim(geo)
    n, hl = geo.n, geo.heads_local
    g = torch.Generator().manual_seed(geo.seed + 1)
    t = sim.topk.shape[0]
    q_local = [torch.randn(t, hl, 576, generator=g) for _ in range(n)]
    scale = 576**-0.5

    # stock: all-gather queries, each rank attends its shard, LSE merge
    q_all = torch.cat(q_local, dim=1)
    outs, lses = [], []
    for p in range(n):
        idx = torch.full_like(sim.topk, -1)
        for row in range(t):
            r = int(sim.req_id[row])
            for c, gid in enumerate(sim.topk[row].tolist()):
                if gid < 0 or gid >= int(sim.causal[row]) or sim.is_missing(r, gid):
                    continue
                owner, loc = sim.owner_local(gid)
                if owner == p:
                    idx[row, c] = (
                        int(sim.bt[p][r, loc // BLOCK_SIZE]) * BLOCK_SIZE + loc % BLOCK_SIZE
                    )
        kv_deq = decode_records(sim.kv[p].view(-1, RB))
        o, lse = ref_attention(q_all, kv_deq, idx, scale)
        outs.append(o)
        lses.append(lse)
    lse_stack = torch.stack(lses)
    lse_glob = torch.logsumexp(lse_stack, dim=0)
    w = torch.exp(lse_stack - lse_glob).nan_to_num(0.0)
    stock = (w[..., None] * torch.stack(outs)).sum(0)

    # inverted: pack, all-gather, remap, attend local heads, no merge
    gathered = sim.gather()
    idx, counts, missing = sim.remap(gathered)
    kv_deq = decode_records(gathered.view(-1, RB))
    expect_missing = sum(sim.expected_kept(row)[1] for row in range(t))
    assert missing == expect_missing
    for p in range(n):
        o, lse = ref_attention(q_local[p], kv_deq, idx, scale)
        heads = slice(p * hl, (p + 1) * hl)
        torch.testing.assert_close(o, stock[:, heads], rtol=1e-6, atol=1e-6)
        finite = torch.isfinite(lse_glob[:, heads])
        assert torch.equal(finite, torch.isfinite(lse))
        torch.testing.assert_close(lse[finite], lse_glob[:, heads][finite], rtol=1e-6, atol=1e-6)


@PROOF_SETTINGS
@given(geometries())
def test_remap_reads_owner_record(geo):
    """Every remapped slot reads exactly the record the owner holds for that
    global token, in top-k order, with out-of-causal ids dropped and
    missing-owner ids dropped and counted."""
    sim = Sim(geo)
    gathered = sim.gather()
    records = gathered.view(-1, RB)
    idx, counts, missing = sim.remap(gathered)
    total_missing = 0
    for row in range(idx.shape[0]):
        r = int(sim.req_id[row])
        kept, miss = sim.expected_kept(row)
        total_missing += miss
        assert int(counts[row]) == len(kept)
        assert (idx[row, len(kept) :] == -1).all()
        for c, gid in enumerate(kept):
            assert torch.equal(records[int(idx[row, c])], sim.records[r][gid])
    assert missing == total_missing


@PROOF_SETTINGS
@given(geometries(allow_missing=False), st.integers(0, 255))
def test_gather_layout_is_byte_exact(geo, poison):
    """Each record lands exactly once at its computed slot, fill bytes count the
    records a page holds, the Triton pack equals the torch reference, and the
    remap never addresses a padding slot."""
    sim = Sim(geo)
    n, i, p_rec = geo.n, geo.interleave, ckv.PAGE_RECORDS
    plan = sim.plan
    gathered = sim.gather(poison=poison)
    assert torch.equal(gathered, sim.gather(pack=ckv.pack_local_records_ref, poison=poison))
    records = gathered.view(-1, RB)
    image: set[int] = set()
    for r, s in enumerate(geo.seq_lens):
        base = int(sim.req_base[r])
        for t in range(s):
            owner, loc = sim.owner_local(t)
            slot = (owner * plan.section_pages + base + loc // p_rec) * p_rec + loc % p_rec
            assert slot not in image
            image.add(slot)
            assert torch.equal(records[slot], sim.records[r][t])
    # fill bytes: number of records each (owner, page) holds
    for owner in range(n):
        fill = gathered[owner * plan.section_bytes + plan.data_pages * plan.page_bytes :]
        for r, s in enumerate(geo.seq_lens):
            nloc = ckv.dcp_local_len(s, n, i, owner)
            pages = -(-ckv.dcp_local_len(s, n, i, 0) // p_rec)
            for j in range(pages):
                assert int(fill[int(sim.req_base[r]) + j]) == min(max(nloc - j * p_rec, 0), p_rec)
    # padding (every data slot outside the image) kept the poison byte
    for owner in range(n):
        for slot in range(
            owner * plan.section_pages * p_rec,
            (owner * plan.section_pages + plan.data_pages) * p_rec,
        ):
            if slot not in image:
                assert (records[slot] == poison).all()
    idx, _, missing = sim.remap(gathered)
    assert missing == 0
    used = set(idx[idx >= 0].tolist())
    assert used <= image


@PROOF_SETTINGS
@given(geometries())
def test_triton_remap_equals_reference(geo):
    """The Triton remap kernel and its torch reference agree on slots, counts
    and the missing-owner count."""
    sim = Sim(geo)
    gathered = sim.gather()
    a = sim.remap(gathered)
    b = sim.remap(gathered, fn=ckv.remap_topk_to_gathered_ref)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]


ROUTE_SPEC = ckv.size_ckv_workspace(
    max_model_len=131072,
    max_num_seqs=8,
    max_num_batched_tokens=8192,
    dcp_size=2,
    interleave=1,
    topk=2048,
    budget_bytes=2**31,
)


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["query", "ckv", "auto"]),
    n=st.sampled_from([2, 4, 8]),
    interleave=st.sampled_from([1, 4, 64]),
    seq_lens=st.lists(st.integers(1, 400_000), min_size=1, max_size=8),
    heads=st.sampled_from([8, 16, 32, 64]),
    eligible=st.booleans(),
    data=st.data(),
)
def test_route_decision_is_rank_invariant(mode, n, interleave, seq_lens, heads, eligible, data):
    """Every simulated rank, seeing only its own shard plus the replicated
    metadata, takes the same route with the same section plan, and the device
    page bases agree with the host plan; auto picks ckv only when it moves
    fewer bytes and the chunk fits the workspace."""
    spec = ckv.size_ckv_workspace(
        max_model_len=131072,
        max_num_seqs=8,
        max_num_batched_tokens=8192,
        dcp_size=n,
        interleave=interleave,
        topk=2048,
        budget_bytes=2**34,
    )
    rows = data.draw(st.integers(1, 8192))
    decisions = set()
    for rank in range(n):
        # a rank's own view: its local lengths (differ per rank) are not inputs
        local = [ckv.dcp_local_len(s, n, interleave, rank) for s in seq_lens]
        assert sum(local) <= sum(seq_lens)
        route, plan = ckv.select_prefill_route(
            mode,
            eligible=eligible,
            seq_lens=list(seq_lens),
            num_rows=rows,
            num_local_heads=heads,
            dcp_size=n,
            interleave=interleave,
            spec=spec,
        )
        decisions.add((route, plan))
        if plan is not None:
            base = ckv.request_page_base(torch.tensor(seq_lens), n, interleave)
            pages = ckv.request_pages(torch.tensor(seq_lens), n, interleave)
            assert int(base[-1] + pages[-1]) == plan.data_pages
    assert len(decisions) == 1
    route, plan = decisions.pop()
    if mode == "query" or not eligible:
        assert route == "query"
        return
    full = ckv.plan_chunk(seq_lens, n, interleave)
    fits = spec.fits(full, rows)
    if mode == "ckv":
        assert (route == "ckv") == fits
    else:
        cheaper = ckv.ckv_route_bytes(full, n) < ckv.query_route_bytes(rows, heads, n)
        assert (route == "ckv") == (fits and cheaper)


def test_auto_returns_to_query_route_at_long_context():
    """With a fixed chunk, auto takes the ckv route at 8k accumulated tokens and
    the query route again once the accumulated context passes the crossover."""
    spec = ckv.size_ckv_workspace(
        max_model_len=4_000_000,
        max_num_seqs=1,
        max_num_batched_tokens=2048,
        dcp_size=2,
        interleave=1,
        topk=2048,
        budget_bytes=2**40,
    )
    kw = dict(eligible=True, num_rows=2048, num_local_heads=32, dcp_size=2, interleave=1, spec=spec)
    cross = ckv.ckv_crossover_tokens(2048, 32, 2)
    assert ckv.select_prefill_route("auto", seq_lens=[8192], **kw)[0] == "ckv"
    assert ckv.select_prefill_route("auto", seq_lens=[cross - 4096], **kw)[0] == "ckv"
    assert ckv.select_prefill_route("auto", seq_lens=[cross + 4096], **kw)[0] == "query"
    assert ckv.select_prefill_route("ckv", seq_lens=[cross + 4096], **kw)[0] == "ckv"


@settings(max_examples=300, deadline=None)
@given(
    n=st.sampled_from([2, 4, 8]),
    interleave=st.sampled_from([1, 2, 16, 64]),
    max_model_len=st.integers(1, 300_000),
    max_num_seqs=st.integers(1, 64),
    data=st.data(),
)
def test_workspace_holds_every_chunk_up_to_max_model_len(
    n, interleave, max_model_len, max_num_seqs, data
):
    """Every chunk of at most max_num_seqs requests holding at most max_model_len
    tokens in total fits the workspace sized at start-up."""
    spec = ckv.size_ckv_workspace(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192,
        dcp_size=n,
        interleave=interleave,
        topk=2048,
        budget_bytes=2**40,
    )
    nreq = data.draw(st.integers(1, max_num_seqs))
    cuts = sorted(
        data.draw(st.lists(st.integers(0, max_model_len), min_size=nreq - 1, max_size=nreq - 1))
    )
    total = data.draw(st.integers(nreq, max(nreq, max_model_len)))
    bounds = [0] + [min(c, total) for c in cuts] + [total]
    lens = [max(1, b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    while sum(lens) > max(total, nreq):
        lens[lens.index(max(lens))] -= 1
    plan = ckv.plan_chunk(lens, n, interleave)
    assert spec.fits(plan, 8192)
    assert plan.fill_pages <= spec.max_fill_pages


def test_workspace_error_names_the_knobs():
    """A workspace over budget fails at start-up with the sizes and the knobs."""
    with pytest.raises(ValueError, match="max_model_len=1048576.*dcp_ckv_workspace_mib"):
        ckv.size_ckv_workspace(
            max_model_len=1 << 20,
            max_num_seqs=256,
            max_num_batched_tokens=16384,
            dcp_size=2,
            interleave=1,
            topk=2048,
            budget_bytes=256 << 20,
        )


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(geometries())
def test_inverted_route_equals_stock_route_with_shipped_kernel(geo):
    """With the shipped Triton sparse-MLA kernel (patch 0002) on both sides, the
    packed-CKV route's per-rank output equals the stock route's (bf16 query
    all-gather, kernel over each localised shard, fp32 LSE merge) within bf16
    rounding."""
    kernel = load_leaf("vllm/v1/attention/ops/triton_sparse_mla.py")
    sim = Sim(geo)
    n, hl = geo.n, geo.heads_local
    g = torch.Generator().manual_seed(geo.seed + 2)
    t = sim.topk.shape[0]
    q_local = [torch.randn(t, hl, 576, generator=g).to(torch.bfloat16) for _ in range(n)]
    scale = 576**-0.5
    q_all = torch.cat(q_local, dim=1)
    outs, lses = [], []
    for p in range(n):
        idx = torch.full_like(sim.topk, -1)
        for row in range(t):
            r = int(sim.req_id[row])
            for c, gid in enumerate(sim.topk[row].tolist()):
                if gid < 0 or gid >= int(sim.causal[row]) or sim.is_missing(r, gid):
                    continue
                owner, loc = sim.owner_local(gid)
                if owner == p:
                    idx[row, c] = (
                        int(sim.bt[p][r, loc // BLOCK_SIZE]) * BLOCK_SIZE + loc % BLOCK_SIZE
                    )
        o, lse = kernel.sparse_mla_fp8_ds_mla_attention(q_all, sim.kv[p], idx, scale)
        outs.append(o.float())
        lses.append(lse)
    lse_stack = torch.stack(lses)
    lse_glob = torch.logsumexp(lse_stack, dim=0)
    w = torch.exp(lse_stack - lse_glob).nan_to_num(0.0)
    stock = (w[..., None] * torch.stack(outs)).sum(0)

    gathered = sim.gather()
    idx, counts, _ = sim.remap(gathered)
    records = gathered.view(-1, ckv.PAGE_RECORDS, RB)
    for p in range(n):
        o, lse = kernel.sparse_mla_fp8_ds_mla_attention(
            q_local[p], records, idx, scale, valid_counts=counts
        )
        heads = slice(p * hl, (p + 1) * hl)
        torch.testing.assert_close(o.float(), stock[:, heads], rtol=2e-2, atol=2e-2)
        finite = torch.isfinite(lse_glob[:, heads])
        assert torch.equal(finite, torch.isfinite(lse))
        torch.testing.assert_close(lse[finite], lse_glob[:, heads][finite], rtol=1e-4, atol=1e-4)
