# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures for the CPU proofs.

Proofs test the code the series ships: they load leaf modules (torch/triton imports only)
straight from a patched vLLM tree by file path, never from a copy. The tree is
``$DCP_VLLM_TREE`` (default: ``build/vllm``, the tree ``make apply`` writes).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def patched_tree() -> Path:
    """The patched vLLM tree the proofs read (``$DCP_VLLM_TREE`` or ``build/vllm``)."""
    return Path(os.environ.get("DCP_VLLM_TREE", REPO / "build" / "vllm")).resolve()


def load_leaf(relpath: str) -> ModuleType:
    """Import one leaf module of the patched tree by path, e.g. ``vllm/v1/attention/ops/x.py``.

    The module is registered under a private name so it never shadows an installed vLLM.
    Fails (not skips) when the file is missing: a proof that cannot find the shipped code
    must not pass silently.
    """
    path = patched_tree() / relpath
    if not path.is_file():
        pytest.fail(f"{path} not found: run `make apply` (or set DCP_VLLM_TREE) first")
    name = "dcp_leaf_" + relpath.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
