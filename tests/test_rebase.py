"""rebase: 3-way replay onto a new base, per-patch verdicts, pinning, and the written series."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from conftest import patch_bytes, snapshot, write_tree
from patchset.errors import HashMismatch, PatchsetError, PinError
from patchset.hashing import sha256_bytes
from patchset.lockfile import load_lock
from patchset.pins import Pin, load_pins
from patchset.rebase import (
    diff_blocks,
    fetch_release,
    parse_onto,
    release_pins,
    replay,
    rewrite_pins,
    run_rebase,
)
from patchset.series import load_series, parse_patch

LINES = b"".join(b"line %d\n" % i for i in range(1, 61))


def edit(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, old
    return data.replace(old, new)


def outcomes_for(tmp_path: Path, old: dict, new: dict, patches: list[tuple[str, bytes]]):
    write_tree(tmp_path / "old", old)
    write_tree(tmp_path / "new", new)
    parsed = []
    for name, data in patches:
        patch, problems = parse_patch(name, data)
        assert patch is not None, problems
        parsed.append(patch)
    results = replay(parsed, dict(patches), tmp_path / "old", tmp_path / "new", tmp_path / "work")
    return {o.name: o for o in results}


ONE = LINES
P_FIVE = patch_bytes({"a.py": (ONE, edit(ONE, b"line 5\n", b"five\n"))}, subject="[Core] A")
P_THIRTY = patch_bytes({"a.py": (ONE, edit(ONE, b"line 30\n", b"thirty\n"))}, subject="[Core] B")


def test_untouched_file_replays_clean(tmp_path: Path) -> None:
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE, "b.py": b"b\n"},
        {"a.py": ONE, "b.py": b"c\n"},
        [("vllm/0001-a.patch", P_FIVE)],
    )["vllm/0001-a.patch"]
    assert out.status == "clean" and out.offsets == ()
    assert out.refreshed is not None and b"+five\n" in out.refreshed


def test_moved_hunk_is_reported_as_offsets_and_refreshed(tmp_path: Path) -> None:
    moved = b"new 1\nnew 2\nnew 3\n" + ONE
    out = outcomes_for(tmp_path, {"a.py": ONE}, {"a.py": moved}, [("vllm/0001-b.patch", P_THIRTY)])
    result = out["vllm/0001-b.patch"]
    assert result.status == "offsets"
    assert result.offsets == (("a.py", 1, 3),)
    assert result.refreshed is not None
    refreshed, _ = parse_patch("vllm/0001-b.patch", result.refreshed)
    assert refreshed is not None and refreshed.files[0].hunks[0].old_start == 30
    assert refreshed.header.subject == "[PATCH] [Core] B"
    assert refreshed.header.upstream_status == "Pending"


def test_changed_context_merges_three_way(tmp_path: Path) -> None:
    near = edit(ONE, b"line 27\n", b"line 27 upstream\n")
    out = outcomes_for(tmp_path, {"a.py": ONE}, {"a.py": near}, [("vllm/0001-b.patch", P_THIRTY)])
    result = out["vllm/0001-b.patch"]
    assert result.status == "merged"
    assert result.refreshed is not None
    assert b" line 27 upstream\n" in result.refreshed and b"+thirty\n" in result.refreshed


def test_same_line_changed_upstream_is_a_conflict_and_replay_goes_on(tmp_path: Path) -> None:
    clash = edit(ONE, b"line 5\n", b"line 5 upstream\n")
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE},
        {"a.py": clash},
        [("vllm/0001-a.patch", P_FIVE), ("vllm/0002-b.patch", P_THIRTY)],
    )
    conflict = out["vllm/0001-a.patch"]
    assert conflict.status == "conflict"
    assert [(c.path, c.kind, c.regions) for c in conflict.conflicts] == [
        ("a.py", "both modified", 1)
    ]
    assert conflict.conflicts[0].failed_hunks_at == (2,)
    assert b"<<<<<<<" in conflict.marked["a.py"] and b"five\n" in conflict.marked["a.py"]
    assert out["vllm/0002-b.patch"].status == "clean"


def test_file_deleted_upstream_is_a_modify_delete_conflict(tmp_path: Path) -> None:
    out = outcomes_for(
        tmp_path, {"a.py": ONE, "b.py": b"b\n"}, {"b.py": b"b\n"}, [("vllm/0001-a.patch", P_FIVE)]
    )["vllm/0001-a.patch"]
    assert out.status == "conflict"
    assert [(c.path, c.kind, c.regions) for c in out.conflicts] == [
        ("a.py", "deleted in the new base, modified by the patch", 0)
    ]


def test_patch_depending_on_a_conflict_says_so(tmp_path: Path) -> None:
    five = edit(ONE, b"line 5\n", b"five\n")
    on_top = patch_bytes(
        {"a.py": (five, edit(five, b"five\n", b"FIVE\n"))},
        subject="[Core] On top",
        depends=("vllm/0001-a.patch",),
    )
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE},
        {"a.py": edit(ONE, b"line 5\n", b"line 5 upstream\n")},
        [("vllm/0001-a.patch", P_FIVE), ("vllm/0002-b.patch", on_top)],
    )["vllm/0002-b.patch"]
    assert out.status == "conflict"
    assert out.detail[0] == "depends on vllm/0001-a.patch, which conflicts"


def test_file_added_by_a_conflicting_patch_is_named_as_such(tmp_path: Path) -> None:
    adds = patch_bytes(
        {"a.py": (ONE, edit(ONE, b"line 5\n", b"five\n")), "n.py": (None, ONE)},
        subject="[Core] Adds n",
    )
    uses = patch_bytes({"n.py": (ONE, edit(ONE, b"line 9\n", b"nine\n"))}, subject="[Core] n")
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE},
        {"a.py": edit(ONE, b"line 5\n", b"line 5 upstream\n")},
        [("vllm/0001-adds.patch", adds), ("vllm/0002-uses.patch", uses)],
    )["vllm/0002-uses.patch"]
    assert out.status == "conflict"
    assert [c.kind for c in out.conflicts] == [
        "not in the new base: an earlier patch added it and did not carry over"
    ]


def test_change_already_upstream_is_absorbed(tmp_path: Path) -> None:
    new_file = patch_bytes({"n.py": (None, b"n = 1\n")}, subject="[Core] New")
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE},
        {"a.py": edit(ONE, b"line 5\n", b"five\n"), "n.py": b"n = 1\n"},
        [("vllm/0001-a.patch", P_FIVE), ("vllm/0002-n.patch", new_file)],
    )
    assert out["vllm/0001-a.patch"].status == "absorbed"
    assert out["vllm/0001-a.patch"].absorbed_files == ("a.py",)
    assert out["vllm/0002-n.patch"].status == "absorbed"


def test_partly_absorbed_patch_names_the_absorbed_file(tmp_path: Path) -> None:
    both = patch_bytes(
        {
            "a.py": (ONE, edit(ONE, b"line 5\n", b"five\n")),
            "b.py": (ONE, edit(ONE, b"line 9\n", b"nine\n")),
        },
        subject="[Core] Both",
    )
    out = outcomes_for(
        tmp_path,
        {"a.py": ONE, "b.py": ONE},
        {"a.py": edit(ONE, b"line 5\n", b"five\n"), "b.py": ONE},
        [("vllm/0001-both.patch", both)],
    )["vllm/0001-both.patch"]
    assert out.absorbed_files == ("a.py",)
    assert out.status == "merged"
    assert out.refreshed is not None and b"a/a.py" not in out.refreshed


def test_patch_that_does_not_apply_to_the_old_base_is_refused(tmp_path: Path) -> None:
    broken = patch_bytes({"a.py": (b"other\n", b"x\n")}, subject="[Core] X")
    with pytest.raises(PatchsetError, match="does not apply to the current base"):
        outcomes_for(tmp_path, {"a.py": ONE}, {"a.py": ONE}, [("vllm/0001-x.patch", broken)])


def test_diff_blocks_splits_per_file() -> None:
    data = patch_bytes({"a.py": (b"a\n", b"b\n"), "z/c.py": (None, b"c\n")})
    blocks = diff_blocks(data)
    assert sorted(blocks) == ["a.py", "z/c.py"]
    assert all(block.startswith(b"diff --git a/") for block in blocks.values())


def test_parse_onto() -> None:
    assert parse_onto("vllm==0.33.0") == ("vllm", "0.33.0")
    with pytest.raises(PatchsetError, match="expected <target>==<version>"):
        parse_onto("vllm>=0.33")


OLD_PIN = Pin(
    target="vllm",
    kind="sdist",
    requirement="vllm==1.0.0",
    filename="vllm-1.0.0.tar.gz",
    sha256="a" * 64,
    pip_args=("--no-binary", "vllm"),
    env=(("VLLM_TARGET_DEVICE", "empty"), ("VLLM_VERSION_OVERRIDE", "1.0.0")),
    top_dir="vllm-1.0.0",
)


def test_release_pin_follows_the_old_pin() -> None:
    pin = release_pins(OLD_PIN, "2.0.0")
    assert (pin.requirement, pin.filename, pin.top_dir) == (
        "vllm==2.0.0",
        "vllm-2.0.0.tar.gz",
        "vllm-2.0.0",
    )
    assert dict(pin.env) == {"VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": "2.0.0"}


def test_fetched_release_is_pinned_then_rehashed(tmp_path: Path) -> None:
    pin = release_pins(OLD_PIN, "2.0.0")
    calls = []

    def pip(args, env) -> None:
        calls.append((list(args), dict(env)))
        dest = Path(args[args.index("--dest") + 1])
        (dest / "vllm-2.0.0.tar.gz").write_bytes(made)

    made = sdist_bytes("vllm-2.0.0", {"a.py": ONE})
    path, digest = fetch_release(pin, tmp_path / "cache", pip=pip)
    assert digest == sha256_bytes(made)
    assert calls[0][0][-1] == "vllm==2.0.0"
    assert calls[0][1]["VLLM_VERSION_OVERRIDE"] == "2.0.0"
    assert fetch_release(pin, tmp_path / "cache", pip=pip) == (path, digest)
    assert len(calls) == 1
    path.write_bytes(b"tampered")
    with pytest.raises(HashMismatch, match="pinned when it was fetched"):
        fetch_release(pin, tmp_path / "cache", pip=pip)
    assert not path.exists()


PINS = """# test pins
schema_version = 1

