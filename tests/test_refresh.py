"""refresh: the patch is rewritten from the tree, deterministically, and still applies."""

from __future__ import annotations

from conftest import Workspace, patch_bytes, snapshot
from patchset.series import load_series

BASE = {"a.py": b"".join(b"line %d\n" % i for i in range(30)), "b.py": b"b\n"}
A1 = BASE["a.py"].replace(b"line 3\n", b"line three\n")


def patches() -> list[tuple[str, bytes]]:
    return [
        ("vllm/0001-a.patch", patch_bytes({"a.py": (BASE["a.py"], A1)})),
        ("vllm/0002-b.patch", patch_bytes({"b.py": (b"b\n", b"bee\n")})),
    ]


def test_refresh_rewrites_diff_keeps_header_and_updates_lock(ws: Workspace, capsys) -> None:
    ws.setup(BASE, patches())
    patch_path = ws.repo / "patches/vllm/0001-a.patch"
    header = patch_path.read_bytes().split(b"diff --git")[0]
    assert ws.cli("apply") == 0
    edited = A1.replace(b"line 20\n", b"line twenty\n") + b"no newline"
    (ws.tree / "a.py").write_bytes(edited)
    assert ws.cli("refresh", "vllm/0001-a.patch") == 0
    data = patch_path.read_bytes()
    assert data.startswith(header) and b"+line twenty\n" in data
    assert b"\\ No newline at end of file\n" in data
    assert ws.cli("lock", "--check") == 0
    assert ws.cli("verify") == 0
    assert ws.cli("refresh", "vllm/0001-a.patch") == 2
    assert patch_path.read_bytes() == data
    # The refreshed patch applies to a fresh base tree and gives the edited bytes.
    assert ws.cli("unapply") == 0
    assert (ws.tree / "a.py").read_bytes() == BASE["a.py"]
    assert ws.cli("apply") == 0
    assert (ws.tree / "a.py").read_bytes() == edited


def test_refresh_is_deterministic_across_trees(ws: Workspace) -> None:
    ws.setup(BASE, patches())
    assert ws.cli("apply") == 0
    (ws.tree / "b.py").write_bytes(b"bee\nsecond\n")
    assert ws.cli("refresh", "vllm/0002-b.patch") == 0
    first = (ws.repo / "patches/vllm/0002-b.patch").read_bytes()
    state_first = snapshot(ws.tree)
    assert ws.cli("unapply") == 0
    assert ws.cli("apply") == 0
    assert snapshot(ws.tree) == state_first
    assert ws.cli("refresh", "vllm/0002-b.patch") == 2
    assert (ws.repo / "patches/vllm/0002-b.patch").read_bytes() == first


def test_refresh_refuses_when_a_later_applied_patch_touches_the_file(ws, capsys) -> None:
    ws.setup(
        BASE,
        patches() + [("vllm/0003-a-again.patch", patch_bytes({"a.py": (A1, A1 + b"tail\n")}))],
    )
    assert ws.cli("apply") == 0
    before = (ws.repo / "patches/vllm/0001-a.patch").read_bytes()
    assert ws.cli("refresh", "vllm/0001-a.patch") == 1
    err = capsys.readouterr().err
    assert "not the topmost applied patch" in err and "vllm/0003-a-again.patch" in err
    assert (ws.repo / "patches/vllm/0001-a.patch").read_bytes() == before


def test_refresh_of_a_new_file_writes_a_new_file_diff(ws: Workspace) -> None:
    ws.setup(BASE, [("vllm/0001-n.patch", patch_bytes({"pkg/n.py": (None, b"x\n")}))])
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/n.py").write_bytes(b"x\ny\n")
    assert ws.cli("refresh", "vllm/0001-n.patch") == 0
    (patch,) = load_series(ws.repo)
    assert patch.files[0].op == "add"
    assert ws.cli("verify") == 0
    assert ws.cli("unapply") == 0
    assert not (ws.tree / "pkg").exists()


