"""A vLLM platform plugin: vLLM's own CPU platform where no CUDA device is visible.

The official (CUDA) wheel detects no platform on a machine without a GPU driver, so every test
that builds a ``VllmConfig`` fails with "Failed to infer device type". This plugin activates
``vllm.platforms.cpu.CpuPlatform`` exactly when ``torch.cuda.is_available()`` is false and is
inactive (returns None) on a GPU machine, where vLLM's own CUDA detection applies.
"""

from __future__ import annotations


def activate() -> str | None:
    """The CPU platform's qualified name when no CUDA device is visible, else None."""
    import torch

    if torch.cuda.is_available():
        return None
    return "vllm.platforms.cpu.CpuPlatform"
