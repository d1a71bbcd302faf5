"""dist/receipt.json: canonical JSON naming the bases, the series and every overlaid file."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from patchset import __version__
from patchset.model import Patch, PatchHeader
from patchset.pins import Pin
from patchset.receipt import SCHEMA_VERSION, dumps, make_receipt, read_receipt, write_receipt
from patchset.wheel import BuiltWheel, Overlay, OverlayFile, series_digest

SDIST = Pin("vllm", "sdist", "vllm==0.26.0", "vllm-0.26.0.tar.gz", "1" * 64, top_dir="vllm-0.26.0")
WHEEL = Pin("vllm", "wheel", "vllm==0.26.0", "vllm-0.26.0-cp38-abi3-any.whl", "2" * 64)
HEADER = PatchHeader("0" * 40, "dcp-series", "date", "[Test] x", "desc", ())


def _receipt(files: list[OverlayFile], not_carried: tuple[str, ...] = ()) -> dict[str, object]:
    patches = (Patch("vllm/0001-a.patch", "3" * 64, HEADER, b"", ()),)
    digest = series_digest(patches)
    built = BuiltWheel(
        path=Path("/dist") / f"vllm-0.26.0+dcp.{digest[:12]}-cp38-abi3-any.whl",
        sha256="4" * 64,
        version=f"0.26.0+dcp.{digest[:12]}",
        base_version="0.26.0",
        overlay=Overlay(tuple(files), not_carried),
    )
    return make_receipt(
        built, sdist_pin=SDIST, wheel_pin=WHEEL, patches=patches, series_digest=digest
    )


_files = st.lists(
    st.builds(
        OverlayFile,
        path=st.from_regex(r"vllm/[a-z_/]{1,20}\.py", fullmatch=True),
        op=st.sampled_from(["modify", "add", "delete"]),
        sha256=st.none() | st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
        patches=st.just(("vllm/0001-a.patch",)),
    ),
    unique_by=lambda f: f.path,
    max_size=8,
)


def test_receipt_names_bases_series_wheel_and_tool() -> None:
    """The receipt carries the schema version, both base sha256s, the series digest and
    patches, the built wheel's name/sha256/version, each overlaid file, and the tool version."""
    files = [OverlayFile("vllm/a.py", "modify", "5" * 64, ("vllm/0001-a.patch",))]
    receipt = _receipt(files, ("tests/test_a.py",))
    assert receipt["schema_version"] == SCHEMA_VERSION
    assert receipt["tool"] == {"name": "patchset", "version": __version__}
    assert receipt["base"] == {
        "sdist": {"filename": SDIST.filename, "sha256": SDIST.sha256},
        "wheel": {"filename": WHEEL.filename, "sha256": WHEEL.sha256},
        "version": "0.26.0",
    }
    series = receipt["series"]
    assert isinstance(series, dict) and len(series["digest"]) == 64
    assert series["patches"] == [{"name": "vllm/0001-a.patch", "sha256": "3" * 64}]
    assert receipt["overlay"] == [
        {"path": "vllm/a.py", "op": "modify", "sha256": "5" * 64, "patches": ["vllm/0001-a.patch"]}
    ]
    assert receipt["not_carried"] == ["tests/test_a.py"]


@given(_files)
def test_canonical_bytes_are_stable_and_sorted(files: list[OverlayFile]) -> None:
    """The same receipt always serialises to the same ASCII bytes: sorted keys, 2-space indent,
    one trailing newline; parsing them gives the receipt back."""
    receipt = _receipt(files)
    data = dumps(receipt)
    assert data == dumps(json.loads(data))
    assert data.endswith(b"}\n") and data.isascii()
    assert json.loads(data) == receipt
    assert data == (json.dumps(receipt, sort_keys=True, indent=2) + "\n").encode()


def test_write_is_atomic_and_readable(tmp_path: Path) -> None:
    """write_receipt leaves exactly the receipt file (no temporary) with mode 0644."""
    receipt = _receipt([])
    path = tmp_path / "dist" / "receipt.json"
    write_receipt(receipt, path)
    write_receipt(receipt, path)
    assert [p.name for p in path.parent.iterdir()] == ["receipt.json"]
    assert path.stat().st_mode & 0o777 == 0o644
    assert read_receipt(path) == receipt
