"""Outputs never land in the series, never follow a planted link, and are whole or absent
(issue 48: N1, N2, N10, B12r)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import snapshot
from patchset.cli import main
from patchset.errors import PatchsetError
from patchset.outputs import replace_dir, write_file_atomic
from test_export import two_patch_repo


def test_export_never_writes_through_a_symlinked_target_folder(
    tmp_path: Path, git_user: str
) -> None:
    """`<to>/vllm` planted as a symlink into patches/: the export replaces the folder with a real
    one and patches/ is untouched (N1: the mboxes were written into patches/)."""
    root, _base = two_patch_repo(tmp_path, declare=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "vllm").symlink_to(root / "patches" / "vllm")
    before = snapshot(root / "patches")
    assert main(["-C", str(root), "export", "--to", str(out)]) == 0
    assert snapshot(root / "patches") == before
    assert not (out / "vllm").is_symlink()
    assert sorted(p.name for p in (out / "vllm").iterdir()) == [
        "0001-one.mbox",
        "0001-one.pr.md",
        "0002-two.mbox",
        "0002-two.pr.md",
        "0003-three.mbox",
        "0003-three.pr.md",
        "series.mbox",
    ]


def test_a_second_export_holds_only_its_own_files(tmp_path: Path, git_user: str) -> None:
    """Exporting one patch after all three leaves that one's files, not a mix of two runs."""
    root, _base = two_patch_repo(tmp_path, declare=True)
    out = tmp_path / "out"
    assert main(["-C", str(root), "export", "--to", str(out)]) == 0
    assert main(["-C", str(root), "export", "--to", str(out), "vllm/0003-three.patch"]) == 0
    assert sorted(p.name for p in (out / "vllm").iterdir()) == [
        "0003-three.mbox",
        "0003-three.pr.md",
        "series.mbox",
    ]


def test_a_killed_export_leaves_the_previous_run_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that dies half way (N10: a kill, a full disk) leaves the old directory exactly
    as it was; the next run removes the leftovers and swaps its own in."""
    dest = tmp_path / "export"
    replace_dir(dest, {"vllm/a.mbox": b"old a\n", "vllm/series.mbox": b"old\n"})
    before = snapshot(dest)
    real_open = open
    written: list[str] = []

    def dying_open(path, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if "x" in mode:
            if written:
                raise OSError(28, "No space left on device")
            written.append(str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", dying_open)
    with pytest.raises(OSError):
        replace_dir(dest, {"vllm/a.mbox": b"new a\n", "vllm/b.mbox": b"new b\n"})
    monkeypatch.undo()
    assert snapshot(dest) == before
    replace_dir(dest, {"vllm/b.mbox": b"new b\n"})
    assert os.listdir(dest) == ["vllm"] and os.listdir(dest / "vllm") == ["b.mbox"]
    assert (dest / "vllm" / "b.mbox").read_bytes() == b"new b\n"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no staging left


def test_a_planted_link_at_a_temporary_name_is_never_followed(tmp_path: Path) -> None:
    """The temporary file is a new random name (O_EXCL): a symlink planted where the old fixed
    name was (`.<name>.tmp`) does not carry the write elsewhere (N1)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep\n")
    out = tmp_path / "dist"
    out.mkdir()
    (out / ".check.json.tmp").symlink_to(victim)
    write_file_atomic(out / "check.json", b"{}\n")
    assert victim.read_bytes() == b"keep\n"
    assert (out / "check.json").read_bytes() == b"{}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["wheel", "--out", "patches/vllm/wheels"],
        ["apply", "--tree", "patches/vllm/tree"],
        ["rebase", "--onto", "vllm==2.0.0", "--dry-run", "--json", "patches/report.json"],
        ["export", "--to", "dist/x", "--json", "patches/check.json"],
    ],
    ids=["wheel-out", "apply-tree", "rebase-json", "export-json"],
)
def test_an_output_inside_patches_is_refused_before_anything_is_written(
    tmp_path: Path, git_user: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """N2 / B12r: these wrote into patches/ and every later command refused the series."""
    root, _base = two_patch_repo(tmp_path, declare=True)
    before = snapshot(root)
    argv = [str(root / a) if a.startswith(("patches/", "dist/")) else a for a in argv]
    assert main(["-C", str(root), *argv]) == 1
    assert "is inside" in capsys.readouterr().err
    assert snapshot(root) == before


def test_an_output_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(PatchsetError, match="is a symlink"):
        replace_dir(tmp_path / "link", {"a": b"x"})
