# SPDX-License-Identifier: Apache-2.0
"""evidence/kv_pool.py: the KV pool a gate run logged, against the record arithmetic."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))

import kv_pool  # noqa: E402

GIB = 1 << 30


def record(name: str, dtype: str, *, tp: int = 1, dcp: int = 1, indexers=(1, 1, 0, 1)) -> dict:
    layers = [
        {"layer": f"model.layers.{i}", "has_indexer": bool(x)} for i, x in enumerate(indexers)
    ]
    return {
        "kind": "dcp_gate_run",
        "name": name,
        "revision": {"series": "abc"},
        "base": {"vllm": "0.34.0"},
        "machine": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]},
        "config": {
            "kv_cache_dtype": dtype,
            "tp": tp,
            "dcp": dcp,
            "graphs": False,
            "model": "/ckpt/glmn",
            "kv_cache_memory_bytes": GIB,
        },
        "attention_layers": [{"rank": 0, "layers": layers}],
    }


def lease(tmp: Path, runs: dict[str, tuple[dict, int | None]]) -> tuple[Path, Path]:
    """A lease's two archives: run records and rank-0 logs (None: a log without a pool)."""
    src = tmp / "src"
    (src / "runs").mkdir(parents=True)
    (src / "logs").mkdir()
    for name, (rec, tokens) in runs.items():
        (src / "runs" / f"{name}.json").write_text(json.dumps(rec))
        line = (
            f"INFO [kv_cache_utils.py:1168] GPU KV cache size: {tokens:,} tokens" if tokens else ""
        )
        (src / "logs" / f"{name}.rank0.log").write_text(f"INFO start\n{line}\nINFO done\n")
    archives = []
    for part in ("runs", "logs"):
        path = tmp / f"gate-{part}.tgz"
        with tarfile.open(path, "w:gz") as tar:
            tar.add(src / part, arcname=part)
        archives.append(path)
    return archives[0], archives[1]


def test_prediction_is_whole_blocks_of_records_and_indexer_keys():
    """4 layers of 656-byte records and 3 indexer keys of 132 bytes: 3020 bytes a token; a
    1 GiB pool floors to whole 64-token blocks; DCP 4 reports four times the slots."""
    assert kv_pool.predicted_pool(GIB, "fp8_ds_mla", 4, 3, 1) == GIB // (3020 * 64) * 64
    assert kv_pool.predicted_pool(GIB, "nvfp4_ds_mla", 4, 3, 1) == 595_200
    assert kv_pool.predicted_pool(GIB, "nvfp4_ds_mla", 4, 3, 4) == 4 * 595_200
    assert kv_pool.logged_pool("x GPU KV cache size: 2,380,800 tokens, y") == 2_380_800
    assert kv_pool.logged_pool("no pool here") is None


def test_a_pool_off_the_arithmetic_fails_when_required(tmp_path, capsys):
    """Logged pools equal to the prediction pass; one that is not is named, and fails the run
    under --require-prediction; the format ratio pairs only runs alike but for the format."""
    runs, logs = lease(
        tmp_path,
        {
            "fp8": (record("fp8", "fp8_ds_mla"), 355_520),
            "nvfp4": (record("nvfp4", "nvfp4_ds_mla"), 595_200),
            "nvfp4-tp2": (record("nvfp4-tp2", "nvfp4_ds_mla", tp=2), 595_200 - 64),
            "silent": (record("silent", "fp8_ds_mla", tp=4), None),
        },
    )
    out = tmp_path / "pool.json"
    assert kv_pool.main(["--runs", str(runs), "--logs", str(logs), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["off_prediction"] == ["nvfp4-tp2"]
    assert doc["missing"] == ["silent"]
    assert [(p["larger"], p["smaller"], p["ratio"]) for p in doc["ratios"]] == [
        ("nvfp4", "fp8", round(595_200 / 355_520, 4))
    ]
    assert doc["base"] == {"vllm": "0.34.0"} and doc["revision"] == {"series": "abc"}
    argv = ["--runs", str(runs), "--logs", str(logs), "--out", str(out), "--require-prediction"]
    assert kv_pool.main(argv) == 1
    assert "nvfp4-tp2" in capsys.readouterr().err


def test_no_logged_pool_is_an_error(tmp_path):
    runs, logs = lease(tmp_path, {"a": (record("a", "fp8_ds_mla"), None)})
    out = tmp_path / "pool.json"
    assert kv_pool.main(["--runs", str(runs), "--logs", str(logs), "--out", str(out)]) == 1
    assert not out.exists()


@pytest.mark.parametrize("field", ["series", "vllm"])
def test_runs_of_two_revisions_or_bases_are_refused(tmp_path, field):
    a, b = record("a", "fp8_ds_mla"), record("b", "nvfp4_ds_mla")
    if field == "series":
        b["revision"]["series"] = "def"
    else:
        b["base"]["vllm"] = "0.33.0"
    runs, logs = lease(tmp_path, {"a": (a, 355_520), "b": (b, 595_200)})
    out = tmp_path / "pool.json"
    assert kv_pool.main(["--runs", str(runs), "--logs", str(logs), "--out", str(out)]) == 1
