# SPDX-License-Identifier: Apache-2.0
"""evidence/bench_bf16_sparse_mla_dcp.py on a CPU: the grid, the local top-k counts, the fp32
reference, the output comparison and, with a patched vLLM tree importable (PYTHONPATH), both
backends' calls with reference stand-ins for the two CUDA kernels."""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path

import pytest

try:
    import torch
except ImportError:  # the pure parts run without it
    torch = None
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_bf16_sparse_mla_dcp as bench  # noqa: E402

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def test_gathered_heads_cover_the_dcp_geometries() -> None:
    assert bench.gathered_heads(64, 8, 2) == 16
    assert bench.gathered_heads(128, 4, 4) == 128
    assert sorted(bench.heads_by_geometry()) == [16, 32, 64, 128]
    with pytest.raises(ValueError):
        bench.gathered_heads(64, 2, 4)  # DCP larger than TP


def test_local_counts_are_a_dcp_share_with_one_empty_row() -> None:
    counts = bench.local_topk_counts(9, 2048, 4, seed=3)
    assert counts == bench.local_topk_counts(9, 2048, 4, seed=3)
    assert counts[4] == 0
    others = [c for i, c in enumerate(counts) if i != 4]
    assert all(512 - 64 <= c <= 512 + 64 for c in others)
    assert len(set(others)) > 1
    assert 0 not in bench.local_topk_counts(3, 512, 2, seed=1)
    with pytest.raises(ValueError):
        bench.local_topk_counts(0, 512, 2, seed=1)


def test_cases_put_decode_first_and_quick_is_a_subset() -> None:
    full, quick = bench.cases(False), bench.cases(True)
    kinds = [c["kind"] for c in full]
    assert kinds.index("extend") == kinds.count("decode")
    assert {c["rows"] for c in full if c["kind"] == "decode"} == set(bench.DECODE_ROWS)
    assert full[0]["rows"] == 1
    keys = {bench.case_key(c) for c in full}
    assert len(keys) == len(full)
    assert {bench.case_key(c) for c in quick} <= keys


def test_summary_ignores_cases_that_disagree() -> None:
    done = [
        {"kind": "decode", "heads": 16, "agree": True, "ratios": {"flashmla_over_fa3_graph": 2.0}},
        {"kind": "decode", "heads": 16, "agree": True, "ratios": {"flashmla_over_fa3_graph": 1.0}},
        {"kind": "decode", "heads": 16, "agree": False, "ratios": {"flashmla_over_fa3_graph": 9.0}},
    ]
    s = bench.summarize(done)
    assert s["cases"] == 3 and s["cases_agree"] == 2
    assert s["flashmla_over_fa3_graph"]["decode h16"] == {
        "min": 1.0,
        "median": 2.0,
        "max": 2.0,
        "n": 2,
    }


def _inputs(rows=5, heads=4, topk=32, dcp=2):
    case = {"kind": "decode", "heads": heads, "topk": topk, "dcp": dcp, "rows": rows}
    return bench.make_inputs(case, seed=11, dev="cpu", pool_rows=256)


def _naive(q, kv, idx, counts):
    out = torch.zeros(q.shape[0], q.shape[1], bench.KV_LORA_RANK)
    lse = torch.full((q.shape[0], q.shape[1]), float("-inf"))
    for t in range(q.shape[0]):
        n = int(counts[t])
        if n == 0:
            continue
        rows = kv[idx[t, :n].long()].float()
        s = q[t].float() @ rows.T * bench.SOFTMAX_SCALE
        lse[t] = torch.logsumexp(s, dim=-1)
        out[t] = torch.softmax(s, dim=-1) @ rows[:, : bench.KV_LORA_RANK]
    return out, lse


@needs_torch
def test_inputs_are_localised_and_the_reference_is_attention_over_them() -> None:
    q, kv, idx, counts = _inputs()
    assert counts[2] == 0
    for t in range(idx.shape[0]):
        n = int(counts[t])
        assert (idx[t, :n] >= 0).all() and (idx[t, n:] == -1).all()
        assert len(set(idx[t, :n].tolist())) == n
    ref_out, ref_lse = bench.reference(q, kv, idx, counts, chunk_rows=2)
    out, lse = _naive(q, kv, idx, counts)
    torch.testing.assert_close(ref_out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref_lse, lse, atol=1e-5, rtol=1e-5)


@needs_torch
def test_compare_tells_a_base_2_lse_and_a_bad_empty_row() -> None:
    q, kv, idx, counts = _inputs()
    ref_out, ref_lse = bench.reference(q, kv, idx, counts)
    good = (ref_out.bfloat16(), ref_lse.clone())
    base2 = ref_out.bfloat16(), ref_lse / math.log(2.0)
    bad_empty = ref_out.bfloat16(), ref_lse.clone()
    bad_empty[1][2] = float("inf")
    r = bench.compare({"fa3": good, "flashmla": base2}, ref_out, ref_lse, counts)
    assert r["fa3"]["max_abs_lse_vs_ref"] == 0.0
    assert r["flashmla"]["max_abs_lse_vs_ref"] > 0.1
    assert r["flashmla"]["max_abs_lse_vs_ref_log2"] < 1e-5
    assert r["fa3"]["empty_rows_identity"]
    assert r["fa3_vs_flashmla"]["max_abs_lse"] > 0.1
    r = bench.compare({"fa3": good, "flashmla": bad_empty}, ref_out, ref_lse, counts)
    assert not r["flashmla"]["empty_rows_identity"]


