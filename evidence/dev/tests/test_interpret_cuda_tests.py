# SPDX-License-Identifier: Apache-2.0
"""evidence/dev/interpret_cuda_tests.py rewrites a CUDA test for the interpreter: the device
strings become cpu, the CUDA skips go, and a form it does not know is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import interpret_cuda_tests as ict  # noqa: E402

CUDA_TEST = """import torch
requires_cuda = pytest.mark.skipif(
    not current_platform.is_cuda(), reason="needs a GPU"
)
DEVICE_TYPE = current_platform.device_type
if not current_platform.is_cuda_alike() and not current_platform.is_xpu():
    pytest.skip("CUDA/XPU required", allow_module_level=True)


@requires_cuda
def test_a():
    device = torch.device("cuda")
    x = torch.zeros(2, device="cuda")


@pytest.mark.skipif(not current_platform.is_cuda(), reason="needs a CUDA GPU")
def test_b():
    dev = "cuda"
    other = "cuda" if current_platform.is_cuda() else "cpu"
"""


def test_cuda_forms_are_rewritten_and_the_skips_dropped() -> None:
    out = ict.interpreted_copy(CUDA_TEST)
    assert 'torch.device("cpu")' in out and 'device="cpu"' in out and 'dev = "cpu"' in out
    assert 'DEVICE_TYPE = "cpu"' in out
    assert "@requires_cuda" not in out and "allow_module_level" not in out
    assert "@pytest.mark.skipif" not in out
    # the fixture's definition and a device chosen at run time are left alone
    assert "requires_cuda = pytest.mark.skipif(" in out
    assert 'other = "cuda" if current_platform.is_cuda() else "cpu"' in out
    compile(out, "copy.py", "exec")


def test_a_cuda_skip_it_does_not_know_is_refused() -> None:
    split = '@pytest.mark.skipif(not current_platform.is_cuda(),\n    reason="x")\ndef t(): ...\n'
    with pytest.raises(ValueError, match="CUDA-only forms left"):
        ict.interpreted_copy(split)
    with pytest.raises(ValueError, match="CUDA-only forms left"):
        ict.interpreted_copy("@requires_cuda  # commented\ndef t(): ...\n")
