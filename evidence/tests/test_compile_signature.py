# SPDX-License-Identifier: Apache-2.0
"""proofs/sm90_compile.signature: the compile signature the offline compiles (the sparse-MLA
compile stats and evidence/nvfp4_compile_check.py) give a Triton kernel (CPU, no Triton)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "proofs"))

from sm90_compile import signature  # noqa: E402


def test_pointers_constexprs_floats_and_sizes_get_their_types_and_alignment() -> None:
    fn = SimpleNamespace(arg_names=["q_ptr", "n", "qk_scale", "BLOCK", "out_ptr", "stride"])
    sig, attrs = signature(fn, {"q_ptr": "*bf16", "out_ptr": "*fp32"}, {"BLOCK": 64})
    assert sig == {
        "q_ptr": "*bf16",
        "n": "i32",
        "qk_scale": "fp32",
        "BLOCK": "constexpr",
        "out_ptr": "*fp32",
        "stride": "i32",
    }
    # every pointer and i32 argument is declared 16-divisible; floats and constexprs are not
    assert attrs == {(i,): [["tt.divisibility", 16]] for i in (0, 1, 4, 5)}
    sig, _ = signature(fn, {}, (), floats=())
    assert sig["qk_scale"] == "i32" and sig["BLOCK"] == "i32"