# ------------------------------------------------------------------ the backends' calls


def _fa3_paged_varlen(*, q, k, v, q_v, block_table, seqused_k, softmax_scale, **kw):
    """FA3's paged varlen MLA (page size 1, one query row per sequence); rows without keys
    get NaN and +inf, the worst a kernel could write."""
    kr, vr = k[:, 0, 0].float(), v[:, 0, 0].float()
    out = torch.full((q.shape[0], q.shape[1], v.shape[-1]), float("nan"))
    lse = torch.full((q.shape[1], q.shape[0]), float("inf"))
    for t in range(q.shape[0]):
        n = int(seqused_k[t])
        if n:
            i = block_table[t, :n].long()
            s = (q[t].float() @ kr[i].T + q_v[t].float() @ vr[i].T) * softmax_scale
            out[t] = torch.softmax(s, -1) @ vr[i]
            lse[:, t] = torch.logsumexp(s, -1)
    out = out.to(q.dtype)
    return (out, lse) if kw.get("return_softmax_lse") else out


def _flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, topk_length=None, out=None, **_):
    """FlashMLA's sparse kernel: heads as given (8/16/32, or padded by the caller); rows with
    topk_length 0 get (0, +inf)."""
    assert q.shape[1] in (8, 16, 32, 64, 128) and out is None
    rows = kv[:, 0].float()
    o = torch.zeros(q.shape[0], q.shape[1], d_v)
    lse = torch.full((q.shape[0], q.shape[1]), float("inf"))
    for t in range(q.shape[0]):
        n = int(topk_length[t])
        if n:
            i = indices[t, 0, :n].long()
            s = q[t].float() @ rows[i].T * sm_scale
            o[t] = torch.softmax(s, -1) @ rows[i, :d_v]
            lse[t] = torch.logsumexp(s, -1)
    return o.to(q.dtype), lse.clone(), lse


@pytest.fixture(scope="module")
def backends():
    if torch is None:
        pytest.skip("needs torch")
    pytest.importorskip("vllm")
    try:
        import vllm.vllm_flash_attn.flash_attn_interface  # noqa: F401
    except ImportError:
        package = types.ModuleType("vllm.vllm_flash_attn")
        package.__path__ = []
        interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
        interface.flash_attn_varlen_func = _fa3_paged_varlen
        package.flash_attn_interface = interface
        sys.modules.setdefault(package.__name__, package)
        sys.modules.setdefault(interface.__name__, interface)
    fa = importlib.import_module("vllm.v1.attention.backends.mla.flashattn_mla_sparse")
    fm = importlib.import_module("vllm.v1.attention.backends.mla.flashmla_sparse")
    if not getattr(fa.FlashAttnMLASparseImpl, "can_return_lse_for_decode", False):
        pytest.skip(f"{fa.__file__} is not patched (0005)")
    return fa, fm


@pytest.mark.parametrize("heads", [16, 64])
def test_both_backend_calls_return_the_dcp_partial(backends, monkeypatch, heads) -> None:
    fa, fm = backends
    monkeypatch.setattr(fa, "flash_attn_varlen_func", _fa3_paged_varlen)
    monkeypatch.setattr(fm, "flash_mla_sparse_fwd", _flash_mla_sparse_fwd)
    monkeypatch.setattr(fm.current_platform, "is_device_capability_family", lambda *a, **k: True)
    q, kv, idx, counts = _inputs(rows=5, heads=heads, topk=32, dcp=2)
    results = {
        "fa3": bench.fa3_runner(fa, q, kv, idx, counts)(),
        "flashmla": bench.flashmla_runner(fm, q, kv, idx, counts)(),
    }
    ref_out, ref_lse = bench.reference(q, kv, idx, counts)
    report = bench.compare(results, ref_out, ref_lse, counts)
    for name in bench.BACKENDS:
        r = report[name]
        assert r["out_shape"] == [5, heads, bench.KV_LORA_RANK]
        assert r["lse_shape"] == [5, heads]
        assert r["out_contiguous"] and r["finite"] and r["empty_rows_identity"]
        assert r["max_abs_out_vs_ref"] < 1e-2 and r["max_abs_lse_vs_ref"] < 1e-4
    cov = bench.sm_coverage(fa, fm)
    assert cov["FLASH_ATTN_MLA_SPARSE"]["supports_compute_capability"]["9.0"]
    assert not cov["FLASH_ATTN_MLA_SPARSE"]["supports_compute_capability"]["10.0"]
    assert cov["FLASHMLA_SPARSE"]["supports_compute_capability"]["10.0"]
