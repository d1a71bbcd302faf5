"""Build an OFFLINE Hugging Face hub cache of stand-in model entries (run with the test python).

    python build_cache.py DEST        # DEST becomes an HF_HUB_CACHE directory

For every ``models/<org>--<name>/`` beside this file: ``config.json`` and
``generation_config.json`` are the model's PUBLISHED values, copied by hand; the tokenizer is
NOT the model's: it is a byte-level BPE built here with the ``tokenizers`` package (the
special tokens of ``tokenizer.toml`` at their real ids, then the 256 byte symbols, no merges).
No weights. Each snapshot also holds ``DCP_FIXTURE_README.txt`` saying so. The snapshot
revision is a fixed sha1 of a label, not a hub revision.

tests/upstream_tests.py uses this cache only when huggingface.co cannot be reached, for the
stock and the patched run alike, and says so in its output and its results.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
LABEL = "dcp-series offline fixture: published config values, stand-in tokenizer, no weights"
REVISION = hashlib.sha1(LABEL.encode()).hexdigest()
COPIED = ("config.json", "generation_config.json")
NOTE = (
    "dcp-series OFFLINE FIXTURE, not a download of {repo}.\n"
    "config.json / generation_config.json: the published values, written by hand.\n"
    "tokenizer.json: a byte-level stand-in built with `tokenizers`; NOT the real vocabulary\n"
    "(token ids and lengths differ from the real tokenizer). No weights.\n"
)


def byte_level_tokenizer(spec: dict) -> str:
    """tokenizer.json text: specials at ids 0.., then the 256 byte-level symbols, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(spec["specials"])}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(symbol, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=spec["unk"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if spec.get("add_bos"):
        bos = spec["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    tok.add_special_tokens(list(spec["specials"]))
    return tok.to_str(pretty=True)


def tokenizer_config(spec: dict) -> dict:
    return {
        "dcp_fixture": "STAND-IN byte-level tokenizer, NOT the real vocabulary",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": spec["bos"],
        "eos_token": spec["eos"],
        "unk_token": spec["unk"],
        "pad_token": spec["pad"],
        "add_bos_token": bool(spec.get("add_bos")),
        "model_max_length": int(spec["model_max_length"]),
    }


def build(dest: Path) -> list[str]:
    """Write the cache under ``dest``; returns the repo ids it holds."""
    repos = []
    for model in sorted(p for p in MODELS.iterdir() if p.is_dir()):
        repo = model.name.replace("--", "/", 1)
        entry = dest / f"models--{model.name}"
        if entry.exists():
            shutil.rmtree(entry)
        snap = entry / "snapshots" / REVISION
        snap.mkdir(parents=True)
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(REVISION)
        for name in COPIED:
            if (model / name).is_file():
                shutil.copyfile(model / name, snap / name)
        spec = tomllib.loads((model / "tokenizer.toml").read_text())
        (snap / "tokenizer.json").write_text(byte_level_tokenizer(spec))
        (snap / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(spec), indent=2) + "\n"
        )
        special = {k: spec[k] for k in ("bos", "eos", "unk", "pad")}
        (snap / "special_tokens_map.json").write_text(
            json.dumps({f"{k}_token": v for k, v in special.items()}, indent=2) + "\n"
        )
        (snap / "DCP_FIXTURE_README.txt").write_text(NOTE.format(repo=repo))
        repos.append(repo)
    return repos


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DEST")
    for repo in build(Path(sys.argv[1])):
        print(repo)