[vllm.sdist]
requirement = "vllm==1.0.0"
filename = "vllm-1.0.0.tar.gz"
sha256 = "{sdist}"
pip_args = ["--no-binary", "vllm"]
top_dir = "vllm-1.0.0"

[vllm.sdist.env]
VLLM_TARGET_DEVICE = "empty"
VLLM_VERSION_OVERRIDE = "1.0.0"

[vllm.wheel]
requirement = "vllm==1.0.0"
filename = "vllm-1.0.0-py3-none-any.whl"
sha256 = "{wheel}"
pip_args = ["--only-binary=:all:"]

[vllm.wheel.env]
"""


def test_rewrite_pins_keeps_comments_and_other_tables() -> None:
    text = PINS.format(sdist="a" * 64, wheel="b" * 64)
    out = rewrite_pins(
        text,
        "vllm",
        {
            "sdist": {"sha256": "c" * 64, "requirement": "vllm==2.0.0"},
            "sdist.env": {"VLLM_VERSION_OVERRIDE": "2.0.0"},
        },
    )
    assert out.startswith("# test pins\n")
    assert f'sha256 = "{"c" * 64}"' in out and f'sha256 = "{"b" * 64}"' in out
    assert 'VLLM_VERSION_OVERRIDE = "2.0.0"' in out
    with pytest.raises(PatchsetError, match="no \\[vllm.wheel\\] top_dir"):
        rewrite_pins(text, "vllm", {"wheel": {"top_dir": "x"}})


def sdist_bytes(top: str, files: dict[str, bytes], version: str | None = None) -> bytes:
    """An sdist: ``files`` under ``top/`` and a PKG-INFO naming ``version`` (default: the
    version in ``top``)."""
    version = version or top.rsplit("-", 1)[-1]
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode(),
        **files,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def rebase_workspace(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A checkout with three patches: one clean, one conflicting, one absorbed upstream."""
    root = tmp_path / "repo"
    old = tmp_path / "old"
    base = {"a.py": ONE, "b.py": ONE}
    write_tree(old, base)
    clean = patch_bytes({"b.py": (ONE, edit(ONE, b"line 40\n", b"forty\n"))}, subject="[Core] C")
    absorbed = patch_bytes({"a.py": (ONE, edit(ONE, b"line 50\n", b"fifty\n"))}, subject="[Core] D")
    patches = [
        ("vllm/0001-clean.patch", clean),
        ("vllm/0002-conflict.patch", P_FIVE),
        ("vllm/0003-absorbed.patch", absorbed),
    ]
    write_tree(root, {f"patches/{n}": d for n, d in patches})
    (root / "series").write_text("# series\n" + "".join(f"{n}\n" for n, _ in patches))
    (root / "pins.toml").write_text(PINS.format(sdist="a" * 64, wheel="b" * 64))
    new = edit(edit(ONE, b"line 5\n", b"line 5 upstream\n"), b"line 50\n", b"fifty\n")
    sdist = tmp_path / "vllm-2.0.0.tar.gz"
    sdist.write_bytes(sdist_bytes("vllm-2.0.0", {"a.py": new, "b.py": ONE}))
    wheel = tmp_path / "vllm-2.0.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    return root, old, sdist, wheel


