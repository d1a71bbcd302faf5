# SPDX-License-Identifier: Apache-2.0
"""A gate run's name says its kind, checkpoint, TP, DCP and route (evidence/gate/names.py): every
run of the committed suites is checked, so a misnamed run fails CI before any lease runs it."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))

from gate import names, plans  # noqa: E402


def all_runs() -> list[dict]:
    runs: dict[str, dict] = {}
    for suite in plans.load_suites().values():
        for run in suite.runs:
            runs.setdefault(run["name"], run)
    return list(runs.values())


def test_every_suite_run_is_named_for_what_it_runs():
    runs = all_runs()
    assert len(runs) > 150
    problems = [p for run in runs for p in names.contradictions(run)]
    assert problems == []


def test_a_name_decodes_into_kind_checkpoint_geometry_and_route():
    c = names.decode("p-glmn1m-tp4-dcp4-256k-ckv")
    assert (c.kind, c.checkpoint, c.tp, c.dcp) == ("p", "glmn1m", 4, 4)
    assert c.tokens == ["256k", "ckv"] and c.unknown == []
    assert names.decode("p-glmn-tp2-dcp2-merge-triton").tokens == ["merge-triton"]
    assert names.decode("glmn-o2-tp1-dcp1").checkpoint == "glmn-o2"
    assert names.decode("p-glmn-tp2-dcp2-warp").unknown == ["warp"]


def _run(name: str) -> dict:
    return copy.deepcopy(next(r for r in all_runs() if r["name"] == name))


@pytest.mark.parametrize(
    ("name", "change", "complaint"),
    [
        ("p-glmn-tp2-dcp2-nvfp4-graphs", {"graphs": False}, "'graphs'"),
        ("p-glmn-tp2-dcp2-nvfp4-graphs", {"kv_cache_dtype": "fp8_ds_mla"}, "'nvfp4'"),
        ("p-glmn-tp4-dcp4-ckv-graphs", {"dcp": 2}, "dcp 4 but configured 2"),
        ("p-glmn-tp4-dcp4-ckv-graphs", {"engine_extra": {}}, "'ckv'"),
        ("p-glmn-tp2-dcp1-flashmla-graphs", {"backend": "FLASH_ATTN_MLA_SPARSE"}, "backend"),
        ("p-glmn-tp2-dcp2-merge-triton", {"engine_extra": {}}, "merge backend"),
        ("p-glmn-tp4-dcp4-mtp2", {"variant": "stock"}, "variant"),
        ("p-glmn-tp1-dcp1", {"model": "@v32n"}, "checkpoint"),
        ("p-glmn-tp2-dcp2-b12x-ledger-seqs256", {"max_num_seqs": None}, "max_num_seqs"),
        ("p-glmn-tp2-dcp2-ledger", {"max_num_seqs": 256}, "max_num_seqs"),
    ],
)
def test_a_run_whose_configuration_says_otherwise_is_caught(name, change, complaint):
    run = _run(name)
    assert names.contradictions(run) == []
    run.update(change)
    problems = names.contradictions(run)
    assert any(complaint in p for p in problems), problems


def test_every_name_word_is_explained():
    """Each kind, checkpoint family and token has a line saying what it means."""
    for table in (names.KINDS, names.CHECKPOINT_FAMILIES, names.TOKENS):
        assert all(isinstance(v, str) and len(v) > 10 for v in table.values())
