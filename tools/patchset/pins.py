"""``pins.toml``: the pinned upstream artefacts (file name, sha256, how pip fetches them).

The model is a frozen :class:`Pin` per table; :func:`load_pins` validates the whole file and
reports every problem at once in one :class:`~patchset.errors.PinError`.

Tables: ``[<target>.sdist]`` (the patch base), ``[<target>.wheel]`` (the overlay wheel's base)
and, for the same release built for another CPU, ``[<target>.wheel_<arch>]`` (e.g.
``[vllm.wheel_aarch64]``). A platform table must name the same requirement as
``[<target>.wheel]`` and a wheel file whose platform tag is for ``<arch>``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from .errors import PinError

PinKind = Literal["sdist", "wheel"]
KINDS: tuple[str, ...] = ("sdist", "wheel")
DownloadMethod = Literal["pip", "index"]
DOWNLOADS: tuple[str, ...] = get_args(DownloadMethod)
SCHEMA_VERSION = 1

_SHA256 = re.compile(r"[0-9a-f]{64}")
_TARGET = re.compile(r"[a-z][a-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_EXACT_REQ = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")
_COMMON_KEYS = {"requirement", "filename", "sha256", "pip_args", "env"}
_KIND_KEYS: dict[str, set[str]] = {
    "sdist": _COMMON_KEYS | {"top_dir", "download"},
    "wheel": _COMMON_KEYS | {"differs_from_sdist", "build_only_py", "install_substitutes"},
}
_SUFFIX = {"sdist": (".tar.gz",), "wheel": (".whl",)}
_PLATFORM_TABLE = re.compile(r"wheel_([a-z0-9][a-z0-9_]*)")
_PLATFORM_TAG = re.compile(
    r"(?:manylinux|musllinux)_[0-9]+_[0-9]+_(.+)|manylinux[0-9]+_(.+)|linux_(.+)"
)


def wheel_arch(filename: str) -> str:
    """The CPU architecture a wheel file name's platform tag is for (``any`` for pure Python):
    ``...-manylinux_2_28_aarch64.whl`` -> ``aarch64``; ``...-py3-none-any.whl`` -> ``any``."""
    tag = filename.removesuffix(".whl").rsplit("-", 1)[-1].split(".")[0]
    match = _PLATFORM_TAG.fullmatch(tag)
    return next((g for g in match.groups() if g), tag) if match else tag


@dataclass(frozen=True)
class Pin:
    """One pinned artefact: what pip is asked for and the exact file that must come back.

    ``top_dir`` (sdists) is the single top-level directory of the archive. For wheels,
    ``differs_from_sdist`` lists the ``vllm/**/*.py`` files that the build generates (so they
    may differ from the sdist) and ``build_only_py`` the path prefixes of Python files the build
    adds that the sdist lacks. ``install_substitutes`` maps a distribution name (normalised) to
    the exact ``name==version`` that the project's own installs (test venv, GPU staging) use in
    place of the wheel's declared pin, for a pin the reachable package index does not serve; the
    wheel's metadata is never changed. ``download`` (sdists): ``pip`` runs ``pip download``;
    ``index`` reads the file by name from the package index (:mod:`patchset.index`), for an
    sdist whose metadata pip would build first (``pip_args`` and ``env`` are then empty).
    """

    target: str
    kind: PinKind
    requirement: str
    filename: str
    sha256: str
    pip_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    top_dir: str | None = None
    differs_from_sdist: tuple[str, ...] = ()
    build_only_py: tuple[str, ...] = ()
    install_substitutes: tuple[tuple[str, str], ...] = ()
    download: DownloadMethod = "pip"
    platform: str | None = None

    @property
    def table(self) -> str:
        """The pin's table under its target: ``sdist``, ``wheel`` or ``wheel_<platform>``."""
        return f"wheel_{self.platform}" if self.platform else self.kind

    @property
    def key(self) -> str:
        """``<target>.<table>``, the name used in messages, locks and receipts."""
        return f"{self.target}.{self.table}"

    @property
    def arch(self) -> str | None:
        """A wheel pin's CPU architecture, read from its file name (None for an sdist)."""
        return wheel_arch(self.filename) if self.kind == "wheel" else None

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class Pins:
    """Every pin of ``pins.toml``, by (target, kind)."""

    path: Path
    pins: tuple[Pin, ...]

    def get(self, target: str, table: str) -> Pin:
        """The pin of table ``[target.table]`` (``sdist``, ``wheel``, ``wheel_aarch64``)."""
        for pin in self.pins:
            if pin.target == target and pin.table == table:
                return pin
        known = ", ".join(pin.key for pin in self.pins) or "none"
        raise PinError(f"{self.path}: no pin [{target}.{table}] (pinned: {known})")

    def wheels(self, target: str) -> tuple[Pin, ...]:
        """``target``'s wheel pins: ``[target.wheel]`` first, then each platform table."""
        return tuple(p for p in self.pins if p.target == target and p.kind == "wheel")

    def wheel(self, target: str, arch: str | None = None) -> Pin:
        """The wheel pin of ``target`` for CPU ``arch``: the one whose file name is for
        ``arch``, or a pure-Python ``[target.wheel]``; None: ``[target.wheel]``."""
        wheels = self.wheels(target)
        for pin in wheels:
            if arch is None and pin.platform is None or arch is not None and pin.arch == arch:
                return pin
        for pin in wheels:
            if pin.platform is None and pin.arch == "any":
                return pin  # a pure-Python wheel serves every platform
        have = ", ".join(f"{p.arch} [{p.key}]" for p in wheels) or "none"
        raise PinError(
            f"{self.path}: no {target} wheel pinned for {arch or 'the default platform'} "
            f"(pinned: {have})",
            hint=f"add a [{target}.wheel_{arch}] table to pins.toml" if arch else None,
        )

    def __iter__(self) -> Iterator[Pin]:
        return iter(self.pins)

    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(pin.target for pin in self.pins))


