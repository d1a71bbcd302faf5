#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real ``vllm serve`` of the patched vLLM answering the ``openai`` client (issue 41 item 7).

On one GPU, with no download:

1. ``checkpoint``: the seeded GLM-5-shaped checkpoint whose MTP layer drafts accepted tokens
   (the gates' ``glmnm``: evidence/make_dsa_gate_ckpt.py with ``checkpoints.json``'s
   ``mtp_accept`` arguments) plus a word-level tokenizer this script writes (``write_tokenizer``:
   one word per token id, a chat template), so text prompts, chat and detokenization work.
2. ``offline``: ``vllm.LLM`` with the serve settings below, greedy, one request at a time: the
   reference texts and token ids of the completion prompts and of the chat conversations.
3. ``serve``: ``vllm serve`` (vLLM's own CLI entry point) with the same settings; the
   ``openai`` client asks the same completions and chats, plain and streamed (each must equal the
   offline greedy output: text, and token ids where the server returns them); ``/metrics``
   gives the speculative counters and the adaptive depth; ``vllm bench serve`` (random
   dataset) measures the server; the start-up log gives the KV pool vLLM sized.

Settings: the series' Triton sparse-MLA backend on an fp8_ds_mla cache, MTP 5 with the
acceptance-driven depth (0012), TP 1 / DCP 1 (one GPU: no DCP rank is exercised here).
The checkpoint's answers are one token repeated (it is built to make attention decide the
answer, not to write prose): the run checks the serving path, not quality.

Usage (the device machine, the patched vLLM importable):
    python evidence/serve_smoke.py all --work <work> --out $OUT/serve-smoke.json
Phases may run in separate calls of one machine (``offline`` keeps its reference in --work).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

SERVED_NAME = "glm5-seeded"
BACKEND = "TRITON_MLA_SPARSE_FP8_DS_MLA"
KV_CACHE_DTYPE = "fp8_ds_mla"
SPECULATIVE = {
    "method": "mtp",
    "num_speculative_tokens": 5,
    "adaptive_speculative_tokens": "acceptance",
}
MAX_MODEL_LEN = 16384
GPU_MEMORY_UTILIZATION = 0.85
MAX_TOKENS = 24

# the tokenizer: special tokens, the chat template's words, then one word per remaining id
SPECIAL = {"<s>": 0, "</s>": 1, "<unk>": 2}
TEMPLATE_WORDS = ("user", "assistant", "system", ":")
NEEDLE_ID = 7  # checkpoints.json's --needle: the token the answer and the MTP draft retrieve
NEEDLE_WORD = "needle"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
VLLM_CLI = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
"""The ``vllm`` command (vLLM's CLI entry point) of the Python running this script; ``--vllm``
names another (the ``vllm`` script a pip-installed wheel put on the path)."""


def as_typed(argv: list[str], cli: list[str] = VLLM_CLI) -> str:
    """A command line of the ``vllm`` command ``cli`` as a user types it (``vllm serve ...``)."""
    if argv[: len(cli)] != cli:
        raise ValueError(f"{argv[:3]} does not start with the vllm command {cli}")
    return shlex.join(["vllm", *argv[len(cli) :]])


KV_POOL_RE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def vocab_words(vocab_size: int) -> list[str]:
    """The word of every token id: ``<s>``, ``</s>``, ``<unk>``, the template's words, the
    needle at its id, ``w<id>`` elsewhere. Each word is one token and the words are distinct."""
    words = [f"w{i}" for i in range(vocab_size)]
    for word, i in SPECIAL.items():
        words[i] = word
    for i, word in enumerate(TEMPLATE_WORDS, start=len(SPECIAL)):
        words[i] = word
    words[NEEDLE_ID] = NEEDLE_WORD
    if len(set(words)) != vocab_size:
        raise ValueError("the template words, the needle and the specials overlap")
    return words


