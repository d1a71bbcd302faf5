# SPDX-License-Identifier: Apache-2.0
"""evidence/tree_tests_record.py: a lease's vLLM-tree test logs as one record."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EVIDENCE))

import tree_tests_record as ttr  # noqa: E402

FINISHED = """== tests/a/test_one.py
collecting ... collected 3 items

tests/a/test_one.py::test_x PASSED [ 33%]
tests/a/test_one.py::test_y[1] PASSED [ 66%]
tests/a/test_one.py::test_y[2] SKIPPED [100%]
==================== 2 passed, 1 skipped, 17 warnings in 4.10s ====================
== tests/a/test_one.py: rc=0 (conftest, 20 s)
"""
CUT = """== tests/b/test_two.py
collecting ... collected 9 items

tests/b/test_two.py::test_a PASSED [ 10%]
tests/b/test_two.py::test_b[3] == tests/b/test_two.py: rc=124 (conftest, 200 s)
"""
NOT_RUN = "== tests/c/test_three.py: not run (stage time out)\n"
FAILED = """== tests/d/test_four.py
tests/d/test_four.py::test_z FAILED [100%]
==================== 1 failed in 1.00s ====================
== tests/d/test_four.py: rc=1 (conftest, 9 s)
"""


def test_each_file_is_finished_cut_or_not_run():
    files = ttr.parse(FINISHED + CUT + NOT_RUN)
    assert files["tests/a/test_one.py"] == {
        "status": "finished",
        "rc": 0,
        "counts": {"passed": 2, "skipped": 1},
        "cut_in": None,
    }
    cut = files["tests/b/test_two.py"]
    assert cut["status"] == "cut" and cut["rc"] == 124
    assert cut["cut_in"] == "tests/b/test_two.py::test_b[3]"
    assert cut["counts"] == {"passed": 1}  # the outcomes its verbose lines reached
    assert files["tests/c/test_three.py"]["status"] == "not run"


def test_the_run_that_went_furthest_is_kept():
    """A file cut or not run in one log and finished in another keeps the finished run,
    whatever the order of the logs."""
    first = ttr.parse(CUT.replace("tests/b/test_two.py", "tests/a/test_one.py") + NOT_RUN)
    second = ttr.parse(FINISHED + NOT_RUN.replace("tests/c/test_three.py", "tests/b/test_two.py"))
    for logs in ([first, second], [second, first]):
        merged = ttr.merge(logs)
        assert merged["tests/a/test_one.py"]["status"] == "finished"
        assert merged["tests/b/test_two.py"]["status"] == "not run"  # only "not run" there
        assert merged["tests/c/test_three.py"]["status"] == "not run"


def _lease_tgz(path: Path, log: str) -> Path:
    data = log.encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("./tree-tests/tree-tests-h200.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_record_from_lease_archives_and_a_failure_fails(tmp_path):
    out = tmp_path / "tt.json"
    a = _lease_tgz(tmp_path / "a.tgz", FINISHED + CUT)
    b = _lease_tgz(tmp_path / "b.tgz", NOT_RUN)
    argv = ["--gpu", "NVIDIA H100 80GB HBM3", "--series", "abc", "--out", str(out)]
    assert ttr.main([*argv, str(a), str(b)]) == 0
    doc = json.loads(out.read_text())
    assert doc["finished"] == ["tests/a/test_one.py"]
    assert doc["cut"] == ["tests/b/test_two.py"]
    assert doc["not_run"] == ["tests/c/test_three.py"]
    assert doc["totals"] == {"passed": 3, "skipped": 1}
    assert doc["failed"] == [] and doc["revision"] == {"series": "abc"}

    bad = tmp_path / "bad.log"
    bad.write_text(FINISHED + FAILED)
    assert ttr.main([*argv, str(bad)]) == 1
    assert json.loads(out.read_text())["failed"] == ["tests/d/test_four.py"]


def test_no_test_file_is_an_error(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    argv = ["--gpu", "x", "--out", str(tmp_path / "o.json"), str(empty)]
    assert ttr.main(argv) == 1
