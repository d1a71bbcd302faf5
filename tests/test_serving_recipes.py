"""docs/serving.md and README.md: every ``vllm serve`` recipe is complete, fits its machine per the
generated memory table (docs/memory.md, tools/serving_plan.py), and the patched vLLM of the test
venv parses it with its own serve parser, builds its engine configuration on CPU from the
checkpoint's ``config.json`` (``tests/support/serving_models``) and, on a CUDA platform stand-in
of the section's GPU, picks the backend the guide says and accepts the one the recipe names.
Deliberately wrong recipes (``WRONG``) must fail the same checks.

The end-to-end half needs the test venv with the overlay wheel (``$PATCHSET_TEST_VENV``, made by
``make test``) and skips without it, except under ``PATCHSET_E2E=require``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "serving.md"
README = REPO / "README.md"
CHECKER = REPO / "tests" / "support" / "check_serving_recipes.py"
sys.path.insert(0, str(CHECKER.parent))
sys.path.insert(0, str(REPO / "tools"))

import serving_plan  # noqa: E402
from check_serving_recipes import MODELS, Recipe, extract, flag_value  # noqa: E402

RECIPES = extract(DOC.read_text())

SWITCHES = {
    # flag or config key -> (the field check_serving_recipes reports, default, valid values)
    "--dcp-prefill-route": ("dcp_prefill_route", "query", ("query", "packed_ckv")),
    "adaptive_speculative_tokens": ("adaptive_speculative_tokens", "off", ("off", "acceptance")),
}
"""The series' switches the recipes may set; each is off by default."""

AUTO_BACKEND = {
    (12, "fp8_ds_mla"): "TRITON_MLA_SPARSE_FP8_DS_MLA",
    (12, "auto"): "TRITON_MLA_SPARSE_FP8_DS_MLA",
    (9, "fp8_ds_mla"): "FLASHMLA_SPARSE",
    (9, "auto"): "FLASH_ATTN_MLA_SPARSE",
}
"""(compute capability major, --kv-cache-dtype) -> the backend docs/serving.md says vLLM picks
with DCP > 1."""

WRONG = """
## 4 x RTX PRO 6000 (SM120, PCIe)

```bash
vllm serve madeby561/GLM-5.2-NVFP4-REAP-504B \\
  --tensor-parallel-size 4 --decode-context-parallel-size 4 \\
  --max-model-len 131072 --gpu-memory-utilization 0.92 \\
  --attention-backend FLASHMLA_SPARSE --kv-cache-dtype fp8_ds_mla \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' \\
  --tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice
```

```bash
vllm serve madeby561/GLM-5.2-NVFP4-REAP-504B \\
  --tensor-parallel-size 4 --decode-context-parallel-size 1 \\
  --max-model-len 131072 --gpu-memory-utilization 0.92 --kv-cache-dtype fp8_ds_mla \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' \\
  --tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice
```

## 4 x H200 (SM90, NVLink)

```bash
vllm serve deepseek-ai/DeepSeek-V3.2 \\
  --tensor-parallel-size 4 --decode-context-parallel-size 4 \\
  --max-model-len 163840 --gpu-memory-utilization 0.92 --kv-cache-dtype fp8_ds_mla \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 1}' \\
  --tokenizer-mode deepseek_v32 \\
  --tool-call-parser deepseek_v32 --reasoning-parser deepseek_v3 --enable-auto-tool-choice
```

## DGX Spark, 4 nodes (GB10, SM121, one GPU per node)

```bash
NCCL_SOCKET_IFNAME=eth1 GLOO_SOCKET_IFNAME=eth1 VLLM_NO_SUCH_VARIABLE=1 \\
  vllm serve QuantTrio/GLM-5.2-Int4-Int8Mix \\
  --nnodes 4 --node-rank 0 --master-addr 10.0.0.1 \\
  --tensor-parallel-size 4 --decode-context-parallel-size 2 \\
  --max-model-len 524288 --gpu-memory-utilization 0.90 --kv-cache-dtype fp8_ds_mla \\
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' \\
  --tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice
```
"""
"""Recipes that must fail, each with what makes it wrong (``WRONG_BECAUSE``, in order)."""

