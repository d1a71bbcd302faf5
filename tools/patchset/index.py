"""Download one named file of a release straight from a package index (PEP 691 JSON or PEP 503
HTML simple API), without pip.

Why: ``pip download`` of an sdist prepares its metadata first, which builds the sdist's
isolated build environment; vLLM's declares ``torch == 2.14.0``, so saving a 51 MB source
archive installed torch and its CUDA libraries (GBs) into a temporary folder. A pin with
``download = "index"`` (pins.toml) is fetched by name from the index page instead.

Guarantees: the file is the one the index lists under exactly the pinned file name; when the
index states a sha256 for it (JSON ``hashes`` or a ``#sha256=`` URL fragment) that hash must
equal the pin's before anything is downloaded, and the downloaded bytes must match it; the
caller still hashes the file against the pin before caching it. Nothing is written outside
``dest``. Index: ``$PATCHSET_INDEX_URL``, else ``$PIP_INDEX_URL``, else PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import IO, Any

from .errors import ExternalToolError, HashMismatch, PinError

DEFAULT_INDEX = "https://pypi.org/simple/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
TIMEOUT_S = 180.0
CHUNK = 1 << 20

Opener = Callable[..., IO[bytes]]
"""``urllib.request.urlopen``'s shape: (request, timeout=...) -> a response."""


def index_url() -> str:
    """The simple index to read: ``$PATCHSET_INDEX_URL``, ``$PIP_INDEX_URL`` or PyPI's."""
    url = os.environ.get("PATCHSET_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    return url if url.endswith("/") else url + "/"


def project_name(requirement: str) -> str:
    """The PEP 503 normalised project name of a ``name==version`` requirement."""
    name = requirement.partition("==")[0].strip()
    return re.sub(r"[-_.]+", "-", name).lower()


class _Anchors(HTMLParser):
    """(href, text) of every ``<a>`` of a PEP 503 page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.found.append((self._href, "".join(self._text).strip()))
            self._href = None


def listed_files(body: bytes, content_type: str) -> dict[str, tuple[str, str | None]]:
    """filename -> (url as listed, sha256 the index states or None), from a simple page."""
    files: dict[str, tuple[str, str | None]] = {}
    if "json" in content_type:
        page: dict[str, Any] = json.loads(body)
        for entry in page.get("files", []):
            hashes = entry.get("hashes") or {}
            files[entry["filename"]] = (entry["url"], hashes.get("sha256"))
        return files
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8", "replace"))
    for href, text in anchors.found:
        fragment = urllib.parse.urlsplit(href).fragment
        digest = fragment[len("sha256=") :] if fragment.startswith("sha256=") else None
        files[text or href.rsplit("/", 1)[-1].split("#", 1)[0]] = (href, digest)
    return files


def _open(opener: Opener, url: str, accept: str | None = None) -> IO[bytes]:
    headers = {"Accept": accept} if accept else {}
    try:
        return opener(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except (urllib.error.URLError, OSError) as exc:
        raise ExternalToolError(
            f"cannot read {url}: {exc}",
            hint="check the network and PATCHSET_INDEX_URL / PIP_INDEX_URL, or seed the cache: "
            "patchset fetch --from DIR",
        ) from exc


def download_from_index(
    requirement: str,
    filename: str,
    dest: Path,
    *,
    sha256: str = "",
    index: str | None = None,
    opener: Opener = urllib.request.urlopen,
) -> Path:
    """Download ``filename`` of ``requirement``'s project from the index into ``dest``.

    ``sha256`` (the pin's, when known) must equal the hash the index states, if it states one.
    Returns ``dest / filename``.
    """
    page_url = urllib.parse.urljoin(index or index_url(), project_name(requirement) + "/")
    accept = f"{JSON_TYPE}, text/html;q=0.1"
    with _open(opener, page_url, accept) as page:
        content_type = page.headers.get("Content-Type", "") if hasattr(page, "headers") else ""
        files = listed_files(page.read(), content_type)
    if filename not in files:
        near = sorted(name for name in files if name.endswith(filename.rsplit(".", 1)[-1]))
        raise PinError(
            f"{requirement}: the index page {page_url} lists no {filename}",
            details=[f"it lists: {', '.join(near[-8:]) or 'no such files'}"],
            hint="the release may not be on this index; check requirement/filename in pins.toml",
        )
    listed, stated = files[filename]
    if stated and sha256 and stated != sha256:
        raise HashMismatch(
            f"{requirement}: the index states sha256 {stated} for {filename}, pinned {sha256}; "
            "not downloaded",
            hint="the artefact changed upstream; do not edit pins.toml without checking why",
        )
    url = urllib.parse.urldefrag(urllib.parse.urljoin(page_url, listed)).url
    target = dest / filename
    digest = hashlib.sha256()
    try:
        with _open(opener, url) as response, target.open("xb") as out:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:  # cut mid-download (ENOSPC, a reset): no partial file is left
        target.unlink(missing_ok=True)
        raise ExternalToolError(f"downloading {url} failed: {exc}") from exc
    if stated and digest.hexdigest() != stated:
        target.unlink()
        raise HashMismatch(
            f"{requirement}: downloaded {filename} has sha256 {digest.hexdigest()}, the index "
            f"states {stated}; deleted it",
            hint="the download was cut or changed in transit; run it again",
        )
    return target