def test_dry_run_reports_and_never_modifies_the_series(tmp_path: Path, monkeypatch) -> None:
    root, old, sdist, _ = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    before = snapshot(root)
    report = run_rebase(
        root, "vllm==2.0.0", dry_run=True, sdist=sdist, old_tree=old, workdir=tmp_path
    )
    assert snapshot(root) == before
    assert [(o.name, o.status) for o in report.outcomes] == [
        ("vllm/0001-clean.patch", "clean"),
        ("vllm/0002-conflict.patch", "conflict"),
        ("vllm/0003-absorbed.patch", "absorbed"),
    ]
    assert report.new.sha256 == sha256_bytes(sdist.read_bytes())
    data = report.to_json()
    assert data["summary"] == {"clean": 1, "offsets": 0, "merged": 0, "conflict": 1, "absorbed": 1}
    assert json.loads(json.dumps(data)) == data
    assert not any(p.name.startswith("rebase-") for p in tmp_path.iterdir())


def test_rebase_writes_a_new_series_directory(tmp_path: Path, monkeypatch) -> None:
    root, old, sdist, wheel = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    before = snapshot(root)
    dest = tmp_path / "rebased"
    run_rebase(
        root,
        "vllm==2.0.0",
        dry_run=False,
        dest=dest,
        sdist=sdist,
        wheel=wheel,
        old_tree=old,
        workdir=tmp_path,
    )
    assert snapshot(root) == before
    series_text = (dest / "series").read_text()
    assert "vllm/0001-clean.patch\n" in series_text
    assert "# conflict, left out: vllm/0002-conflict.patch" in series_text
    assert "# absorbed upstream, dropped: vllm/0003-absorbed.patch" in series_text
    assert [p.name for p in load_series_ok(dest)] == ["vllm/0001-clean.patch"]
    marked = dest / "conflicts" / "vllm" / "0002-conflict" / "files" / "a.py"
    assert b"<<<<<<<" in marked.read_bytes()
    assert (dest / "conflicts" / "vllm" / "0002-conflict" / "original.patch").read_bytes() == P_FIVE
    pins = load_pins(dest / "pins.toml")
    assert pins.get("vllm", "sdist").sha256 == sha256_bytes(sdist.read_bytes())
    assert pins.get("vllm", "sdist").top_dir == "vllm-2.0.0"
    assert pins.get("vllm", "wheel").filename == "vllm-2.0.0-py3-none-any.whl"
    assert pins.get("vllm", "wheel").sha256 == sha256_bytes(wheel.read_bytes())
    lock = load_lock(dest)
    assert [e.name for e in lock.patches] == ["vllm/0001-clean.patch"]
    assert lock.pins["vllm.sdist"] == sha256_bytes(sdist.read_bytes())
    with pytest.raises(PatchsetError, match="refusing to write"):
        run_rebase(
            root, "vllm==2.0.0", dry_run=False, dest=dest, sdist=sdist, wheel=wheel, old_tree=old
        )