WRONG_BECAUSE = [
    "not valid",  # FLASHMLA_SPARSE on SM120
    "vLLM picks FLASHINFER_MLA_SPARSE_SM120",  # DCP 1 on SM120: the guide's backend is not used
    "weights do not fit",  # the FP8 release on 4 x H200
    "VLLM_NO_SUCH_VARIABLE",  # an env prefix vLLM does not know
]
WRONG_PLAN_BECAUSE = {2: "weights do not fit", 3: "the KV cache holds 247"}


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
        "max_model_len": int(flag_value(argv, "--max-model-len") or 0),
        "gpu_memory_utilization": float(flag_value(argv, "--gpu-memory-utilization") or 0.9),
        "kv_cache_dtype": flag_value(argv, "--kv-cache-dtype") or "auto",
    }
    for flag in ("--tool-call-parser", "--reasoning-parser", "--tokenizer-mode"):
        if flag_value(argv, flag):
            want[flag[2:].replace("-", "_")] = flag_value(argv, flag)
    if flag_value(argv, "--attention-backend"):
        want["attention_backend"] = flag_value(argv, "--attention-backend")
    if flag_value(argv, "--nnodes"):
        want["nnodes"] = int(flag_value(argv, "--nnodes") or 1)
        want["node_rank"] = int(flag_value(argv, "--node-rank") or 0)
    field, default, _ = SWITCHES["--dcp-prefill-route"]
    want[field] = flag_value(argv, "--dcp-prefill-route") or default
    want["adaptive_speculative_tokens"] = spec.get("adaptive_speculative_tokens", "off")
    return want


def plan_problems(recipe: Recipe) -> list[str]:
    """What is wrong with a recipe without running vLLM: completeness, the model's options,
    the machine of its section and the fit per the memory table."""
    argv, problems = recipe.argv, []
    if argv[0] not in MODELS:
        return [f"{argv[0]} has no fixture in tests/support/serving_models"]
    try:
        machine = serving_plan.machine(recipe.section)
    except KeyError as exc:
        return [str(exc)]
    ckpt = serving_plan.checkpoint(argv[0])
    want = requested(argv)
    tp, dcp = want["tensor_parallel_size"], want["decode_context_parallel_size"]
    for flag in ("--max-model-len", "--gpu-memory-utilization", "--kv-cache-dtype"):
        if flag_value(argv, flag) is None:
            problems.append(f"no {flag}")
    if tp != machine.gpus:
        problems.append(f"TP {tp} on a machine of {machine.gpus} GPUs")
    if not (tp >= dcp > 1 and tp % dcp == 0):
        problems.append(f"DCP {dcp} is not a divisor > 1 of TP {tp}")
    if want["speculative_method"] != "mtp" or not want["num_speculative_tokens"]:
        problems.append("no MTP")
    for flag, (field, _, valid) in SWITCHES.items():
        if want[field] not in valid:
            problems.append(f"{flag}={want[field]} is none of {valid}")
    needs = {
        "--tool-call-parser": ckpt.meta.get("tool_call_parser"),
        "--reasoning-parser": ckpt.meta.get("reasoning_parser"),
        "--tokenizer-mode": ckpt.meta.get("tokenizer_mode"),
    }
    for flag, value in needs.items():
        if value is not None and flag_value(argv, flag) != value:
            problems.append(f"{argv[0]} needs {flag} {value}")
    if "--enable-auto-tool-choice" not in argv:
        problems.append("no --enable-auto-tool-choice")
    if machine.nodes > 1:
        if want.get("nnodes") != machine.nodes:
            problems.append(f"--nnodes is not {machine.nodes}")
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if name not in recipe.env:
                problems.append(f"a multi-node recipe without {name}")
    if want["max_model_len"] > ckpt.config["max_position_embeddings"]:
        problems.append("--max-model-len beyond the model's positions")
    kv = want["kv_cache_dtype"]
    kv = "fp8_ds_mla" if kv in ("auto", "fp8") and machine.capability[0] == 12 else kv
    holds = serving_plan.kv_tokens_per_request(
        ckpt, machine, dcp, kv, want["gpu_memory_utilization"]
    )
    if holds == 0:
        problems.append(f"the weights do not fit {machine.key}")
    elif holds < want["max_model_len"]:
        problems.append(f"--max-model-len {want['max_model_len']}: the KV cache holds {holds}")
    return problems


