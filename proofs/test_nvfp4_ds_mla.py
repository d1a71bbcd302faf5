# SPDX-License-Identifier: Apache-2.0
"""CPU proofs for the nvfp4_ds_mla records: the writer and the sparse-MLA kernel.

Shipped code: ``vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py`` (torch codec and
Triton writer) and ``vllm/v1/attention/ops/triton_sparse_mla.py`` with
``record_format="nvfp4_ds_mla"``, run under Triton's interpreter (``TRITON_INTERPRET=1``).

References independent of the shipped module:
  * the SM100 CUDA writer's arithmetic re-expressed on the host with NVIDIA's conversion
    routines (``nvfp4_host_writer.cpp``, built with g++ against the CUDA headers; the
    headers emulate ``cvt.rn.satfinite.{e4m3x2,e2m1x2}.f32`` on the host);
  * records decoded bit by bit with numpy from the format definition, attention in float64.

Tolerances: as ``test_triton_sparse_mla.py``: the kernel rounds q, the keys (exact here:
e2m1 x e4m3 fits bf16) and the softmax weights to bf16 and writes a bf16 output;
|out - ref| <= OUT_ATOL + OUT_RTOL * max|V over the row|, |lse - ref| <= LSE_ATOL.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from shipped_triton import load_shipped_triton  # noqa: E402

CODEC = "vllm/v1/attention/ops/triton_nvfp4_ds_mla_cache.py"
KERNEL = "vllm/v1/attention/ops/triton_sparse_mla.py"
RECORD = 352
OUT_ATOL = 2e-3
OUT_RTOL = 1e-2
LSE_ATOL = 2e-3
HOST_WRITER = Path(__file__).with_name("nvfp4_host_writer.cpp")


def _cuda_include() -> Path:
    """CUDA headers with ``cuda_fp4.h`` and the ``nv/target`` it includes: ``$CUDA_HOME/include``,
    else those of the CUDA runtime wheel torch installs (``nvidia/cu*/include``), so the proof
    runs where no CUDA toolkit is installed."""
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    candidates = [home]
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else ():
        candidates += sorted(Path(root).glob("cu*/include"))
    for inc in candidates:
        if (inc / "cuda_fp4.h").is_file() and (inc / "nv" / "target").is_file():
            return inc
    return home


SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def codec():
    return load_shipped_triton(CODEC)


@pytest.fixture(scope="module")
def tsm():
    return load_shipped_triton(KERNEL)


@functools.cache
def _host_writer_binary(tmp: str) -> Path:
    exe = Path(tmp) / "nvfp4_host_writer"
    subprocess.run(
        [
            "g++",
            "-O1",
            "-ffp-contract=off",
            f"-I{_cuda_include()}",
            str(HOST_WRITER),
            "-o",
            str(exe),
        ],
        check=True,
    )
    return exe


@pytest.fixture(scope="module")
def host_writer(tmp_path_factory):
    if shutil.which("g++") is None or not (_cuda_include() / "cuda_fp4.h").is_file():
        pytest.fail(f"needs g++ and the CUDA headers (cuda_fp4.h under {_cuda_include()})")
    exe = _host_writer_binary(str(tmp_path_factory.mktemp("nvfp4")))

    def run(bits: np.ndarray) -> np.ndarray:
        out = subprocess.run(
            [str(exe)], input=bits.astype("<u2").tobytes(), capture_output=True, check=True
        ).stdout
        return np.frombuffer(out, dtype=np.uint8).reshape(-1, RECORD)

    return run


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

# bf16 bit patterns that exercise the conversions: signed zeros, the e2m1 decision points
# (ties) at scale 1, values that saturate, tiny values at the scale floor, inf and NaN.
_SPECIAL = [
    0x0000, 0x8000, 0x3E80, 0xBE80, 0x3F40, 0x3FA0, 0x3FE0, 0x4020, 0x4060, 0x40A0,
    0x40C0, 0xC0C0, 0x4100, 0x43E0, 0x43E8, 0x4400, 0x7F7F, 0x0001, 0x3A00, 0x3B00,
    0x7F80, 0xFF80, 0x7FC0, 0xFFC0,
]  # fmt: skip


@st.composite
def _tokens(draw, max_tokens: int = 6) -> np.ndarray:
    """[N, 576] bf16 bit patterns: per 16-value block a random binade and mixture of
    random values and special patterns."""
    n = draw(st.integers(1, max_tokens))
    seed = draw(st.integers(0, 2**31 - 1))
    special_rate = draw(st.sampled_from([0.0, 0.05, 0.3]))
    rng = np.random.default_rng(seed)
    vals = rng.standard_normal((n, 36, 16)).astype(np.float32)
    vals *= np.exp2(rng.integers(-16, 12, (n, 36, 1))).astype(np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16).reshape(n, 576)
    mask = rng.random((n, 576)) < special_rate
    bits[mask] = rng.choice(np.array(_SPECIAL, dtype=np.uint16), mask.sum())
    return bits


def _as_bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


# ---------------------------------------------------------------------------
# Independent decoding (numpy, from the format definition)
# ---------------------------------------------------------------------------

_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _e4m3(byte: np.ndarray) -> np.ndarray:
    byte = byte.astype(np.int64)
    e, m = (byte >> 3) & 15, byte & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7.0))
    mag = np.where((byte & 0x7F) == 0x7F, np.nan, mag)
    return np.where(byte & 0x80, -mag, mag)


def _decode(records: np.ndarray) -> np.ndarray:
    """[N, 352] records -> [N, 576] float64."""
    n = records.shape[0]
    codes = np.stack([records[:, :256] & 15, records[:, :256] >> 4], -1).reshape(n, 512)
    perm = [8 * (s & 3) + (s >> 2) for s in range(32)]
    sf = _e4m3(records[:, 320:352][:, perm])
    nope = _E2M1[codes].reshape(n, 32, 16) * sf[:, :, None]
    return np.concatenate([nope.reshape(n, 512), _e4m3(records[:, 256:320])], -1)


# ---------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------


@SETTINGS
@given(bits=_tokens())
def test_writers_match_the_cuda_writers_arithmetic(codec, host_writer, bits):
    """The Triton writer and the torch codec give the bytes of the CUDA writer's
    arithmetic (host re-expression with NVIDIA's conversions), specials included."""
    want = host_writer(bits)
    x = _as_bf16(bits)
    kv_c, k_pe = x[:, :512].contiguous(), x[:, 512:].contiguous()
    torch_rec = codec.quantize_nvfp4_ds_mla(kv_c, k_pe).numpy()
    np.testing.assert_array_equal(torch_rec, want)
    n = bits.shape[0]
    cache = torch.full((n + 1, 2, RECORD), 0xAB, dtype=torch.uint8)
    slots = torch.randperm(2 * (n + 1))[:n]
    codec.concat_and_cache_nvfp4_ds_mla(kv_c, k_pe, cache, slots)
    np.testing.assert_array_equal(cache.view(-1, RECORD)[slots].numpy(), want)


def test_host_writer_negative_control(codec, host_writer):
    """The comparison can fail: dividing by the scale instead of multiplying by its
    reciprocal (or rounding ties away from zero) changes bytes for some inputs."""
    rng = np.random.default_rng(3)
    vals = (rng.standard_normal((64, 576)) * 3).astype(np.float32)
    bits = (vals.view(np.uint32) >> 16).astype(np.uint16)
    want = host_writer(bits)
    x = _as_bf16(bits).float()
    blocks = x[:, :512].reshape(64, 32, 16)
    amax = blocks.abs().amax(-1)
    sf = torch.clamp(amax / torch.full_like(amax, 6.0), min=2.0**-9)
    sf = sf.to(torch.float8_e4m3fn).float()
    y = blocks / sf[..., None]  # division, not x * (1 / sf)
    a = y.abs()
    away = (
        (a >= 0.25).int() + (a >= 0.75).int() + (a >= 1.25).int() + (a >= 1.75).int()
        + (a >= 2.5).int() + (a >= 3.5).int() + (a >= 5).int()
    )  # fmt: skip
    codes = (away | (torch.signbit(y).int() << 3)).reshape(64, 512)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).numpy()
    assert (packed != want[:, :256]).any()


