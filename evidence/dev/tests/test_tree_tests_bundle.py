# SPDX-License-Identifier: Apache-2.0
"""The GPU test bundle's offline hub cache: the model configs the series' tests name resolve
with no network (the GPU machine has none), from the files under evidence/dev/hf_configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "evidence" / "dev"))
sys.path.insert(0, str(REPO / "tests"))

import tree_tests_bundle  # noqa: E402
from test_e2e_install import testenv  # noqa: E402,F401  (the fixture)

DSV2 = "deepseek-ai/DeepSeek-V2-Lite-Chat"


def test_the_cache_names_a_snapshot_per_config_and_a_change_moves_it(tmp_path: Path) -> None:
    """Each <org>/<name> folder becomes models--<org>--<name> whose refs/main names a
    snapshot holding byte copies of its files; changing a file gives another snapshot id."""
    src = tmp_path / "configs" / "org" / "model"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"model_type": "x"}\n')
    assert tree_tests_bundle.write_offline_hf_cache(tmp_path / "a", tmp_path / "configs") == [
        "org/model"
    ]
    repo = tmp_path / "a" / "models--org--model"
    rev = (repo / "refs" / "main").read_text()
    assert len(rev) == 40
    assert (repo / "snapshots" / rev / "config.json").read_bytes() == b'{"model_type": "x"}\n'
    (src / "config.json").write_text('{"model_type": "y"}\n')
    tree_tests_bundle.write_offline_hf_cache(tmp_path / "b", tmp_path / "configs")
    assert (tmp_path / "b" / "models--org--model" / "refs" / "main").read_text() != rev


def test_every_committed_config_is_a_model_config() -> None:
    """What the repository ships parses as JSON and names its model type and architecture."""
    found = sorted(tree_tests_bundle.HF_CONFIGS.glob("*/*/config.json"))
    assert DSV2 in {f"{p.parent.parent.name}/{p.parent.name}" for p in found}
    for path in found:
        cfg = json.loads(path.read_text())
        assert cfg["model_type"] and cfg["architectures"], path


PROBE = """
import json, sys
from tests.v1.attention.utils import create_vllm_config
cfg = create_vllm_config(model_name=sys.argv[1], max_model_len=4096, block_size=64)
hf = cfg.model_config.hf_config
print(json.dumps({"model_type": hf.model_type, "kv_lora_rank": hf.kv_lora_rank,
                  "heads": hf.num_attention_heads}))
"""


@pytest.mark.slow
def test_vllm_test_helpers_build_the_config_offline(testenv: Path, tmp_path: Path) -> None:  # noqa: F811
    """In the test venv, with the hub unreachable by setting (HF_HUB_OFFLINE=1), vLLM's own
    test helper builds a VllmConfig for DeepSeek-V2-Lite-Chat from the bundle's cache, as the
    GPU tree-tests stage runs it (the bundle root on sys.path for ``tests``)."""
    bundle = tmp_path / "bundle"
    rc = tree_tests_bundle.main([str(REPO / "build" / "vllm"), str(bundle), "--no-wheels"])
    assert rc == 0
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": str(bundle / "hf-cache"),
    }
    got = subprocess.run(
        [str(testenv / "bin" / "python"), "-c", PROBE, DSV2],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert json.loads(got.stdout.strip().splitlines()[-1]) == {
        "model_type": "deepseek_v2",
        "kv_lora_rank": 512,
        "heads": 16,
    }