def resolved_problems(recipe: Recipe, line: dict[str, Any]) -> list[str]:
    """What is wrong with what the patched vLLM resolved for a recipe."""
    if not line["ok"]:
        return [f"{line['error']}\n{line['detail']}"]
    got, problems = line["resolved"], []
    for field, value in requested(recipe.argv).items():
        if got[field] != value:
            problems.append(f"{field}: asked {value!r}, vLLM resolved {got[field]!r}")
    expected = AUTO_BACKEND.get((got["capability"][0], got["kv_cache_dtype"]))
    if got["auto_backend"] != expected:
        problems.append(f"the guide says {expected}, vLLM picks {got['auto_backend']}")
    if got["backend"] != (got["attention_backend"] or got["auto_backend"]):
        problems.append(f"vLLM would run {got['backend']}")
    return problems


def test_every_vllm_serve_block_is_a_recipe() -> None:
    """No block that mentions ``vllm serve`` escapes the checks, in either document."""
    for path in (DOC, README):
        text = path.read_text()
        blocks = [b for b in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)]
        assert len(extract(text)) == sum("vllm serve" in b for b in blocks) > 0, path


def test_a_block_that_is_not_one_command_fails_extraction() -> None:
    with pytest.raises(ValueError, match="2 commands"):
        extract("```bash\nvllm serve a\nvllm serve b\n```\n")
    with pytest.raises(ValueError, match="not a `vllm serve` command"):
        extract("```bash\nsudo vllm serve a\n```\n")
    (recipe,) = extract("## X\n```\nA=1 B='x y' vllm serve m --flag 2\n```\n")
    assert (recipe.env, recipe.argv, recipe.section) == (
        {"A": "1", "B": "x y"},
        ["m", "--flag", "2"],
        "## X",
    )


def test_every_machine_has_its_section_and_a_recipe_where_one_fits() -> None:
    text = DOC.read_text()
    ckpts = serving_plan.load_checkpoints()
    for m in serving_plan.MACHINES:
        assert m.heading in text, m.heading
        fits = any(serving_plan.kv_tokens_per_request(c, m, 1, "fp8_ds_mla") > 0 for c in ckpts)
        has_recipe = any(r.section.startswith(m.heading) for r in RECIPES)
        assert fits == has_recipe, (m.key, fits, has_recipe)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"line{r.line}")
def test_every_recipe_is_complete_and_fits_its_machine(recipe: Recipe) -> None:
    assert plan_problems(recipe) == []


def test_the_wrong_recipes_fail_the_plan_checks() -> None:
    wrong = extract(WRONG)
    for index, because in WRONG_PLAN_BECAUSE.items():
        problems = plan_problems(wrong[index])
        assert any(because in p for p in problems), (index, problems)
    assert "DCP 1 is not a divisor > 1 of TP 4" in plan_problems(wrong[1])


def test_the_readme_command_is_one_of_the_recipes() -> None:
    """The command on the README's first screen is a recipe this test parses."""
    readme = README.read_text()
    start = readme.index("## Serve a model")
    (first, *_) = extract(readme[start:])
    assert first.argv in [r.argv for r in RECIPES]


def test_the_switch_table_names_each_switch_with_its_default_first() -> None:
    text = DOC.read_text()
    for flag, (_, default, valid) in SWITCHES.items():
        row = next((line for line in text.splitlines() if flag in line and "|" in line), None)
        assert row is not None, f"no table row for {flag}"
        values = "`" + "`, `".join(valid) + "`"
        assert values in row and row.index(f"`{default}`") == row.index(values), row