@SETTINGS
@given(bits=_tokens())
def test_codec_decodes_to_the_format_definition(codec, bits):
    x = _as_bf16(bits)
    rec = codec.quantize_nvfp4_ds_mla(x[:, :512].contiguous(), x[:, 512:].contiguous())
    got = codec.dequantize_nvfp4_ds_mla(rec).double().numpy()
    np.testing.assert_array_equal(got, _decode(rec.numpy()))


# ---------------------------------------------------------------------------
# Sparse-MLA kernel over nvfp4 records
# ---------------------------------------------------------------------------


def _bf16_round(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).float().to(torch.bfloat16).double().numpy()


def _reference(q, kv, indices, counts, sm_scale):
    """float64 attention with the kernel's bf16 rounding of q (keys are exact)."""
    t_rows, heads, _ = q.shape
    out = np.zeros((t_rows, heads, 512))
    lse = np.full((t_rows, heads), -np.inf)
    for t in range(t_rows):
        idx = indices[t, : counts[t]]
        idx = idx[(idx >= 0) & (idx < kv.shape[0])]
        if idx.size == 0:
            continue
        k = kv[idx]
        s = q[t] @ k.T * sm_scale
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        lse[t] = m[:, 0] + np.log(p.sum(-1))
        out[t] = (p / p.sum(-1, keepdims=True)) @ k[:, :512]
    return out, lse


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    t_rows=st.integers(1, 3),
    heads=st.sampled_from([8, 16, 20]),
    topk=st.sampled_from([16, 40]),
    num_splits=st.sampled_from([1, 2, 3]),
    variant=st.sampled_from(["base", "prefetch", "prefetch_slots", "flat"]),
)
def test_kernel_matches_float64_reference(
    codec, tsm, seed, t_rows, heads, topk, num_splits, variant
):
    """Output and natural-log LSE of the kernel reading nvfp4 records equal float64
    attention over the independently decoded records (skipped/-1/out-of-range slots,
    duplicates, valid_counts, split-KV and the load variants)."""
    rng = np.random.default_rng(seed)
    num_blocks, block_size = 3, 16
    n = num_blocks * block_size
    kv = rng.standard_normal((n, 576)) * (rng.random((n, 1)) * 2 + 0.1)
    x = torch.from_numpy(kv).float().to(torch.bfloat16)
    rec = codec.quantize_nvfp4_ds_mla(x[:, :512].contiguous(), x[:, 512:].contiguous())
    q = torch.from_numpy(rng.standard_normal((t_rows, heads, 576))).float()
    q = q.to(torch.bfloat16)
    indices = rng.integers(-1, n + 3, (t_rows, topk)).astype(np.int32)
    indices[0, 1] = indices[0, 0]  # duplicate
    counts = rng.integers(0, topk + 1, t_rows).astype(np.int32)
    kw = {
        "base": {},
        "prefetch": {"prefetch": True},
        "prefetch_slots": {"prefetch_slots": True},
        "flat": {"flat_records": True},
    }[variant]
    sm_scale = 576**-0.5
    plan = tsm.SparseMLAPlan.for_launch(
        topk, block_h=tsm._default_block_h(heads), block_n=16, num_warps=4, num_stages=1,
        num_splits=num_splits, **kw,
    )  # fmt: skip
    out, lse = tsm.sparse_mla_fp8_ds_mla_attention(
        q, rec.view(num_blocks, block_size, RECORD), torch.from_numpy(indices),
        sm_scale, valid_counts=torch.from_numpy(counts), plan=plan,
        record_format="nvfp4_ds_mla",
    )  # fmt: skip
    ref_out, ref_lse = _reference(
        q.double().numpy(), _decode(rec.numpy()), indices, counts, sm_scale
    )
    got_lse = lse.double().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.all(np.abs(got_lse[fin] - ref_lse[fin]) <= LSE_ATOL)
    vmax = np.abs(_decode(rec.numpy())[:, :512]).max()
    assert np.all(np.abs(out.double().numpy() - ref_out) <= OUT_ATOL + OUT_RTOL * vmax)
    assert np.all(out.double().numpy()[~fin] == 0)


