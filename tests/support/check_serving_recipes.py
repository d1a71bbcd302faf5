# SPDX-License-Identifier: Apache-2.0
"""Parse every ``vllm serve`` recipe of a Markdown file with vLLM's own serve parser and build its
engine configuration on CPU; print one JSON line per recipe.

    <python with the patched vLLM> tests/support/check_serving_recipes.py docs/serving.md

A recipe is a fenced ``bash`` block whose first line starts with ``vllm serve``. Its model id is
replaced by a local shape stand-in (``serving_models/``: a config.json, no weights) and the
tokenizer is skipped, so nothing is downloaded. What each line reports is what vLLM resolved:
the parallel sizes, the KV-cache dtype, the attention backend and the series' switches (None
where the installed vLLM has no such field). ``extract_recipes`` uses only the standard library
(the tool tests import it); ``main`` needs vLLM.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = {
    "zai-org/GLM-5": HERE / "serving_models" / "glm5",
    "deepseek-ai/DeepSeek-V3.2": HERE / "serving_models" / "deepseek_v32",
}
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def extract_recipes(text: str) -> list[list[str]]:
    """The argv (after ``vllm serve``) of every recipe block, in document order."""
    recipes = []
    for block in _FENCE.findall(text):
        command = block.replace("\\\n", " ").strip()
        if not command.startswith("vllm serve"):
            continue
        if "\n" in command:
            raise ValueError(f"a recipe block holds more than one command:\n{block}")
        recipes.append(shlex.split(command)[2:])
    return recipes


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag v`` or ``--flag=v``), or None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _name(value: Any) -> Any:
    return getattr(value, "name", value)


def check(argv: list[str]) -> dict[str, Any]:
    """Parse one recipe and build its engine configuration; what vLLM resolved."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM <= 0.33
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    model = argv[0]
    if model not in MODELS:
        raise ValueError(f"recipe model {model!r} is none of {sorted(MODELS)}")
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args([str(MODELS[model]), *argv[1:]])
    if getattr(args, "model_tag", None):  # what `vllm serve MODEL` does with the positional
        args.model = args.model_tag
    args.skip_tokenizer_init = True
    engine_args = AsyncEngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()
    parallel, spec = config.parallel_config, config.speculative_config
    return {
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "decode_context_parallel_size": parallel.decode_context_parallel_size,
        "nnodes": getattr(parallel, "nnodes", None),
        "node_rank": getattr(parallel, "node_rank", None),
        "kv_cache_dtype": str(config.cache_config.cache_dtype),
        "attention_backend": _name(config.attention_config.backend),
        "dcp_prefill_route": getattr(parallel, "dcp_prefill_route", None),
        "speculative_method": None if spec is None else spec.method,
        "num_speculative_tokens": None if spec is None else spec.num_speculative_tokens,
        "adaptive_speculative_tokens": getattr(spec, "adaptive_speculative_tokens", None),
    }


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import vllm

    recipes = extract_recipes(Path(argv[0]).read_text())
    failed = 0
    for i, recipe in enumerate(recipes):
        line: dict[str, Any] = {"index": i, "argv": recipe, "vllm": vllm.__version__}
        log = io.StringIO()
        try:
            with contextlib.redirect_stderr(log):
                line["resolved"] = check(recipe)
            line["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - argparse exits; reported per recipe
            failed += 1
            line["ok"] = False
            line["error"] = f"{type(exc).__name__}: {exc}"
            line["detail"] = (log.getvalue() + traceback.format_exc())[-3000:]
        print(json.dumps(line), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
