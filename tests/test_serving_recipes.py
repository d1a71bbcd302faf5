"""docs/serving.md: every ``vllm serve`` recipe is complete, and the patched vLLM of the test venv
parses it with its own serve parser and builds its engine configuration on CPU (no download:
``tests/support/serving_models`` holds config-only stand-ins of the two models' shapes).

The end-to-end half needs the test venv with the overlay wheel (``$PATCHSET_TEST_VENV``, made by
``make test``) and skips without it, except under ``PATCHSET_E2E=require``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "serving.md"
CHECKER = REPO / "tests" / "support" / "check_serving_recipes.py"
sys.path.insert(0, str(CHECKER.parent))

from check_serving_recipes import MODELS, extract_recipes, flag_value  # noqa: E402

RECIPES = extract_recipes(DOC.read_text())

SWITCHES = {
    # flag or config key -> (the field check_serving_recipes reports, default, valid values)
    "--dcp-prefill-route": ("dcp_prefill_route", "query", ("query", "packed_ckv")),
    "adaptive_speculative_tokens": ("adaptive_speculative_tokens", "off", ("off", "acceptance")),
}
"""The series' switches the recipes may set; each is off by default."""


def _spec(argv: list[str]) -> dict[str, Any]:
    raw = flag_value(argv, "--speculative-config")
    return json.loads(raw) if raw else {}


def requested(argv: list[str]) -> dict[str, Any]:
    """What a recipe asks vLLM for, in the fields the checker reports."""
    spec = _spec(argv)
    want: dict[str, Any] = {
        "tensor_parallel_size": int(flag_value(argv, "--tensor-parallel-size") or 1),
        "decode_context_parallel_size": int(
            flag_value(argv, "--decode-context-parallel-size") or 1
        ),
        "speculative_method": spec.get("method"),
        "num_speculative_tokens": spec.get("num_speculative_tokens"),
    }
    if flag_value(argv, "--kv-cache-dtype"):
        want["kv_cache_dtype"] = flag_value(argv, "--kv-cache-dtype")
    if flag_value(argv, "--attention-backend"):
        want["attention_backend"] = flag_value(argv, "--attention-backend")
    if flag_value(argv, "--nnodes"):
        want["nnodes"] = int(flag_value(argv, "--nnodes") or 1)
        want["node_rank"] = int(flag_value(argv, "--node-rank") or 0)
    field, default, _ = SWITCHES["--dcp-prefill-route"]
    want[field] = flag_value(argv, "--dcp-prefill-route") or default
    want["adaptive_speculative_tokens"] = spec.get("adaptive_speculative_tokens", "off")
    return want


def test_the_guide_has_a_recipe_per_gpu_kind_and_model() -> None:
    text = DOC.read_text()
    sections = {
        "## 4 x H100 / H200 (SM90": set(),
        "## 4 x RTX PRO 6000 (SM120": set(),
        "## DGX Spark cluster (GB10, SM121": set(),
    }
    for heading in sections:
        assert heading in text, heading
        start = text.index(heading)
        end = text.find("\n## ", start + 1)
        for argv in extract_recipes(text[start : end if end > 0 else None]):
            sections[heading].add(argv[0])
    for heading, models in sections.items():
        assert models == set(MODELS), (heading, models)


@pytest.mark.parametrize("argv", RECIPES, ids=lambda a: " ".join(a)[:60])
def test_every_recipe_is_a_complete_dcp_mtp_command(argv: list[str]) -> None:
    assert argv[0] in MODELS
    want = requested(argv)
    assert want["tensor_parallel_size"] >= want["decode_context_parallel_size"] > 1
    assert want["tensor_parallel_size"] % want["decode_context_parallel_size"] == 0
    assert want["speculative_method"] == "mtp" and want["num_speculative_tokens"] >= 1
    for flag, (field, _, valid) in SWITCHES.items():
        assert want[field] in valid, (flag, want[field])


def test_the_readme_command_is_one_of_the_recipes() -> None:
    """The command on the README's first screen is a recipe this test parses."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Serve a model")
    block = readme[readme.index("```\n", start) + 4 :]
    block = block[: block.index("```")]
    assert extract_recipes(f"```bash\n{block}```\n")[0] in RECIPES


def test_the_switch_table_names_each_switch_with_its_default_first() -> None:
    text = DOC.read_text()
    for flag, (_, default, valid) in SWITCHES.items():
        row = next((line for line in text.splitlines() if flag in line and "|" in line), None)
        assert row is not None, f"no table row for {flag}"
        values = "`" + "`, `".join(valid) + "`"
        assert values in row and row.index(f"`{default}`") == row.index(values), row


@pytest.fixture(scope="module")
def resolved() -> list[dict[str, Any]]:
    venv = Path(os.environ.get("PATCHSET_TEST_VENV", REPO / "build" / "testenv"))
    if not (venv / "dcp-wheel.json").is_file():
        reason = f"no test venv with the overlay wheel at {venv}: run `make test`"
        if os.environ.get("PATCHSET_E2E") == "require":
            pytest.fail(f"{reason} (PATCHSET_E2E=require: end-to-end tests may not skip)")
        pytest.skip(reason)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(CHECKER), str(DOC)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == len(RECIPES), proc.stdout[-2000:] + proc.stderr[-4000:]
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(RECIPES)), ids=lambda i: f"recipe{i}")
def test_the_patched_vllm_parses_the_recipe_and_keeps_every_value(
    resolved: list[dict[str, Any]], index: int
) -> None:
    line = resolved[index]
    assert line["ok"], f"{' '.join(line['argv'])}\n{line['error']}\n{line['detail']}"
    got = line["resolved"]
    for field, value in requested(line["argv"]).items():
        assert got[field] == value, (field, got[field], value, line["argv"])