def load_series_ok(root: Path):
    # the patches/ directory keeps only listed patches, so the series loads cleanly
    return load_series(root)


def test_cli_rebase_dry_run_writes_only_the_json_report(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from patchset.cli import main

    root, old, sdist, _ = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    # the pristine base of the pin comes from the cache: seed it with the old tree's sdist
    old_sdist = sdist_bytes("vllm-1.0.0", {"a.py": ONE, "b.py": ONE})
    text = PINS.format(sdist=sha256_bytes(old_sdist), wheel="b" * 64)
    (root / "pins.toml").write_text(text)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "vllm-1.0.0.tar.gz").write_bytes(old_sdist)
    before = snapshot(root)
    report = tmp_path / "report.json"
    code = main(
        [
            "-C",
            str(root),
            "rebase",
            "--onto",
            "vllm==2.0.0",
            "--dry-run",
            "--sdist",
            str(sdist),
            "--json",
            str(report),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "vllm 1.0.0 -> 2.0.0: 1 clean, 1 conflict, 1 absorbed" in printed
    data = json.loads(report.read_text())
    assert [p["status"] for p in data["patches"]] == ["clean", "conflict", "absorbed"]
    after = snapshot(root)
    # only the pristine unpack of the pinned base under build/ may appear
    assert {k: v for k, v in after.items() if not k.startswith("build")} == before


# -- issue 32: every sdist given is checked against the requested version ---------------------


def test_an_sdist_of_another_version_is_refused_whatever_its_top_folder(
    tmp_path: Path, monkeypatch
) -> None:
    root, old, sdist, _ = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    renamed = tmp_path / "renamed" / "vllm-2.0.0.tar.gz"
    renamed.parent.mkdir()
    renamed.write_bytes(sdist_bytes("vllm-2.0.0", {"a.py": ONE, "b.py": ONE}, version="1.5.0"))
    with pytest.raises(PatchsetError, match="PKG-INFO.*1.5.0"):
        run_rebase(root, "vllm==2.0.0", dry_run=True, sdist=renamed, old_tree=old, workdir=tmp_path)
    other_top = tmp_path / "top" / "vllm-2.0.0.tar.gz"
    other_top.parent.mkdir()
    other_top.write_bytes(sdist_bytes("vllm-1.5.0", {"a.py": ONE}, version="2.0.0"))
    with pytest.raises(PatchsetError, match="top folder"):
        run_rebase(
            root, "vllm==2.0.0", dry_run=True, sdist=other_top, old_tree=old, workdir=tmp_path
        )
    # nothing wrong stays cached: the correct file given next is the one used
    report = run_rebase(
        root, "vllm==2.0.0", dry_run=True, sdist=sdist, old_tree=old, workdir=tmp_path
    )
    assert report.new.sha256 == sha256_bytes(sdist.read_bytes())


def test_a_cached_sdist_is_not_used_over_a_different_file_given(tmp_path: Path, monkeypatch):
    root, old, sdist, _ = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    first = run_rebase(
        root, "vllm==2.0.0", dry_run=True, sdist=sdist, old_tree=old, workdir=tmp_path
    )
    again = tmp_path / "again" / "vllm-2.0.0.tar.gz"
    again.parent.mkdir()
    again.write_bytes(sdist_bytes("vllm-2.0.0", {"a.py": ONE, "b.py": ONE + b"more\n"}))
    second = run_rebase(
        root, "vllm==2.0.0", dry_run=True, sdist=again, old_tree=old, workdir=tmp_path
    )
    assert first.new.sha256 != second.new.sha256 == sha256_bytes(again.read_bytes())
    stamp = json.loads((tmp_path / "cache/rebase/vllm-2.0.0.tar.gz.check.json").read_text())
    assert stamp == {"sha256": second.new.sha256, "top_dir": "vllm-2.0.0", "version": "2.0.0"}


def _sdist_with_a_link(top: str) -> bytes:
    buf = io.BytesIO(sdist_bytes(top, {"a.py": ONE}))
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue()), mode="r:gz") as src:
        members = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src]  # type: ignore[union-attr]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
        link = tarfile.TarInfo(f"{top}/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    return out.getvalue()


def test_an_sdist_the_unpack_refuses_is_never_cached(tmp_path: Path) -> None:
    """B8r: an sdist with the right top folder and version but a symlink member passed the
    check, was cached with a valid stamp, and every later run failed at the unpack."""
    pin = release_pins(OLD_PIN, "2.0.0")
    bad = _sdist_with_a_link("vllm-2.0.0")

    def pip(args, env) -> None:
        (Path(args[args.index("--dest") + 1]) / "vllm-2.0.0.tar.gz").write_bytes(bad)

    cache = tmp_path / "cache"
    with pytest.raises(PinError, match="unsafe member") as caught:
        fetch_release(pin, cache, pip=pip)
    assert any("escape" in d for d in caught.value.details)
    assert [p.name for p in cache.iterdir()] == []


def test_a_bad_cached_sdist_without_a_stamp_is_named_and_deleted(tmp_path: Path) -> None:
    """B8r: a cached file without a stamp that fails the check was named by a deleted temporary
    path with a hint about pip, and failed every run; now it is named, deleted, and the next
    run downloads."""
    pin = release_pins(OLD_PIN, "2.0.0")
    cache = tmp_path / "cache"
    cache.mkdir()
    cached = cache / "vllm-2.0.0.tar.gz"
    cached.write_bytes(sdist_bytes("vllm-2.0.0", {"a.py": ONE}, version="1.9.0"))
    good = sdist_bytes("vllm-2.0.0", {"a.py": ONE})

    def pip(args, env) -> None:
        (Path(args[args.index("--dest") + 1]) / "vllm-2.0.0.tar.gz").write_bytes(good)

    with pytest.raises(PinError) as caught:
        fetch_release(pin, cache, pip=pip)
    assert str(cached) in caught.value.message and "deleted the cached" in caught.value.message
    assert not cached.exists()
    assert fetch_release(pin, cache, pip=pip)[1] == sha256_bytes(good)


# -- issue 32: output directories that would break the series; a full disk while writing ------


def test_rebase_and_export_refuse_a_destination_inside_patches(tmp_path: Path, monkeypatch, capsys):
    from patchset.cli import main

    root, old, sdist, wheel = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))
    before = snapshot(root)
    with pytest.raises(PatchsetError, match="inside .*patches"):
        run_rebase(
            root,
            "vllm==2.0.0",
            dry_run=False,
            dest=root / "patches" / "rebased",
            sdist=sdist,
            wheel=wheel,
            old_tree=old,
            workdir=tmp_path,
        )
    assert main(["-C", str(root), "export", "--to", str(root / "patches" / "out")]) == 1
    assert "inside" in capsys.readouterr().err
    assert snapshot(root) == before
    load_series(root)  # still readable


def test_a_full_disk_while_writing_the_rebase_leaves_no_directory(tmp_path: Path, monkeypatch):
    import errno

    import patchset.lockfile as lockfile

    root, old, sdist, wheel = rebase_workspace(tmp_path)
    monkeypatch.setenv("PATCHSET_CACHE", str(tmp_path / "cache"))

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lockfile, "write_lock", full)
    dest = tmp_path / "rebased"
    with pytest.raises(OSError):
        run_rebase(
            root,
            "vllm==2.0.0",
            dry_run=False,
            dest=dest,
            sdist=sdist,
            wheel=wheel,
            old_tree=old,
            workdir=tmp_path,
        )
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rebased")]
