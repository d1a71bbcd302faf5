"""evidence/cutedsl_merge_compile.py: what it reads from the compiler's artefacts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cutedsl_merge_compile as cc  # noqa: E402


def test_ptx_target_is_the_target_line() -> None:
    ptx = "//\n.version 9.4\n.target sm_120a\n.address_size 64\n"
    assert cc.ptx_target(ptx) == "sm_120a"
    assert cc.ptx_target(".version 9.4\n") is None


def test_cubin_targets_and_registers_come_from_cuobjdump() -> None:
    sass = "\tcode for sm_121a\n\t\tFunction : k0\n\tcode for sm_121a\n\t\tFunction : k1\n"
    assert cc.cubin_targets(sass) == ["sm_121a"]
    usage = (
        "Resource usage:\n Function k0:\n  REG:128 STACK:0 SHARED:1040 LOCAL:0\n"
        " Function k1:\n  REG:37 STACK:0 SHARED:0 LOCAL:0\n"
    )
    assert cc.registers(usage) == [128, 37]
    assert cc.local_bytes(usage) == [0, 0]


def test_every_target_the_users_run_is_compiled() -> None:
    assert {"sm_90a", "sm_120a", "sm_121a"} <= set(cc.ARCHS)
    assert any(topk == 2048 for topk, *_ in cc.GATHERED)
