"""A vLLM platform plugin: vLLM's own CPU platform where no CUDA device is visible.

The official (CUDA) wheel detects no platform on a machine without a GPU driver, so every test
that builds a ``VllmConfig`` fails with "Failed to infer device type". This plugin activates a
thin subclass of ``vllm.platforms.cpu.CpuPlatform`` exactly when ``torch.cuda.is_available()``
is false and is inactive (returns None) on a GPU machine, where vLLM's own CUDA detection
applies.

The subclass differs from vLLM's CPU platform in one place only. vLLM 0.34's
``CpuPlatform.check_and_update_config`` raises "vLLM on x86 CPUs requires Triton (triton-cpu)"
when Triton has no active CPU backend (0.33 warned and went on); the test machines run the CUDA
wheel's Triton, which has none, and the tests only build configurations, never the CPU model
runner. ``check_and_update_config`` therefore runs vLLM's own method with that one check turned
back into a warning; everything else it does is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def activate() -> str | None:
    """The CI CPU platform's qualified name when no CUDA device is visible, else None."""
    import torch

    if torch.cuda.is_available():
        return None
    return "dcp_ci_support.platform.CiCpuPlatform"


def _make_platform() -> type:
    from vllm.platforms.cpu import CpuPlatform

    class CiCpuPlatform(CpuPlatform):
        """vLLM's CPU platform; a missing triton-cpu is a warning, as in vLLM 0.33."""

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            import vllm.triton_utils as triton_utils

            if triton_utils.HAS_TRITON:
                return super().check_and_update_config(vllm_config)
            logger.warning(
                "dcp_ci_support: Triton has no CPU backend here; vLLM's 'requires Triton "
                "(triton-cpu)' check is a warning in the test venv (no CPU model runner runs)"
            )
            triton_utils.HAS_TRITON = True
            try:
                return super().check_and_update_config(vllm_config)
            finally:
                triton_utils.HAS_TRITON = False

    CiCpuPlatform.__qualname__ = "CiCpuPlatform"
    return CiCpuPlatform


def __getattr__(name: str) -> Any:
    # Built on first use: vLLM resolves the platform by importing this attribute, after
    # vllm.platforms.cpu is importable; importing vLLM at plugin-discovery time would recurse.
    if name == "CiCpuPlatform":
        cls = _make_platform()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