def test_kernel_reads_the_nvfp4_layout_not_fp8(codec, tsm):
    """Negative control: the same bytes read as if the scale area were not permuted
    (block s at byte 320 + s) give a different output."""
    rng = np.random.default_rng(0)
    kv = torch.from_numpy(rng.standard_normal((16, 576))).float().to(torch.bfloat16)
    kv[:, :512] *= torch.exp2(torch.arange(32).repeat_interleave(16) % 5 - 2.0)
    rec = codec.quantize_nvfp4_ds_mla(kv[:, :512].contiguous(), kv[:, 512:].contiguous())
    perm = [8 * (s & 3) + (s >> 2) for s in range(32)]
    unpermuted = rec.clone()
    unpermuted[:, 320:] = rec[:, 320:][:, perm]  # block order
    q = torch.from_numpy(rng.standard_normal((1, 16, 576))).float().to(torch.bfloat16)
    idx = torch.arange(16, dtype=torch.int32)[None]
    o1, _ = tsm.sparse_mla_fp8_ds_mla_attention(q, rec, idx, 0.04, record_format="nvfp4_ds_mla")
    o2, _ = tsm.sparse_mla_fp8_ds_mla_attention(
        q, unpermuted, idx, 0.04, record_format="nvfp4_ds_mla"
    )
    assert not torch.equal(o1, o2)