def load_pins(path: Path) -> Pins:
    """Read and validate ``pins.toml``; raise one PinError listing every problem."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PinError(f"{path}: not found", hint="run patchset from the repository root") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{path}: not valid TOML: {exc}") from None
    return parse_pins(raw, path)


def parse_pins(raw: Mapping[str, Any], path: Path) -> Pins:
    """Validate the decoded TOML of ``pins.toml`` (see :func:`load_pins`)."""
    problems: list[str] = []
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        problems.append(f"schema_version: expected {SCHEMA_VERSION}, found {version!r}")
    pins: list[Pin] = []
    for target, table in raw.items():
        if target == "schema_version":
            continue
        if not _TARGET.fullmatch(target) or not isinstance(table, dict):
            problems.append(f"[{target}]: expected a target table such as [vllm.sdist]")
            continue
        for kind, entry in table.items():
            where = f"[{target}.{kind}]"
            platform = _PLATFORM_TABLE.fullmatch(kind)
            if (kind not in KINDS and platform is None) or not isinstance(entry, dict):
                problems.append(
                    f"{where}: unknown kind (expected one of {', '.join(KINDS)}, wheel_<arch>)"
                )
                continue
            pin = _parse_entry(target, "wheel" if platform else kind, entry, where, problems)
            if pin is not None and platform is not None:
                pin = replace(pin, platform=platform.group(1))
            if pin is not None:
                pins.append(pin)
    problems.extend(_platform_problems(pins))
    if not pins and not problems:
        problems.append("no pins")
    if problems:
        raise PinError(
            f"{path}: {len(problems)} problem(s) in the pins",
            details=problems,
            hint="fix pins.toml; every pin needs requirement, filename, sha256, pip_args, env",
        )
    return Pins(path=path, pins=tuple(pins))


def _parse_entry(
    target: str, kind: str, entry: dict[str, Any], where: str, problems: list[str]
) -> Pin | None:
    before = len(problems)
    allowed = _KIND_KEYS[kind]
    for key in sorted(set(entry) - allowed):
        problems.append(f"{where}: unknown key {key!r}")
    required = _COMMON_KEYS | ({"top_dir"} if kind == "sdist" else set())
    for key in sorted(required - set(entry)):
        problems.append(f"{where}: missing key {key!r}")
    if len(problems) > before:
        return None

    requirement = entry["requirement"]
    if not isinstance(requirement, str) or not requirement.strip():
        problems.append(f"{where}: requirement must be a non-empty string")
    filename = entry["filename"]
    if (
        not isinstance(filename, str)
        or "/" in filename
        or "\\" in filename
        or filename.startswith(".")
        or not filename.endswith(_SUFFIX[kind])
    ):
        problems.append(
            f"{where}: filename {filename!r} must be a bare file name ending in "
            f"{' or '.join(_SUFFIX[kind])}"
        )
    sha256 = entry["sha256"]
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        problems.append(f"{where}: sha256 must be 64 lowercase hex digits")
    pip_args = _str_list(entry["pip_args"], f"{where} pip_args", problems)
    for arg in pip_args:
        if arg in ("--dest", "-d", "--no-deps") or arg.startswith(("--dest=", "-d")):
            problems.append(f"{where}: pip_args must not set {arg!r} (patchset sets it)")
    env = entry["env"]
    env_pairs: list[tuple[str, str]] = []
    if not isinstance(env, dict):
        problems.append(f"{where}: env must be a table of strings")
    else:
        for name, value in sorted(env.items()):
            if not _ENV_NAME.fullmatch(name) or not isinstance(value, str):
                problems.append(f"{where}: env {name!r} must map a variable name to a string")
            else:
                env_pairs.append((name, value))
    top_dir = entry.get("top_dir")
    if kind == "sdist" and (
        not isinstance(top_dir, str) or not top_dir or "/" in top_dir or top_dir in (".", "..")
    ):
        problems.append(f"{where}: top_dir must be a single directory name")
    differs = _str_list(
        entry.get("differs_from_sdist", []), f"{where} differs_from_sdist", problems
    )
    build_only = _str_list(entry.get("build_only_py", []), f"{where} build_only_py", problems)
    for rel in differs + build_only:
        if rel.startswith("/") or ".." in rel.split("/"):
            problems.append(f"{where}: {rel!r} must be a relative path inside the wheel")
    substitutes = _substitutes(entry.get("install_substitutes", []), where, problems)
    download = entry.get("download", "pip")
    if download not in DOWNLOADS:
        problems.append(f"{where}: download {download!r} must be one of {', '.join(DOWNLOADS)}")
    elif download == "index" and (pip_args or env_pairs):
        problems.append(f"{where}: download = 'index' runs no pip: pip_args and env must be empty")
    if len(problems) > before:
        return None
    return Pin(
        target=target,
        kind=kind,  # type: ignore[arg-type]
        requirement=requirement,
        filename=filename,
        sha256=sha256,
        pip_args=tuple(pip_args),
        env=tuple(env_pairs),
        top_dir=top_dir,
        differs_from_sdist=tuple(differs),
        build_only_py=tuple(build_only),
        install_substitutes=substitutes,
        download=download,
    )


def _platform_problems(pins: list[Pin]) -> list[str]:
    """A ``[t.wheel_<arch>]`` must be the ``[t.wheel]`` release for ``<arch>``, and no two wheel
    pins of one target may be for the same architecture."""
    problems = []
    for pin in pins:
        if pin.platform is None:
            continue
        where = f"[{pin.key}]"
        default = next(
            (p for p in pins if p.target == pin.target and p.kind == "wheel" and not p.platform),
            None,
        )
        if default is None:
            problems.append(f"{where}: needs a [{pin.target}.wheel] of the same release")
        elif default.requirement != pin.requirement:
            problems.append(
                f"{where}: requirement {pin.requirement!r} is not [{default.key}]'s "
                f"{default.requirement!r}"
            )
        if pin.arch != pin.platform:
            problems.append(
                f"{where}: filename {pin.filename!r} is for {pin.arch}, not {pin.platform}"
            )
        twins = [
            p.key
            for p in pins
            if p.target == pin.target and p.kind == "wheel" and p.arch == pin.arch
        ]
        if len(twins) > 1:
            problems.append(f"{where}: {', '.join(twins)} are all for {pin.arch}")
    return problems


def normalise_name(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _substitutes(value: object, where: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    items = _str_list(value, f"{where} install_substitutes", problems)
    out: dict[str, str] = {}
    for item in items:
        match = _EXACT_REQ.fullmatch(item)
        if match is None:
            problems.append(
                f"{where}: install_substitutes entry {item!r} must be an exact 'name==version'"
            )
            continue
        name = normalise_name(match.group(1))
        if name in out:
            problems.append(f"{where}: install_substitutes names {name!r} twice")
        out[name] = item
    return tuple(sorted(out.items()))


def _str_list(value: object, where: str, problems: list[str]) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: must be a list of strings")
        return []
    return list(value)


def find_root(start: Path | None = None) -> Path:
    """The repository root: the nearest directory at or above ``start`` holding ``pins.toml``."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "pins.toml").is_file():
            return candidate
    raise PinError(
        f"no pins.toml at or above {here}",
        hint="run patchset inside a dcp-series checkout",
    )