def test_the_memory_table_is_generated_from_the_fixtures() -> None:
    assert (REPO / "docs" / "memory.md").read_text() == serving_plan.render(), (
        "docs/memory.md is stale: python tools/serving_plan.py --write"
    )


def test_computed_weights_match_the_published_sizes() -> None:
    for c in serving_plan.load_checkpoints():
        published = c.meta.get("published_weights_gb")
        if published:
            assert serving_plan.weight_bytes(c) / serving_plan.GB == pytest.approx(
                published, rel=0.03
            ), c.id


def _tree() -> Path | None:
    tree = Path(os.environ.get("PATCHSET_TEST_TREE", REPO / "build" / "vllm"))
    if (tree / "vllm" / "v1" / "attention" / "backend.py").is_file():
        return tree
    if os.environ.get("PATCHSET_E2E") == "require":
        pytest.fail(f"no patched vLLM tree at {tree} (PATCHSET_E2E=require)")
    pytest.skip(f"no patched vLLM tree at {tree}: run `make apply`")
    return None


def test_the_plan_uses_vllms_own_record_sizes() -> None:
    """The KV sizes of tools/serving_plan.py are the ones the pinned vLLM allocates."""
    tree = _tree()
    assert tree is not None
    backend = (tree / "vllm/v1/attention/backend.py").read_text()
    record = serving_plan.FP8_DS_MLA_RECORD
    assert re.search(rf"def get_fp8_ds_mla_row_bytes\(self\) -> int:\s+return {record}\b", backend)
    mla = (tree / "vllm/model_executor/layers/attention/mla_attention.py").read_text()
    assert f'{{"nvfp4_ds_mla": {serving_plan.NVFP4_DS_MLA_RECORD}}}' in mla
    indexer = (tree / "vllm/models/deepseek_v32/attention.py").read_text()
    assert f"self.quant_block_size = {serving_plan.INDEXER_SCALE_BLOCK}" in indexer
    assert "head_dim=self.head_dim + self.head_dim // self.quant_block_size * 4" in indexer


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    venv = Path(os.environ.get("PATCHSET_TEST_VENV", REPO / "build" / "testenv"))
    if not (venv / "dcp-wheel.json").is_file():
        reason = f"no test venv with the overlay wheel at {venv}: run `make test`"
        if os.environ.get("PATCHSET_E2E") == "require":
            pytest.fail(f"{reason} (PATCHSET_E2E=require: end-to-end tests may not skip)")
        pytest.skip(reason)
    wrong = tmp_path_factory.mktemp("recipes") / "wrong.md"
    wrong.write_text(WRONG)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(CHECKER), str(DOC), str(wrong)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    out = {
        "doc": [x for x in lines if x["doc"] == str(DOC)],
        "wrong": [x for x in lines if x["doc"] == str(wrong)],
    }
    assert len(out["doc"]) == len(RECIPES), proc.stdout[-2000:] + proc.stderr[-4000:]
    assert len(out["wrong"]) == len(extract(WRONG)), proc.stdout[-2000:] + proc.stderr[-4000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(RECIPES)), ids=lambda i: f"recipe{i}")
def test_the_patched_vllm_serves_the_recipe_with_the_guides_backend(
    resolved: dict[str, list[dict[str, Any]]], index: int
) -> None:
    recipe = RECIPES[index]
    assert resolved_problems(recipe, resolved["doc"][index]) == [], recipe.argv


@pytest.mark.slow
def test_the_wrong_recipes_fail_on_the_patched_vllm(
    resolved: dict[str, list[dict[str, Any]]],
) -> None:
    for recipe, line, because in zip(extract(WRONG), resolved["wrong"], WRONG_BECAUSE, strict=True):
        problems = resolved_problems(recipe, line) + plan_problems(recipe)
        assert any(because in p for p in problems), (recipe.argv, problems)
