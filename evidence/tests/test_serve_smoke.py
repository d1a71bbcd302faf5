# SPDX-License-Identifier: Apache-2.0
"""The serving smoke's pieces that run without a GPU (evidence/serve_smoke.py): its tokenizer,
prompts, log and metric readers, the offline-vs-server comparison, and that its ``vllm serve``
command means, to the patched vLLM's own parser, the settings its offline engine uses.

The tokenizer and parser checks run in the test venv (``$PATCHSET_TEST_VENV`` or
``build/testenv``: vLLM, Transformers, tokenizers) and skip without it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "evidence"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

import serve_smoke as smoke  # noqa: E402
from venv_probe import needs_venv, run_probe  # noqa: E402

# the probes build a tokenizer and an engine configuration: offline, on CPU
OFFLINE_CPU = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_in_venv(code: str, tmp_path: Path) -> dict:
    return run_probe(code, timeout=600, cwd=tmp_path, env=OFFLINE_CPU)


def test_every_token_id_has_its_own_word_and_the_needle_sits_at_its_id() -> None:
    words = smoke.vocab_words(32000)
    assert len(set(words)) == 32000
    assert words[:3] == ["<s>", "</s>", "<unk>"]
    assert words[smoke.NEEDLE_ID] == smoke.NEEDLE_WORD
    assert words[31999] == "w31999"  # the needle checkpoints' answer token


def test_prompts_are_seeded_and_carry_the_needle_near_the_start() -> None:
    first, again = smoke.prompts(), smoke.prompts()
    assert first == again
    assert [len(p.split()) for p in first] == [64, 700, 3000]
    words = set(smoke.vocab_words(32000))
    for p in first:
        assert p.split()[3] == smoke.NEEDLE_WORD and p.split().count(smoke.NEEDLE_WORD) == 1
        assert set(p.split()) <= words


def test_the_kv_pool_is_the_last_size_the_log_reports() -> None:
    log = (
        "INFO ... GPU KV cache size: 1,024 tokens\n"
        "INFO [kv_cache_utils.py:1314] GPU KV cache size: 18,398,016 tokens\n"
    )
    assert smoke.kv_pool_tokens(log) == 18_398_016
    assert smoke.kv_pool_tokens("no pool here") is None


def test_metrics_sum_label_sets_and_ignore_other_names() -> None:
    page = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts_total Drafts.",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0',
            'vllm:spec_decode_num_drafts_created{engine="0"} 1.7e9',
            "vllm:spec_decode_adaptive_depth 4.0",
        ]
    )
    got = smoke.metric_values(page, smoke.SPEC_METRICS)
    assert got == {
        "vllm:spec_decode_num_drafts_total": 15.0,
        "vllm:spec_decode_adaptive_depth": 4.0,
    }


def test_a_server_answer_that_differs_from_the_offline_one_is_a_problem() -> None:
    ref = {"text": "w31999 w31999", "token_ids": [31999, 31999]}
    assert smoke.compare(ref, {"text": "w31999 w31999", "token_ids": [31999, 31999]}, "a") == []
    assert smoke.compare(ref, {"text": "w31999 w31999"}, "streamed") == []
    assert smoke.compare(ref, {"text": "w31999 w5"}, "b") != []
    assert smoke.compare(ref, {"text": "w31999 w31999", "token_ids": [31999, 5]}, "c") != []
    assert smoke.compare(ref, {}, "d") != []


class _Api:
    """A stand-in of one openai client endpoint: records each call, answers from ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.reply, self.calls = reply, []

    def create(self, **kw: Any) -> Any:
        self.calls.append(kw)
        return self.reply(kw)


