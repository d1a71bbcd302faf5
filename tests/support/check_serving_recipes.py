# SPDX-License-Identifier: Apache-2.0
"""Parse every ``vllm serve`` recipe of Markdown files with vLLM's own serve parser, build its
engine configuration on CPU, and resolve what a GPU of the recipe's section would run; print one
JSON line per recipe.

    <python with the patched vLLM> tests/support/check_serving_recipes.py docs/serving.md [...]

A recipe is a fenced code block that holds ``vllm serve``: one command, optionally after
``NAME=value`` environment assignments (parsed and checked, never skipped); a block that holds
anything else next to it is an error, not a skip. The model id is replaced by its local
stand-in (``serving_models/<slug>/config.json``, the checkpoint's ``config.json`` with its
``quantization_config``, no weights; ``checkpoint.json`` names the id) and the tokenizer is
skipped, so nothing is downloaded. The section heading (``## 4 x H200 ...``) names the machine
(``tools/serving_plan.py``'s ``MACHINES``), hence the GPU's compute capability: after the
configuration is built, a CUDA platform stand-in with that capability (vLLM's own
``CudaPlatformBase``, only the device query replaced) resolves the attention backend vLLM
would pick on its own and validates the one the recipe names, and checks the checkpoint's
quantization method against the capability. ``extract`` uses only the standard library (the
tool tests import it); ``main`` needs vLLM.
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
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tools"))

import serving_plan  # noqa: E402

MODELS = {c.id: serving_plan.FIXTURES / c.slug for c in serving_plan.load_checkpoints()}
"""Recipe model id -> its config-only stand-in directory."""

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
ENV_PREFIXES = ("NCCL_", "GLOO_", "VLLM_", "CUDA_", "HF_", "UCX_", "OMP_")
"""Environment variables a recipe may set before ``vllm serve``; ``VLLM_*`` ones must also be
variables the installed vLLM knows."""


@dataclass
class Recipe:
    argv: list[str]
    """The arguments after ``vllm serve``."""
    env: dict[str, str] = field(default_factory=dict)
    section: str = ""
    """The ``## `` heading above the block."""
    line: int = 0


def _section_at(text: str, pos: int) -> str:
    heads = [m for m in re.finditer(r"^## .*$", text[:pos], re.MULTILINE)]
    return heads[-1].group(0) if heads else ""


