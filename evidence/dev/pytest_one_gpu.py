# SPDX-License-Identifier: Apache-2.0
"""pytest plugin: vLLM's platform claims to be CUDA with one visible GPU.

ParallelConfig refuses a world size above the visible GPU count when it picks the executor
itself, a branch that only runs on CUDA: tests that build TP=2 configurations pass on CPU and
on multi-GPU machines and fail on a one-GPU box (the 2026-12-01 22:37Z H200 lease found five
in the series). With this plugin a CPU run takes that branch:

    PYTHONPATH=$PWD/evidence/dev evidence/dev/tree_pytest.sh build/vllm -p pytest_one_gpu \
        tests/config/...

Tests that pick their device from ``is_cuda()`` then look for a CUDA driver and fail: they
are not what the plugin checks.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def one_cuda_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    monkeypatch.setattr(cls, "is_cuda", lambda self: True)
    monkeypatch.setattr(cls, "device_count", classmethod(lambda c: 1), raising=False)
