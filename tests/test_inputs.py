"""Bytes that are not UTF-8 in series or series.lock are a clear error, not a traceback."""

from __future__ import annotations

from conftest import Workspace, patch_bytes

BASE = {"a.py": b"a\n"}
PATCH = ("vllm/0001-a.patch", patch_bytes({"a.py": (b"a\n", b"b\n")}))


def test_non_utf8_series_is_a_clear_error(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    (ws.repo / "series").write_bytes(b"# caf\xe9\nvllm/0001-a.patch\n")
    for command in ("apply", "lock"):
        assert ws.cli(command) == 1
        err = capsys.readouterr().err
        assert "series: not UTF-8" in err and "line 1" in err


def test_non_utf8_lock_is_a_clear_error(ws: Workspace, capsys) -> None:
    ws.setup(BASE, [PATCH])
    lock = ws.repo / "series.lock"
    lock.write_bytes(lock.read_bytes().replace(b'"pins"', b'"p\xffins"'))
    assert ws.cli("apply") == 1
    err = capsys.readouterr().err
    assert "series.lock: not UTF-8" in err and "hint: run patchset lock" in err