def extract(text: str) -> list[Recipe]:
    """Every ``vllm serve`` recipe in document order; ValueError for a block that holds
    ``vllm serve`` but is not exactly one (env-prefixed) command."""
    recipes = []
    for match in _FENCE.finditer(text):
        block = match.group(1)
        if "vllm serve" not in block:
            continue
        line = text.count("\n", 0, match.start()) + 1
        commands = [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
        if len(commands) != 1:
            raise ValueError(f"line {line}: a recipe block holds {len(commands)} commands")
        words = shlex.split(commands[0])
        env = {}
        while words and _ASSIGN.match(words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words[:2] != ["vllm", "serve"]:
            raise ValueError(f"line {line}: not a `vllm serve` command: {commands[0][:80]}")
        recipes.append(Recipe(words[2:], env, _section_at(text, match.start()), line))
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


_EXTENSIONS = (
    "vllm._C_stable_libtorch",
    "vllm.vllm_flash_attn._vllm_fa2_C",
    "vllm.vllm_flash_attn._vllm_fa3_C",
)


class _Device:
    """The compute capability the CUDA stand-in reports (set per recipe)."""

    capability: tuple[int, int] = (9, 0)


def _cuda_stand_in() -> Any:
    """vLLM's CudaPlatformBase with the device query answered by ``_Device``. Loading the
    wheel's CUDA extensions needs the CUDA driver: empty modules stand in for the platform's
    (``vllm.platforms.cuda`` imports it) and for FlashAttention's (FA3's availability is
    whether its extension loaded; the SM 9.x rule then decides). Nothing here runs a kernel."""
    for name in _EXTENSIONS:
        sys.modules.setdefault(name, types.ModuleType(name))
    from vllm.platforms.cuda import CudaPlatformBase
    from vllm.platforms.interface import DeviceCapability

    class CudaStandIn(CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*_Device.capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return f"CUDA stand-in sm_{_Device.capability[0]}{_Device.capability[1]}"

    return CudaStandIn


@contextlib.contextmanager
def _on_gpu(capability: tuple[int, int]) -> Any:
    """The stand-in as vLLM's current platform."""
    import vllm.platforms as platforms

    stand_in = _cuda_stand_in()
    _Device.capability = capability
    saved = platforms._current_platform
    platforms._current_platform = stand_in()
    try:
        yield stand_in
    finally:
        platforms._current_platform = saved


def _check_env(env: dict[str, str]) -> None:
    import vllm.envs as envs

    for name in env:
        if not name.startswith(ENV_PREFIXES):
            raise ValueError(f"environment variable {name} is none of {ENV_PREFIXES}")
        if name.startswith("VLLM_") and name not in envs.environment_variables:
            raise ValueError(f"{name} is not an environment variable of the installed vLLM")


def _check_parsers(args: Any) -> dict[str, Any]:
    """The recipe's tool-call and reasoning parsers are registered in the installed vLLM."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tool, reasoning = getattr(args, "tool_call_parser", None), args.reasoning_parser or None
    if tool and tool not in ToolParserManager.list_registered():
        raise ValueError(f"--tool-call-parser {tool} is not registered")
    if reasoning and reasoning not in ReasoningParserManager.list_registered():
        raise ValueError(f"--reasoning-parser {reasoning} is not registered")
    return {
        "tool_call_parser": tool,
        "reasoning_parser": reasoning,
        "enable_auto_tool_choice": bool(getattr(args, "enable_auto_tool_choice", False)),
        "tokenizer_mode": str(args.tokenizer_mode),
    }


def check(recipe: Recipe) -> dict[str, Any]:
    """Parse one recipe, build its engine configuration and resolve it on the section's GPU."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.layers.attention.mla_attention import (
        _canonicalize_sparse_mla_kv_cache_dtype,
    )
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM <= 0.33
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    argv = recipe.argv
    model = argv[0]
    if model not in MODELS:
        raise ValueError(f"recipe model {model!r} is none of {sorted(MODELS)}")
    machine = serving_plan.machine(recipe.section)
    _check_env(recipe.env)
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args([str(MODELS[model]), *argv[1:]])
    if getattr(args, "model_tag", None):  # what `vllm serve MODEL` does with the positional
        args.model = args.model_tag
    args.skip_tokenizer_init = True
    parsers = _check_parsers(args)
    # The reasoning parser reads the tokenizer's vocabulary while the configuration is built;
    # there is none here (no download), so the name is checked above and then left out.
    args.reasoning_parser = ""
    with mock.patch.dict(os.environ, recipe.env):
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    parallel, spec = config.parallel_config, config.speculative_config
    model_config = config.model_config
    hf = model_config.hf_text_config
    cache_dtype = str(config.cache_config.cache_dtype)
    written = config.attention_config.backend

    with _on_gpu(machine.capability) as cuda, set_current_vllm_config(config):
        capability = cuda.get_device_capability()
        quant = model_config.quantization
        if quant is not None:
            cuda.verify_quantization(quant)
            needs = get_quantization_config(quant).get_min_capability()
            if capability.to_int() < needs:
                raise ValueError(
                    f"{quant} needs compute capability >= {needs}, the section's GPU "
                    f"({machine.gpu}) is {capability.to_int()}"
                )
        selector = AttentionSelectorConfig(
            head_size=int(hf.kv_lora_rank + hf.qk_rope_head_dim),
            dtype=torch.bfloat16,
            kv_cache_dtype=cache_dtype,  # type: ignore[arg-type]
            block_size=None,
            use_mla=True,
            use_sparse=True,
            use_dcp=parallel.decode_context_parallel_size > 1,
        )
        heads = hf.num_attention_heads // parallel.tensor_parallel_size
        auto = cuda.get_attn_backend_cls(None, selector, num_heads=heads)
        _, invalid = cuda.get_valid_backends(capability, selector, num_heads=heads)
        refused = {b.name: reasons for b, (_, reasons) in invalid.items() if "SPARSE" in b.name}
        chosen = auto
        if written is not None:
            chosen = cuda.get_attn_backend_cls(
                AttentionBackendEnum[_name(written)], selector, num_heads=heads
            )
    auto_name = _backend_name(auto)
    chosen_name = _backend_name(chosen)
    backend_cls = AttentionBackendEnum[chosen_name].get_class()
    return {
        "machine": machine.key,
        "capability": list(machine.capability),
        "env": recipe.env,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "decode_context_parallel_size": parallel.decode_context_parallel_size,
        "nnodes": getattr(parallel, "nnodes", None),
        "node_rank": getattr(parallel, "node_rank", None),
        "max_model_len": model_config.max_model_len,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "quantization": model_config.quantization,
        "kv_cache_dtype": cache_dtype,
        "kv_cache_layout": _canonicalize_sparse_mla_kv_cache_dtype(backend_cls, cache_dtype),
        "attention_backend": _name(written),
        "auto_backend": auto_name,
        "refused_backends": refused,
        "backend": chosen_name,
        **parsers,
        "dcp_prefill_route": getattr(parallel, "dcp_prefill_route", None),
        "speculative_method": None if spec is None else spec.method,
        "num_speculative_tokens": None if spec is None else spec.num_speculative_tokens,
        "adaptive_speculative_tokens": getattr(spec, "adaptive_speculative_tokens", None),
    }


def _backend_name(path: str) -> str:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for member in AttentionBackendEnum:
        with contextlib.suppress(ValueError, ImportError):
            if member.get_path() == path:
                return member.name
    raise ValueError(f"no registered backend at {path}")


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import vllm

    failed = 0
    for doc in argv:
        for i, recipe in enumerate(extract(Path(doc).read_text())):
            line: dict[str, Any] = {
                "doc": doc,
                "index": i,
                "line": recipe.line,
                "section": recipe.section,
                "argv": recipe.argv,
                "vllm": vllm.__version__,
            }
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
