"""pins.toml: the repository's pins load, and every malformed pin is reported at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from patchset.errors import PinError
from patchset.pins import find_root, load_pins

REPO = Path(__file__).resolve().parent.parent

VALID = """\
schema_version = 1

[vllm.sdist]
requirement = "vllm==0.26.0"
filename = "vllm-0.26.0.tar.gz"
sha256 = "{sha}"
pip_args = ["--no-binary", "vllm"]
top_dir = "vllm-0.26.0"

[vllm.sdist.env]
VLLM_TARGET_DEVICE = "empty"

[vllm.wheel]
requirement = "vllm==0.26.0"
filename = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
sha256 = "{sha}"
pip_args = []
differs_from_sdist = ["vllm/_version.py"]

[vllm.wheel.env]
"""


def test_repository_pins_cover_every_base() -> None:
    """The repository's pins.toml names vLLM 0.34.0 and b12x 1.5.1, each as sdist and wheel."""
    pins = load_pins(REPO / "pins.toml")
    assert {p.key for p in pins} == {
        "vllm.sdist",
        "vllm.wheel",
        "vllm.wheel_aarch64",
        "b12x.sdist",
        "b12x.wheel",
    }
    sdist = pins.get("vllm", "sdist")
    assert sdist.filename == "vllm-0.34.0.tar.gz"
    assert sdist.top_dir == "vllm-0.34.0"
    # read from the index by name: pip would install vLLM's build requirements (torch) first
    assert sdist.download == "index" and sdist.env_dict == {} and sdist.pip_args == ()
    assert pins.get("vllm", "wheel").requirement == sdist.requirement == "vllm==0.34.0"
    # flashinfer-python 0.7.3 (0.34.0's pin) is not on the reachable index: 0.7.4 in its place.
    assert pins.get("vllm", "wheel").install_substitutes == (
        ("flashinfer-python", "flashinfer-python==0.7.4"),
    )
    # vLLM 0.34.0 lists b12x==1.5.1 as its `b12x` extra: the pair must stay in step.
    assert pins.get("b12x", "wheel").requirement == pins.get("b12x", "sdist").requirement
    assert pins.get("b12x", "sdist").requirement == "b12x==1.5.1"
    assert pins.get("vllm", "wheel").differs_from_sdist == ("vllm/_version.py",)
    assert pins.targets() == ("vllm", "b12x")
    # The same release for DGX Spark (aarch64), with the same documented build facts.
    x86, arm = pins.wheel("vllm"), pins.wheel("vllm", "aarch64")
    assert (x86.arch, arm.arch, arm.key) == ("x86_64", "aarch64", "vllm.wheel_aarch64")
    assert pins.wheel("vllm", "x86_64") == x86 and pins.get("vllm", "wheel_aarch64") == arm
    assert arm.filename == "vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl"
    for field in ("requirement", "differs_from_sdist", "build_only_py", "install_substitutes"):
        assert getattr(arm, field) == getattr(x86, field), field
    # b12x is pure Python: its one wheel serves both platforms.
    assert pins.wheel("b12x", "aarch64") == pins.wheel("b12x") == pins.get("b12x", "wheel")


def test_valid_pins_parse(tmp_path: Path) -> None:
    """A well-formed file gives one frozen Pin per table with its fields."""
    path = tmp_path / "pins.toml"
    path.write_text(VALID.format(sha="a" * 64))
    pins = load_pins(path)
    wheel = pins.get("vllm", "wheel")
    assert wheel.sha256 == "a" * 64 and wheel.pip_args == () and wheel.env == ()
    with pytest.raises(PinError, match=r"no pin \[b12x.sdist\]"):
        pins.get("b12x", "sdist")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    """Bad sha256, missing keys, unknown keys and kinds, bad names each get a line."""
    text = (
        VALID.format(sha="A" * 64)
        .replace('top_dir = "vllm-0.26.0"\n', "")
        .replace('filename = "vllm-0.26.0-cp38', 'filename = "../vllm-0.26.0-cp38')
        .replace("pip_args = []", 'pip_args = ["--dest", "/tmp"]\nsurprise = 1')
    )
    text += '\n[vllm.egg]\nrequirement = "x"\n'
    path = tmp_path / "pins.toml"
    path.write_text(text)
    with pytest.raises(PinError) as err:
        load_pins(path)
    details = "\n".join(err.value.details)
    assert "[vllm.sdist]: missing key 'top_dir'" in details
    assert "[vllm.wheel]: unknown key 'surprise'" in details
    assert "[vllm.egg]: unknown kind" in details
    path.write_text(VALID.format(sha="A" * 64).replace("pip_args = []", 'pip_args = ["-d", "x"]'))
    with pytest.raises(PinError) as err:
        load_pins(path)
    details = "\n".join(err.value.details)
    assert details.count("sha256 must be 64 lowercase hex digits") == 2
    assert "pip_args must not set '-d'" in details


