"""install_substitutes: a pinned wheel's requirements with an unavailable pin replaced."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from patchset.errors import PinError
from patchset.installreqs import install_requirements, wheel_requires
from patchset.pins import parse_pins

METADATA = """Metadata-Version: 2.1
Name: vllm
Version: 0.34.0
Requires-Dist: regex
Requires-Dist: torch==2.14.0
Requires-Dist: flashinfer-python==0.7.3
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"
Requires-Dist: b12x==1.5.1; extra == "b12x"
Requires-Dist: pytest; extra=="test"
Provides-Extra: b12x

"""


def make_wheel(tmp_path: Path) -> Path:
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        archive.writestr("vllm-0.34.0.dist-info/METADATA", METADATA)
    return wheel


def test_requirements_without_extras_keep_their_markers(tmp_path: Path) -> None:
    assert wheel_requires(make_wheel(tmp_path)) == [
        "regex",
        "torch==2.14.0",
        "flashinfer-python==0.7.3",
        'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64"',
    ]


def test_a_substitute_replaces_exactly_the_declared_pin(tmp_path: Path) -> None:
    reqs, replaced = install_requirements(
        make_wheel(tmp_path), [("flashinfer-python", "flashinfer_python==0.7.4")]
    )
    assert reqs[2] == "flashinfer_python==0.7.4"
    assert "flashinfer-python==0.7.3" not in reqs
    assert replaced == [("flashinfer-python==0.7.3", "flashinfer_python==0.7.4")]


def test_a_substitute_for_an_undeclared_distribution_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PinError, match="not require"):
        install_requirements(make_wheel(tmp_path), [("flashmla", "flashmla==1.0")])


def _wheel_pin(**extra: object) -> dict[str, object]:
    return {
        "schema_version": 1,
        "vllm": {
            "wheel": {
                "requirement": "vllm==0.34.0",
                "filename": "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                "sha256": "0" * 64,
                "pip_args": [],
                "env": {},
                **extra,
            }
        },
    }


def test_pins_parse_substitutes_by_normalised_name() -> None:
    pins = parse_pins(
        _wheel_pin(install_substitutes=["Flashinfer_Python==0.7.4"]), Path("pins.toml")
    )
    assert pins.get("vllm", "wheel").install_substitutes == (
        ("flashinfer-python", "Flashinfer_Python==0.7.4"),
    )


@pytest.mark.parametrize("entry", ["flashinfer-python>=0.7.4", "flashinfer-python", "==0.7.4"])
def test_pins_refuse_a_substitute_that_is_not_an_exact_pin(entry: str) -> None:
    with pytest.raises(PinError) as info:
        parse_pins(_wheel_pin(install_substitutes=[entry]), Path("pins.toml"))
    assert any("exact 'name==version'" in d for d in info.value.details)