def test_refresh_of_unedited_git_patch_reproduces_git_bytes(ws: Workspace, tmp_path) -> None:
    """For changes with one best alignment, refresh writes exactly what git format-patch wrote
    (blob ids, modes, hunk ranges and git's default function-context hunk headers)."""
    from conftest import format_patch_head, git

    source = b"".join(
        [b"import os\n", b"\n", b"\n", b"class Widget:\n"]
        + [b"    def method_%d(self):\n        return %d\n\n" % (i, i) for i in range(12)]
        + [b"def tail():\n    return 'end'\n"]
    )
    edited = source.replace(b"return 4\n", b"return 40\n").replace(b"'end'", b"'END'")
    work = tmp_path / "gitwork"
    work.mkdir()
    git(work, "init", "-q")
    (work / "pkg").mkdir()
    (work / "pkg/w.py").write_bytes(source)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "base")
    (work / "pkg/w.py").write_bytes(edited)
    (work / "pkg/new.py").write_bytes(b"x = 1")
    git(work, "add", "-A")
    git(work, "commit", "-qs", "-m", "[Test] edit", "-m", "Why.\n\nUpstream-Status: Pending")
    made = format_patch_head(work)
    assert b"@@ -39,4 +39,4 @@ class Widget:\n" in made
    ws.setup({"pkg/w.py": source}, [("vllm/0001-edit.patch", made)])
    assert ws.cli("apply") == 0
    (ws.tree / "pkg/w.py").write_bytes(edited + b"")
    assert ws.cli("refresh", "vllm/0001-edit.patch") == 2
    assert (ws.repo / "patches/vllm/0001-edit.patch").read_bytes() == made


# -- issue 32: files that drop out, symlinks, non-regular files -----------------------------


def _two_file_patch(ws: Workspace) -> tuple[dict, dict]:
    base = {**BASE, "pkg/keep.py": b"k\n"}
    ws.setup(
        base,
        [
            (
                "vllm/0001-a.patch",
                patch_bytes({"a.py": (BASE["a.py"], A1), "pkg/n.py": (None, b"n\n")}),
            )
        ],
    )
    before = snapshot(ws.tree)
    assert ws.cli("apply") == 0
    return before, snapshot(ws.tree)


def test_refresh_after_a_file_is_reverted_drops_it_and_the_state_stays_trusted(ws, capsys):
    before, _ = _two_file_patch(ws)
    (ws.tree / "a.py").write_bytes(BASE["a.py"])
    assert ws.cli("refresh", "vllm/0001-a.patch") == 0
    (patch,) = load_series(ws.repo)
    assert patch.paths == ("pkg/n.py",)
    assert ws.cli("verify") == 0, capsys.readouterr().err
    assert ws.cli("lock", "--check") == 0
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before
    assert ws.cli("apply") == 0 and ws.cli("verify") == 0


def test_refresh_after_an_added_file_is_deleted_drops_it(ws, capsys):
    before, _ = _two_file_patch(ws)
    (ws.tree / "pkg/n.py").unlink()
    assert ws.cli("refresh", "vllm/0001-a.patch") == 0
    (patch,) = load_series(ws.repo)
    assert patch.paths == ("a.py",)
    assert ws.cli("verify") == 0, capsys.readouterr().err
    assert ws.cli("unapply") == 0
    assert snapshot(ws.tree) == before
    assert ws.cli("apply") == 0 and ws.cli("verify") == 0


def test_refresh_never_reads_through_a_symlink(ws, tmp_path, capsys):
    _two_file_patch(ws)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"TOKEN=hunter2\n")
    patch_path = ws.repo / "patches/vllm/0001-a.patch"
    old_patch, old_lock = patch_path.read_bytes(), (ws.repo / "series.lock").read_bytes()
    (ws.tree / "a.py").unlink()
    (ws.tree / "a.py").symlink_to(secret)
    assert ws.cli("refresh", "vllm/0001-a.patch") == 1
    err = capsys.readouterr().err
    assert "symlink" in err, err
    assert patch_path.read_bytes() == old_patch
    assert (ws.repo / "series.lock").read_bytes() == old_lock
    assert b"hunter2" not in patch_path.read_bytes()
