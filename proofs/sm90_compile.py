# SPDX-License-Identifier: Apache-2.0
"""Offline CUDA compiles of shipped Triton kernels (no GPU; sm_90 unless told otherwise): load a
vLLM leaf module with the real Triton behind ``vllm.triton_utils``, and read a compiled
kernel's resources with Triton's bundled ``cuobjdump``; ``signature`` builds a kernel's compile
signature. Used by sparse_mla_sm90_compile_stats.py and evidence/nvfp4_compile_check.py."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterable
from pathlib import Path

# The compute capabilities the scripts compile for: H200 (sm_90), RTX PRO 6000 / RTX 50xx
# (sm_120), DGX Spark (sm_121).
CAPABILITIES = (90, 120, 121)


def load_leaf(path: Path, name: str) -> types.ModuleType:
    """The module at ``path`` (a vLLM leaf: torch + Triton through ``vllm.triton_utils``),
    with ``vllm.triton_utils`` mapped to the real, compiling Triton."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter does not compile")
    import triton
    import triton.language as tl

    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl
    pkg = types.ModuleType("vllm")
    pkg.__path__ = []
    sys.modules.setdefault("vllm", pkg)
    sys.modules["vllm.triton_utils"] = utils
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def signature(
    fn, ptrs: dict[str, str], constexprs: Iterable[str], floats: Iterable[str] = ("qk_scale",)
) -> tuple[dict[str, str], dict[tuple[int], list[list]]]:
    """The compile signature of the jitted ``fn`` and its attributes, as Triton's launcher
    specialises an aligned launch: each argument its ``ptrs`` type (``"*bf16"``, ...),
    ``constexpr`` when in ``constexprs``, ``fp32`` when in ``floats``, else ``i32``; every pointer
    and i32 argument declared divisible by 16 (the benchmarks' sizes and strides are)."""
    names = fn.arg_names
    bound, real = set(constexprs), set(floats)
    sig = {
        n: ptrs.get(n, "constexpr" if n in bound else "fp32" if n in real else "i32") for n in names
    }
    attrs: dict[tuple[int], list[list]] = {
        (i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in ptrs or sig[n] == "i32"
    }
    return sig, attrs


def compile_cuda(
    fn,
    signature: dict,
    constexprs: dict,
    attrs: dict | None = None,
    capability: int = 90,
    **options,
):
    """Triton's own compile of the jitted ``fn`` for the CUDA ``capability`` (one of
    CAPABILITIES; ``options``: num_warps, num_stages), the named constexprs bound."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    bound = {(names.index(k),): v for k, v in constexprs.items()}
    src = ASTSource(fn, signature, bound, attrs) if attrs else ASTSource(fn, signature, bound)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def cuobjdump(compiled, *flags: str) -> list[str]:
    """``cuobjdump FLAG`` over a compiled kernel's cubin, one output per flag."""
    import triton

    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        return [
            subprocess.run(
                [bindir / "cuobjdump", flag, f.name], capture_output=True, text=True, check=True
            ).stdout
            for flag in flags
        ]
    finally:
        os.unlink(f.name)


def resources(res_usage: str) -> dict[str, int | None]:
    """Registers and stack (spill) bytes from ``-res-usage`` output."""
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", res_usage)
    return dict(
        registers=int(m.group(1)) if m else None,
        stack_bytes=int(m.group(2)) if m else None,
    )
