# SPDX-License-Identifier: Apache-2.0
"""A kept FlashInfer library is installed only on the machine it was built for, byte for byte."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE / "dev"))

import prewarm_flashinfer as pw  # noqa: E402

KEY = {"flashinfer": "0.7.4", "nvcc": "12.9", "capability": "9.0"}


def keep(tmp_path: Path, data: bytes = b"\x7fELF library", key: dict | None = None) -> Path:
    (tmp_path / "trtllm_comm.so").write_bytes(data)
    meta = {"key": key or KEY, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (tmp_path / "trtllm_comm.json").write_text(json.dumps(meta))
    return tmp_path


def test_matching_key_and_bytes_may_seed(tmp_path):
    assert pw.seed_refusal(keep(tmp_path), KEY) is None


def test_another_gpu_refuses(tmp_path):
    why = pw.seed_refusal(keep(tmp_path, key=KEY | {"capability": "12.0"}), KEY)
    assert why is not None and "12.0" in why


def test_altered_bytes_refuse(tmp_path):
    kept = keep(tmp_path)
    (kept / "trtllm_comm.so").write_bytes(b"\x7fELF other")
    assert "sha256" in pw.seed_refusal(kept, KEY)


def test_missing_record_refuses(tmp_path):
    kept = keep(tmp_path)
    (kept / "trtllm_comm.json").unlink()
    assert pw.seed_refusal(kept, KEY) is not None