def test_not_toml_and_missing_file_are_pin_errors(tmp_path: Path) -> None:
    """An unreadable pins.toml is a PinError naming the file, never a raw exception."""
    with pytest.raises(PinError, match="not found"):
        load_pins(tmp_path / "pins.toml")
    (tmp_path / "pins.toml").write_text("[vllm\n")
    with pytest.raises(PinError, match="not valid TOML"):
        load_pins(tmp_path / "pins.toml")


def test_find_root_walks_up_to_pins(tmp_path: Path) -> None:
    """The root is the nearest directory at or above the start holding pins.toml."""
    (tmp_path / "pins.toml").write_text("")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert find_root(deep) == tmp_path.resolve()
    with pytest.raises(PinError):
        find_root(Path("/"))


AARCH64 = """
[vllm.wheel_aarch64]
requirement = "vllm==0.26.0"
filename = "vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64.whl"
sha256 = "{sha}"
pip_args = ["--only-binary=:all:", "--platform", "manylinux_2_28_aarch64"]

[vllm.wheel_aarch64.env]
"""


def test_a_platform_wheel_table_parses_beside_the_default(tmp_path: Path) -> None:
    """``[vllm.wheel_aarch64]`` is a wheel pin for aarch64; ``[vllm.wheel]`` stays the default."""
    path = tmp_path / "pins.toml"
    path.write_text(VALID.format(sha="a" * 64) + AARCH64.format(sha="b" * 64))
    pins = load_pins(path)
    arm = pins.wheel("vllm", "aarch64")
    assert (arm.kind, arm.platform, arm.table, arm.key) == (
        "wheel",
        "aarch64",
        "wheel_aarch64",
        "vllm.wheel_aarch64",
    )
    assert pins.wheel("vllm").sha256 == "a" * 64 and pins.wheel("vllm").platform is None
    assert [p.key for p in pins.wheels("vllm")] == ["vllm.wheel", "vllm.wheel_aarch64"]
    with pytest.raises(PinError, match="no vllm wheel pinned for ppc64le") as err:
        pins.wheel("vllm", "ppc64le")
    assert err.value.hint == "add a [vllm.wheel_ppc64le] table to pins.toml"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            (
                'vllm==0.26.0"\nfilename = "vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64',
                'vllm==0.27.0"\nfilename = "vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64',
            ),
            "[vllm.wheel_aarch64]: requirement 'vllm==0.27.0' is not [vllm.wheel]'s 'vllm==0.26.0'",
        ),
        (
            ("manylinux_2_28_aarch64.whl", "manylinux_2_28_x86_64.whl"),
            "[vllm.wheel_aarch64]: filename 'vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl' is "
            "for x86_64, not aarch64",
        ),
    ],
)
def test_a_platform_table_must_be_the_same_release_for_its_arch(
    tmp_path: Path, edit: tuple[str, str], problem: str
) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(VALID.format(sha="a" * 64) + AARCH64.format(sha="b" * 64).replace(*edit))
    with pytest.raises(PinError) as err:
        load_pins(path)
    assert problem in err.value.details


def test_a_platform_table_needs_the_default_wheel(tmp_path: Path) -> None:
    text = VALID.format(sha="a" * 64)
    text = text[: text.index("[vllm.wheel]")] + AARCH64.format(sha="b" * 64)
    path = tmp_path / "pins.toml"
    path.write_text(text)
    with pytest.raises(PinError) as err:
        load_pins(path)
    assert err.value.details == ["[vllm.wheel_aarch64]: needs a [vllm.wheel] of the same release"]


@pytest.mark.parametrize(
    ("filename", "arch"),
    [
        ("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl", "x86_64"),
        ("vllm-0.34.0-cp38-abi3-manylinux_2_28_aarch64.whl", "aarch64"),
        ("x-1-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", "aarch64"),
        ("x-1-cp312-cp312-manylinux2014_aarch64.whl", "aarch64"),
        ("x-1-cp312-cp312-musllinux_1_1_x86_64.whl", "x86_64"),
        ("x-1-cp312-cp312-linux_aarch64.whl", "aarch64"),
        ("b12x-1.5.1-py3-none-any.whl", "any"),
    ],
)
def test_wheel_arch_reads_the_platform_tag(filename: str, arch: str) -> None:
    from patchset.pins import wheel_arch

    assert wheel_arch(filename) == arch
