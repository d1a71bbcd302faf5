# SPDX-License-Identifier: Apache-2.0
"""Load shipped vLLM Triton modules on CPU, under the Triton interpreter.

vLLM modules import Triton through ``vllm.triton_utils``, which hands out a placeholder on a
machine without a GPU driver, so the kernels cannot be imported from an installed vLLM here.
``load_shipped_triton`` executes the module file of the patched tree itself, with
``vllm.triton_utils`` resolved to the real ``triton`` / ``triton.language`` (interpreted:
``TRITON_INTERPRET=1``) and any other ``vllm`` import it needs resolved to a stated stand-in.
The stand-ins exist only while the module body runs; ``sys.modules`` is restored afterwards.
The code under test (kernels and launchers) is the shipped file, byte for byte.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from conftest import patched_tree  # noqa: E402


def _package(name: str) -> ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []
    return module


def _shipped_file(relpath: str) -> Path:
    """The patched tree's ``relpath``; fails unless Triton is interpreted and the file exists."""
    import pytest

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("shipped Triton kernels run on CPU only with TRITON_INTERPRET=1")
    path = patched_tree() / relpath
    if not path.is_file():
        pytest.fail(f"{path} not found: run `make apply` (or set DCP_VLLM_TREE) first")
    return path


def _triton_utils_stand_in(**extra: object) -> ModuleType:
    """``vllm.triton_utils`` resolved to the real (interpreted) Triton."""
    module = types.ModuleType("vllm.triton_utils")
    module.triton = triton
    module.tl = tl
    for key, value in extra.items():
        setattr(module, key, value)
    return module


def _exec_registered(name: str, path: Path) -> ModuleType:
    """Execute ``path`` as module ``name``, registered before the body runs (as importlib
    does, so that dataclasses and other code that looks its own module up in sys.modules
    work) and unregistered again if the body raises."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_shipped_triton(
    relpath: str, stand_ins: Mapping[str, Mapping[str, object]] | None = None
) -> ModuleType:
    """Execute ``relpath`` of the patched tree with real (interpreted) Triton.

    ``stand_ins`` maps further ``vllm.*`` module names the file imports to the attributes they
    must provide (e.g. a type used only in annotations). Fails when the file is missing.
    """
    path = _shipped_file(relpath)
    name = "dcp_shipped_" + relpath.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]

    shims: dict[str, ModuleType] = {"vllm.triton_utils": _triton_utils_stand_in()}
    for mod_name, attrs in (stand_ins or {}).items():
        module = types.ModuleType(mod_name)
        for key, value in attrs.items():
            setattr(module, key, value)
        shims[mod_name] = module
    for mod_name in list(shims):
        parts = mod_name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            shims.setdefault(parent, _package(parent))

    saved = {key: sys.modules.get(key) for key in shims}
    try:
        sys.modules.update(shims)
        return _exec_registered(name, path)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def load_shipped_triton_with_vllm(relpath: str) -> ModuleType:
    """Execute ``relpath`` of the patched tree like ``load_shipped_triton``, but with its other
    ``vllm`` imports resolved to the installed vLLM (same pinned version as the tree's base).

    For modules that import much of vLLM (e.g. ``vllm/v1/attention/ops/dcp.py``).
    ``vllm.triton_utils`` is the real, interpreted Triton while the file and the vLLM modules
    it pulls in first are imported; it is restored afterwards (modules imported meanwhile keep
    the real Triton, which is what they would get on a GPU host). Fails when vLLM is missing.
    """
    import pytest

    path = _shipped_file(relpath)
    name = "dcp_shipped_vllm_" + relpath.removesuffix(".py").replace("/", "_")
    if name in sys.modules:
        return sys.modules[name]
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the environment
        pytest.fail(f"{relpath} needs an installed vLLM: {e}")

    triton_utils = _triton_utils_stand_in(HAS_TRITON=True)
    saved_module = sys.modules.get("vllm.triton_utils")
    saved_attr = getattr(vllm, "triton_utils", None)
    try:
        sys.modules["vllm.triton_utils"] = triton_utils
        vllm.triton_utils = triton_utils
        return _exec_registered(name, path)
    finally:
        if saved_module is None:
            sys.modules.pop("vllm.triton_utils", None)
        else:
            sys.modules["vllm.triton_utils"] = saved_module
        if saved_attr is None:
            vars(vllm).pop("triton_utils", None)
        else:
            vllm.triton_utils = saved_attr
