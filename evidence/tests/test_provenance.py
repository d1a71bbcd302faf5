# SPDX-License-Identifier: Apache-2.0
"""evidence/provenance.py: what every result file records about where it came from."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import provenance  # noqa: E402


def test_the_revision_is_the_checkout_unless_the_device_copy_names_it(monkeypatch) -> None:
    monkeypatch.delenv("DCP_GIT_REV", raising=False)
    rev = provenance.git_revision()
    assert rev is not None and len(rev) == 40
    monkeypatch.setenv("DCP_GIT_REV", "abc1234")
    assert provenance.git_revision() == "abc1234"
    assert provenance.git_revision(Path("/")) != "abc1234"  # another tree: never the override


def test_write_result_fills_in_what_a_record_lacks_and_keeps_what_it_has(tmp_path: Path) -> None:
    path = provenance.write_result(tmp_path / "a" / "r.json", {"figure": 1.5}, gpus=False)
    got = json.loads(path.read_text())
    assert got["figure"] == 1.5 and got["command"] and got["git_revision"]
    assert got["machine"]["python"] and "gpus" not in got["machine"]
    kept = {"command": "x", "revision": {"series": "y"}, "machine": {"gpu": "z"}}
    got = json.loads(provenance.write_result(tmp_path / "k.json", dict(kept)).read_text())
    assert got == kept


def test_load_module_imports_a_file_once_under_its_name(tmp_path: Path) -> None:
    leaf = tmp_path / "leaf.py"
    leaf.write_text("from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int = 1\n")
    mod = provenance.load_module(leaf, "provenance_test_leaf")
    assert mod.P().x == 1 and sys.modules["provenance_test_leaf"] is mod
    assert provenance.load_module(leaf, "provenance_test_leaf") is mod


def test_atomic_write_leaves_only_the_file(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "r.json"
    provenance.write_json_atomic(out, {"b": 1, "a": float("inf")})
    assert json.loads(out.read_text().replace("Infinity", "1e999"))["b"] == 1
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]


def test_the_command_names_the_interpreter_and_the_script_without_their_folders(
    monkeypatch, tmp_path: Path
) -> None:
    script = Path(provenance.__file__).resolve().parent / "dcp_gate.py"
    monkeypatch.setattr(sys, "executable", "/some/venv/bin/python3")
    monkeypatch.setattr(sys, "argv", [str(script), "report", "--note", "two words"])
    assert provenance.command() == "python3 evidence/dcp_gate.py report --note 'two words'"
    # a relative script path, one outside the repository and `python -c` are kept as given
    assert provenance.command(["evidence/x.py", "-v"]) == "python3 evidence/x.py -v"
    assert provenance.command(["/elsewhere/x.py"]) == "python3 /elsewhere/x.py"
    assert provenance.command(["-c"]) == "python3 -c"
    record = json.loads(provenance.write_result(tmp_path / "r.json", {}, gpus=False).read_text())
    assert record["command"].startswith("python3 evidence/dcp_gate.py ")
