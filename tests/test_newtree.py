"""A missing tree is unpacked by exactly one of several concurrent applies (a lock on the parent
directory), and removed again only by that process and only when its own apply failed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import Workspace, patch_bytes, write_tree
from patchset.hashing import sha256_bytes

TOOLS = str(Path(__file__).resolve().parents[1] / "tools")
BASE = {f"vllm/m{i}.py": b"".join(b"v%d = %d\n" % (j, j) for j in range(300)) for i in range(40)}
PATCH = (
    "vllm/0001-a.patch",
    patch_bytes(
        {"vllm/m0.py": (BASE["vllm/m0.py"], BASE["vllm/m0.py"].replace(b"= 7\n", b"= 8\n"))}
    ),
)


def _sdist(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"vllm-0.0.1/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def pinned(ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Workspace:
    cache = tmp_path / "cache"
    cache.mkdir()
    sdist = _sdist(BASE)
    (cache / "vllm-0.0.1.tar.gz").write_bytes(sdist)
    (ws.repo / "pins.toml").write_text(
        "schema_version = 1\n[vllm.sdist]\n"
        'requirement = "vllm==0.0.1"\nfilename = "vllm-0.0.1.tar.gz"\n'
        f'sha256 = "{sha256_bytes(sdist)}"\npip_args = []\ntop_dir = "vllm-0.0.1"\n'
        "[vllm.sdist.env]\n"
    )
    monkeypatch.setenv("PATCHSET_CACHE", str(cache))
    ws.setup(BASE, [PATCH])
    return ws


def _apply(ws: Workspace, tree: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "patchset", "-C", str(ws.repo), "apply", "--tree", str(tree)],
        env=dict(os.environ, PYTHONPATH=TOOLS),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_first_applies_unpack_once(pinned: Workspace, tmp_path: Path) -> None:
    for round_ in range(2):
        tree = tmp_path / f"fresh{round_}" / "vllm"
        runs = [_apply(pinned, tree) for _ in range(5)]
        results = [(r.wait(120), *r.communicate()) for r in runs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2, 2, 2, 2], results
        assert not any("Errno" in err for _, _, err in results), results
        assert sum("Unpacking" in out for _, out, _ in results) == 1
        assert pinned.cli("verify", "--tree", str(tree)) == 0


def test_only_the_creator_removes_the_tree_and_only_on_its_failure(
    pinned: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import patchset.fetch as fetch

    def bad_unpack(target: str, dest: Path, **_kw):
        write_tree(dest, {**BASE, "vllm/m0.py": b"not the pinned release\n"})
        return dest

    monkeypatch.setattr(fetch, "unpack_sdist", bad_unpack)
    tree = tmp_path / "t1"
    assert pinned.cli("apply", "--tree", str(tree)) == 1
    assert not tree.exists()
    # A tree this process did not create stays, whatever fails.
    write_tree(tree, {**BASE, "vllm/m0.py": b"edited\n"})
    assert pinned.cli("apply", "--tree", str(tree)) == 1
    assert (tree / "vllm/m0.py").read_bytes() == b"edited\n"
    # A created tree on which there is nothing to do is kept (nothing failed).
    (pinned.repo / "series").write_text("")
    (pinned.repo / "patches/vllm/0001-a.patch").unlink()
    assert pinned.cli("lock") == 0
    monkeypatch.setattr(fetch, "unpack_sdist", lambda t, dest, **kw: write_tree(dest, BASE))
    tree = tmp_path / "t2"
    assert pinned.cli("apply", "--tree", str(tree)) == 2
    assert (tree / "vllm/m0.py").is_file()