def write_tokenizer(out: Path, vocab_size: int) -> dict[str, Any]:
    """A word-level ``tokenizer.json`` + ``tokenizer_config.json`` that Transformers loads as a
    PreTrainedTokenizerFast: whitespace split, one id per word, decode joins with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = vocab_words(vocab_size)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL))
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": MAX_MODEL_LEN,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return {"vocab_size": vocab_size, "needle": [NEEDLE_ID, NEEDLE_WORD]}


def prompts(n_words: tuple[int, ...] = (64, 700, 3000)) -> list[str]:
    """Completion prompts: seeded words with the needle near the start (the answer and the
    MTP draft retrieve it, so drafts are accepted), of several lengths (one above the indexer's
    top-k of 512 tokens, so the sparse selection decides what attention sees)."""
    import random

    out = []
    for n in n_words:
        rng = random.Random(f"serve-smoke/{n}")
        ids = [rng.randrange(16, 31999) for _ in range(n)]
        ids[3] = NEEDLE_ID
        out.append(" ".join(NEEDLE_WORD if i == NEEDLE_ID else f"w{i}" for i in ids))
    return out


def chats() -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": prompts((40,))[0]}],
        [
            {"role": "system", "content": "w100 w200 w300"},
            {"role": "user", "content": prompts((900,))[0]},
        ],
    ]


def engine_settings() -> dict[str, Any]:
    """The settings the offline engine and the server share (as LLM keyword arguments)."""
    return {
        "attention_backend": BACKEND,
        "kv_cache_dtype": KV_CACHE_DTYPE,
        "speculative_config": dict(SPECULATIVE),
        "max_model_len": MAX_MODEL_LEN,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "seed": 0,
        # FlashInfer's start-up autotune (on by default in 0.34) tunes kernels this engine does
        # not run on its hot path (the Triton backend): the 2026-12-06 H200 lease spent its
        # offline engine's last minute in it, 22 token buckets up to 16,384
        "enable_flashinfer_autotune": False,
    }


def serve_argv(model: Path, port: int, cli: list[str] = VLLM_CLI) -> list[str]:
    """``vllm serve`` with :func:`engine_settings` (the CLI's spelling of each one)."""
    s = engine_settings()
    return [
        *cli,
        "serve",
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--port",
        str(port),
        "--attention-backend",
        s["attention_backend"],
        "--kv-cache-dtype",
        s["kv_cache_dtype"],
        "--speculative-config",
        json.dumps(s["speculative_config"]),
        "--max-model-len",
        str(s["max_model_len"]),
        "--gpu-memory-utilization",
        str(s["gpu_memory_utilization"]),
        "--seed",
        str(s["seed"]),
        "--no-enable-flashinfer-autotune",
    ]


def kv_pool_tokens(log: str) -> int | None:
    """The KV pool vLLM sized, from its start-up log (the last report), or None."""
    found = KV_POOL_RE.findall(log)
    return int(found[-1].replace(",", "")) if found else None


DEPTH_RE = re.compile(r"Adaptive speculative depth (\d+) -> (\d+) after (\d+) steps")
STARTUP_RE = re.compile(
    r"Available KV cache memory|GPU KV cache size|Extended KV cache|Graph capturing finished"
    r"|init engine"
)


def depth_changes(log: str) -> list[dict[str, int]]:
    """Each change of the adaptive speculative depth (0012's scheduler line), in order."""
    return [
        {"from": int(a), "to": int(b), "after_steps": int(n)} for a, b, n in DEPTH_RE.findall(log)
    ]


def startup_lines(log: str) -> list[str]:
    """The start-up log lines that size the KV pool and capture the graphs."""
    return [line for line in log.splitlines() if STARTUP_RE.search(line)]


def metric_values(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of each named Prometheus metric's samples (all label sets) in a /metrics page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{\s]", line, maxsplit=1)[0]
        if name in names:
            out[name] = out.get(name, 0.0) + float(line.rsplit(None, 1)[-1])
    return out


SPEC_METRICS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_adaptive_depth",
)


def compare(ref: dict[str, Any], got: dict[str, Any], label: str) -> list[str]:
    """What differs between the offline reference and a server answer (empty: equal). Token
    ids are compared where the answer carries them."""
    problems = []
    if got.get("text") != ref["text"]:
        problems.append(f"{label}: text {got.get('text')!r} != offline {ref['text']!r}")
    if got.get("token_ids") is not None and list(got["token_ids"]) != list(ref["token_ids"]):
        problems.append(f"{label}: token ids differ from offline")
    return problems


# ---------------------------------------------------------------------------------------------
# phases (the device machine)


def phase_checkpoint(work: Path) -> Path:
    import make_dsa_gate_ckpt as mk
    from gate.plans import MTP_ACCEPT_CKPT

    ckpt = work / "ckpt"
    if not (ckpt / "tokenizer.json").is_file():
        mk.main([*MTP_ACCEPT_CKPT, "--out", str(ckpt)])
        cfg = json.loads((ckpt / "config.json").read_text())
        write_tokenizer(ckpt, cfg["vocab_size"])
    return ckpt


def phase_offline(work: Path, ckpt: Path) -> dict[str, Any]:
    out = work / "offline.json"
    if out.is_file():
        return json.loads(out.read_text())
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=str(ckpt), **engine_settings())
    start_s = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    ref: dict[str, Any] = {"start_s": round(start_s, 1), "completions": [], "chats": []}
    for p in prompts():  # one request at a time, as the client asks them
        o = llm.generate([p], params)[0].outputs[0]
        ref["completions"].append({"text": o.text, "token_ids": list(o.token_ids)})
    for conv in chats():
        o = llm.chat([conv], params)[0].outputs[0]
        ref["chats"].append({"text": o.text, "token_ids": list(o.token_ids)})
    out.write_text(json.dumps(ref, indent=1) + "\n")
    return ref