def _ns(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(**kw)


def test_ask_joins_streamed_deltas_and_reads_the_plain_answers_token_ids() -> None:
    """Completions and chats, plain and streamed: the request is greedy with the smoke's
    limits, a streamed answer is its deltas joined (chunks without a choice skipped), a plain
    one carries the server's token ids, or None where the server returns none."""

    def completion(kw: dict[str, Any]) -> Any:
        if kw.get("stream"):
            return iter(
                [_ns(choices=[_ns(text="w1")]), _ns(choices=[]), _ns(choices=[_ns(text=" w2")])]
            )
        return _ns(choices=[_ns(text="w1 w2", token_ids=[1001, 1002])])

    def chat(kw: dict[str, Any]) -> Any:
        if kw.get("stream"):
            deltas = [_ns(delta=_ns(content=c)) for c in ("w3", None, " w4")]
            return iter([_ns(choices=[d]) for d in deltas])
        return _ns(choices=[_ns(message=_ns(content="w3 w4"))])

    client = _ns(completions=_Api(completion), chat=_ns(completions=_Api(chat)))
    conv = [{"role": "user", "content": "w5"}]
    assert smoke.ask(client, "w0", stream=True) == {"text": "w1 w2"}
    assert smoke.ask(client, "w0", stream=False) == {"text": "w1 w2", "token_ids": [1001, 1002]}
    assert smoke.ask(client, conv, stream=True) == {"text": "w3 w4"}
    assert smoke.ask(client, conv, stream=False) == {"text": "w3 w4", "token_ids": None}
    plain = client.completions.calls[1]
    assert plain["prompt"] == "w0" and plain["temperature"] == 0.0
    assert plain["max_tokens"] == smoke.MAX_TOKENS and plain["model"] == smoke.SERVED_NAME
    assert plain["extra_body"] == {"return_token_ids": True}
    assert client.chat.completions.calls[0]["messages"] == conv
    assert client.chat.completions.calls[0]["stream"] is True


@needs_venv
def test_the_tokenizer_round_trips_prompts_and_renders_the_chat(tmp_path: Path) -> None:
    """Transformers loads the written tokenizer; a prompt encodes to one id per word and
    decodes back to itself; the chat template ends with the generation prompt."""
    code = f"""
import json, sys
from pathlib import Path
import serve_smoke as s
from transformers import AutoTokenizer
s.write_tokenizer(Path({str(tmp_path)!r}), 32000)
t = AutoTokenizer.from_pretrained({str(tmp_path)!r})
p = s.prompts()[1]
ids = t(p, add_special_tokens=True)["input_ids"]
chat = t.apply_chat_template(s.chats()[1], tokenize=False, add_generation_prompt=True)
print(json.dumps({{"n": len(ids), "words": len(p.split()), "back": t.decode(ids) == p,
  "needle": ids[3], "unk": t.unk_token_id in ids, "eos": t.eos_token_id,
  "chat_head": chat[:16], "chat_tail": chat[-12:]}}))
"""
    got = run_in_venv(code, tmp_path)
    assert got["n"] == got["words"] == 700 and got["back"] and not got["unk"]
    assert got["needle"] == smoke.NEEDLE_ID and got["eos"] == 1
    assert got["chat_head"] == "system : w100 w2" and got["chat_tail"] == " assistant :"


@needs_venv
def test_the_serve_command_means_the_offline_engines_settings(tmp_path: Path) -> None:
    """vLLM's own ``vllm serve`` parser turns serve_argv into engine arguments equal to
    engine_settings (what the offline reference engine is built with), and into an engine
    configuration with the series' backend, the fp8_ds_mla cache and MTP 5 with the
    acceptance-driven depth (the checkpoint's config, no weights)."""
    code = f"""
import json
from pathlib import Path
import make_dsa_gate_ckpt as mk
import serve_smoke as s
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
ckpt = Path({str(tmp_path)!r}) / "ckpt"
ckpt.mkdir()
cfg = mk.make_config("glm", 4)
(ckpt / "config.json").write_text(json.dumps(cfg))
s.write_tokenizer(ckpt, cfg["vocab_size"])
argv = s.serve_argv(ckpt, 8011)
assert argv[:4] == [*s.VLLM_CLI, "serve"], argv
args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(argv[4:])
args.model = args.model_tag
ea = AsyncEngineArgs.from_cli_args(args)
got = {{k: getattr(ea, k) for k in s.engine_settings()}}
config = ea.create_engine_config()
spec = config.speculative_config
print(json.dumps({{"got": got, "want": s.engine_settings(), "port": args.port,
  "name": args.served_model_name,
  "backend": config.attention_config.backend.name,
  "kv": str(config.cache_config.cache_dtype),
  "spec": [spec.method, spec.num_speculative_tokens, spec.adaptive_speculative_tokens],
  "max_len": config.model_config.max_model_len}}))
"""
    got = run_in_venv(code, tmp_path)
    assert got["got"] == got["want"]
    assert got["port"] == 8011 and got["name"] == [smoke.SERVED_NAME]
    assert got["backend"] == smoke.BACKEND and got["kv"] == smoke.KV_CACHE_DTYPE
    assert got["spec"] == ["mtp", 5, "acceptance"]
    assert got["max_len"] == smoke.MAX_MODEL_LEN


def test_depth_changes_and_startup_lines_come_from_the_server_log() -> None:
    log = "\n".join(
        [
            "(EngineCore pid=1) INFO [gpu_worker.py:795] Available KV cache memory: 64.28 GiB",
            "(EngineCore pid=1) INFO [model_runner.py:1216] Graph capturing finished in 10 secs",
            "Capturing CUDA graphs (FULL):   2%| 5/303",
            "(EngineCore pid=1) INFO [kv_cache_utils.py:1168] GPU KV cache size: 17,665,920 tokens",
            "(EngineCore pid=1) INFO [scheduler.py:3512] Adaptive speculative depth 2 -> 4 after "
            "32 steps (32 verifications, per-position acceptance 1.000, 1.000)",
            "(APIServer pid=2) INFO [loggers.py:335] Engine 000: Avg prompt throughput: 1 tokens/s",
            "(EngineCore pid=1) INFO [scheduler.py:3512] Adaptive speculative depth 5 -> 2 after "
            "16 steps (128 verifications, per-position acceptance 0.000)",
        ]
    )
    assert smoke.depth_changes(log) == [
        {"from": 2, "to": 4, "after_steps": 32},
        {"from": 5, "to": 2, "after_steps": 16},
    ]
    lines = smoke.startup_lines(log)
    assert len(lines) == 3 and not any("Capturing" in line or "scheduler" in line for line in lines)
    assert smoke.depth_changes("no depth here") == []
