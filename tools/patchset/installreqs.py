"""The requirement list the project's own installs use for a pinned wheel.

A pinned wheel declares its dependencies in ``Requires-Dist``. Where the package index the
project reaches lacks one of those exact pins, ``pins.toml``'s ``install_substitutes`` names
the ``name==version`` installed instead. :func:`install_requirements` returns the wheel's own
requirements (without extras) with exactly those pins replaced, so an install can be
``pip install --no-deps <wheel>`` followed by ``pip install <requirements>``. The wheel file
is never changed. Guarantee: every substitute replaces a requirement the wheel declares (a
substitute for something the wheel does not require is an error, not a silent extra package).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from email.parser import HeaderParser
from pathlib import Path

from .errors import PinError
from .pins import normalise_name

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def wheel_requires(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` values that do not belong to an extra, in file order."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise PinError(f"{wheel.name}: expected one .dist-info/METADATA, found {len(names)}")
        text = archive.read(names[0]).decode("utf-8")
    headers = HeaderParser().parsestr(text)
    return [
        value.strip()
        for value in headers.get_all("Requires-Dist") or []
        if not re.search(r"\bextra\s*==", value)
    ]


def requirement_name(requirement: str) -> str:
    match = _NAME.match(requirement)
    if match is None:
        raise PinError(f"cannot read a distribution name from requirement {requirement!r}")
    return normalise_name(match.group(1))


def install_requirements(
    wheel: Path, substitutes: Sequence[tuple[str, str]]
) -> tuple[list[str], list[tuple[str, str]]]:
    """(requirements to install, [(declared, substitute)]) for ``wheel``.

    ``substitutes`` is ``Pin.install_substitutes``: (normalised name, ``name==version``).
    """
    wanted = dict(substitutes)
    out: list[str] = []
    replaced: list[tuple[str, str]] = []
    for requirement in wheel_requires(wheel):
        name = requirement_name(requirement)
        if name in wanted:
            replaced.append((requirement, wanted[name]))
            out.append(wanted[name])
        else:
            out.append(requirement)
    missing = sorted(set(wanted) - {requirement_name(d) for d, _ in replaced})
    if missing:
        raise PinError(
            f"{wheel.name}: install_substitutes name {', '.join(missing)}, which the wheel does "
            "not require",
            hint="remove the entry from pins.toml or pin the wheel that requires it",
        )
    return out, replaced