def ask(client: Any, item: str | list[dict[str, str]], *, stream: bool) -> dict[str, Any]:
    """One greedy request through the ``openai`` client: a completion for a prompt, a chat for
    a conversation. A streamed answer is its deltas joined; a plain one also carries the token
    ids the server returns (vLLM's ``return_token_ids``), None where it returns none."""
    chat = not isinstance(item, str)
    api = client.chat.completions if chat else client.completions
    kw: dict[str, Any] = {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    kw["messages" if chat else "prompt"] = item
    if stream:
        pieces = [
            (c.choices[0].delta.content if chat else c.choices[0].text) or ""
            for c in api.create(stream=True, **kw)
            if c.choices
        ]
        return {"text": "".join(pieces)}
    choice = api.create(extra_body={"return_token_ids": True}, **kw).choices[0]
    return {
        "text": choice.message.content if chat else choice.text,
        "token_ids": getattr(choice, "token_ids", None),
    }


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (local server)
        return r.read().decode()


def phase_serve(
    work: Path,
    ckpt: Path,
    ref: dict[str, Any],
    port: int,
    budget_s: float,
    cli: list[str] = VLLM_CLI,
) -> dict:
    import openai

    log_path = work / "server.log"
    argv = serve_argv(ckpt, port, cli)
    res: dict[str, Any] = {"serve_command": as_typed(argv, cli), "problems": []}
    t0 = time.time()
    with log_path.open("w") as log:
        server = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode} before /health")
            if time.time() - t0 > budget_s:
                raise TimeoutError(f"no /health after {budget_s:.0f} s")
            time.sleep(2)
        res["server_start_s"] = round(time.time() - t0, 1)
        res["kv_pool_tokens"] = kv_pool_tokens(log_path.read_text(errors="replace"))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        answers: dict[str, list[dict[str, Any]]] = {}
        for stream in (False, True):
            kind = "stream" if stream else "plain"
            answers[f"completions/{kind}"] = [ask(client, p, stream=stream) for p in prompts()]
            answers[f"chat/{kind}"] = [ask(client, c, stream=stream) for c in chats()]
        for key, got in answers.items():
            refs = ref["chats"] if key.startswith("chat") else ref["completions"]
            for i, (want, have) in enumerate(zip(refs, got, strict=True)):
                res["problems"] += compare(want, have, f"{key}[{i}]")
        res["answers"] = answers
        res["spec_metrics_after_client"] = metric_values(
            _get(f"http://127.0.0.1:{port}/metrics"), SPEC_METRICS
        )
        res["bench"] = bench_serve(work, ckpt, port, cli)
        res["spec_metrics_after_bench"] = metric_values(
            _get(f"http://127.0.0.1:{port}/metrics"), SPEC_METRICS
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    log = log_path.read_text(errors="replace")
    res["server_startup_lines"] = startup_lines(log)
    res["depth_changes"] = depth_changes(log)
    # the client's prompts carry the needle (drafts accepted: the depth rises); the bench's
    # random prompts do not (drafts rejected: it falls back)
    if not any(c["to"] > c["from"] for c in res["depth_changes"]):
        res["problems"].append("the adaptive depth never rose")
    if not any(c["to"] < c["from"] for c in res["depth_changes"]):
        res["problems"].append("the adaptive depth never fell")
    return res


BENCH = {"num_prompts": 32, "input_len": 1024, "output_len": 128, "max_concurrency": 8}


def bench_serve(work: Path, ckpt: Path, port: int, cli: list[str] = VLLM_CLI) -> dict[str, Any]:
    """``vllm bench serve`` on the random dataset against the running server."""
    argv = [
        *cli,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(ckpt),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(BENCH["input_len"]),
        "--random-output-len",
        str(BENCH["output_len"]),
        "--num-prompts",
        str(BENCH["num_prompts"]),
        "--max-concurrency",
        str(BENCH["max_concurrency"]),
        "--ignore-eos",
        "--seed",
        "0",
        "--save-result",
        "--result-dir",
        str(work),
        "--result-filename",
        "bench.json",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    (work / "bench.log").write_text(proc.stdout + proc.stderr)
    out: dict[str, Any] = {"command": as_typed(argv, cli), "rc": proc.returncode}
    if proc.returncode == 0 and (work / "bench.json").is_file():
        data = json.loads((work / "bench.json").read_text())
        keep = (
            "completed",
            "total_input_tokens",
            "total_output_tokens",
            "duration",
            "request_throughput",
            "output_throughput",
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_tpot_ms",
            "p99_tpot_ms",
            "median_itl_ms",
        )
        out |= {k: data[k] for k in keep if k in data}
    else:
        out["tail"] = (proc.stdout + proc.stderr)[-2000:]
    return out


def run_all(args: argparse.Namespace) -> int:
    import provenance

    t0 = time.time()
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    ckpt = phase_checkpoint(work)
    if args.phase == "offline":
        ref = phase_offline(work, ckpt)
        print(json.dumps({"offline_start_s": ref["start_s"]}))
        return 0
    # the offline engine in its own process: its GPU memory is free before the server starts.
    # It may use the whole call: a call that ends before the server answers leaves
    # offline.json in --work, and the next call on the same machine starts at the server.
    if not (work / "offline.json").is_file():
        subprocess.run(
            [sys.executable, __file__, "offline", "--work", str(work)],
            check=True,
            timeout=max(60.0, args.deadline_s - (time.time() - t0) - 20),
        )
    ref = json.loads((work / "offline.json").read_text())
    left = args.deadline_s - (time.time() - t0)
    cli = shlex.split(args.vllm) if args.vllm else VLLM_CLI
    res = phase_serve(work, ckpt, ref, args.port, budget_s=max(60.0, left - 150), cli=cli)
    bench = res.get("bench", {})
    ok = not res["problems"] and bench.get("completed") == BENCH["num_prompts"]
    import vllm

    manifest = args.overlay_manifest
    record = {
        "kind": "serve_smoke",
        "base": vllm.__version__,
        "vllm_path": str(Path(vllm.__file__).parent),
        "overlay_manifest_sha256": (
            hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
        ),
        # how the patched vLLM got there (gpu_lease.sh serve writes it): the overlay wheels
        # pip-installed, their sha256 and the patched files checked against the overlay
        "install": (
            json.loads(args.install_record.read_text())
            if args.install_record and args.install_record.is_file()
            else None
        ),
        "vllm_command": cli,
        "what": "vllm serve of the patched vLLM answering the openai client (one GPU: TP 1, "
        "DCP 1; the DCP ranks are not exercised)",
        "ok": ok,
        "checkpoint": json.loads((ckpt / "gate_ckpt.json").read_text()),
        "settings": engine_settings(),
        "prompt_words": [len(p.split()) for p in prompts()],
        "max_tokens": MAX_TOKENS,
        "offline": ref,
        **res,
        "bench_settings": BENCH,
    }
    provenance.write_result(args.out, record)
    print(json.dumps({k: record[k] for k in ("ok", "server_start_s", "kv_pool_tokens")}))
    for p in res["problems"]:
        print("problem:", p)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phase", choices=("offline", "all"))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "serve-smoke")
    ap.add_argument("--out", type=Path, default=Path("results/serve-smoke-0.34.0.json"))
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--deadline-s", type=float, default=560.0)
    ap.add_argument(
        "--overlay-manifest",
        type=Path,
        default=Path(".gpu-overlay/MANIFEST"),
        help="the patched files' manifest (overlay-build.sh), recorded by its sha256",
    )
    ap.add_argument(
        "--vllm",
        help="the vllm command to run (default: this Python's vllm.entrypoints.cli.main)",
    )
    ap.add_argument(
        "--install-record",
        type=Path,
        help="a JSON file saying how vLLM was installed, copied into the record",
    )
    return run_all(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
