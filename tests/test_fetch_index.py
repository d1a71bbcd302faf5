"""``download = "index"`` pins: the file read by name from a simple index on loopback, no pip."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from patchset.errors import ExternalToolError, HashMismatch, PatchsetError, PinError
from patchset.fetch import fetch_pin
from patchset.index import download_from_index, project_name
from patchset.pins import Pin, parse_pins

SDIST = b"the sdist bytes" * 1000
DIGEST = hashlib.sha256(SDIST).hexdigest()


class Index:
    """A loopback simple index: ``/simple/my-pkg/`` as JSON or HTML, ``/files/<name>``."""

    def __init__(self) -> None:
        self.style = "json"
        self.stated = DIGEST
        self.listed = "My_Pkg-1.0.tar.gz"
        self.body = SDIST
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                index.requests.append(self.path)
                if self.path == "/simple/my-pkg/":
                    data, kind = index.page()
                elif self.path == f"/files/{index.listed}":
                    data, kind = index.body, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def page(self) -> tuple[bytes, str]:
        href = f"../../files/{self.listed}"
        if self.style == "json":
            hashes = {"sha256": self.stated} if self.stated else {}
            files = [{"filename": self.listed, "url": href, "hashes": hashes}]
            body = json.dumps({"meta": {"api-version": "1.0"}, "name": "my-pkg", "files": files})
            return body.encode(), "application/vnd.pypi.simple.v1+json"
        fragment = f"#sha256={self.stated}" if self.stated else ""
        html = f'<html><body><a href="{href}{fragment}">{self.listed}</a></body></html>'
        return html.encode(), "text/html"


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    served = Index()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("PATCHSET_INDEX_URL", served.url)
    yield served
    served.server.shutdown()
    served.server.server_close()


def index_pin(sha256: str = DIGEST) -> Pin:
    return Pin(
        target="pkg",
        kind="sdist",
        requirement="My_Pkg==1.0",
        filename="My_Pkg-1.0.tar.gz",
        sha256=sha256,
        top_dir="My_Pkg-1.0",
        download="index",
    )


def no_pip(*_args: object) -> None:
    raise AssertionError("pip must not run for a download = 'index' pin")


@pytest.mark.parametrize("style", ["json", "html"])
def test_an_index_pin_is_read_by_name_from_the_index_without_pip(
    index: Index, tmp_path: Path, style: str
) -> None:
    index.style = style
    got = fetch_pin(index_pin(), tmp_path, pip=no_pip)
    assert got.action == "downloaded" and got.path.read_bytes() == SDIST
    assert index.requests == ["/simple/my-pkg/", "/files/My_Pkg-1.0.tar.gz"]
    assert fetch_pin(index_pin(), tmp_path, pip=no_pip).action == "cached"


def test_an_index_stating_another_hash_is_refused_before_downloading(
    index: Index, tmp_path: Path
) -> None:
    index.stated = "1" * 64
    with pytest.raises(HashMismatch, match="index states sha256 1111"):
        fetch_pin(index_pin(), tmp_path, pip=no_pip)
    assert index.requests == ["/simple/my-pkg/"]
    assert list(tmp_path.iterdir()) == []


def test_bytes_that_are_not_the_stated_hash_are_deleted(index: Index, tmp_path: Path) -> None:
    """The pin's hash unknown (a rebase to a new release): the index's stated hash still holds."""
    index.body = SDIST + b"\0"
    with pytest.raises(HashMismatch, match="the index states"):
        download_from_index("My_Pkg==1.0", "My_Pkg-1.0.tar.gz", tmp_path, sha256="")
    assert list(tmp_path.iterdir()) == []


def test_a_file_the_pin_does_not_match_is_not_cached(index: Index, tmp_path: Path) -> None:
    """No stated hash on the page: the pin's own hash check refuses the bytes."""
    index.stated = ""
    index.body = SDIST + b"\0"
    with pytest.raises(HashMismatch, match="pinned"):
        fetch_pin(index_pin(), tmp_path, pip=no_pip)
    assert not (tmp_path / "My_Pkg-1.0.tar.gz").exists()


def test_a_file_name_the_index_does_not_list_is_refused(index: Index, tmp_path: Path) -> None:
    index.listed = "My_Pkg-1.1.tar.gz"
    with pytest.raises(PinError, match="lists no My_Pkg-1.0.tar.gz") as info:
        fetch_pin(index_pin(), tmp_path, pip=no_pip)
    assert "My_Pkg-1.1.tar.gz" in " ".join(info.value.details)


def test_an_unreachable_index_is_an_error_with_the_way_out(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHSET_INDEX_URL", "http://127.0.0.1:9/simple/")
    with pytest.raises(ExternalToolError, match="cannot read") as info:
        fetch_pin(index_pin(), tmp_path, pip=no_pip)
    assert "--from" in (info.value.hint or "")


def test_project_names_are_normalised_as_pep_503_says() -> None:
    assert project_name("My_Pkg==1.0") == "my-pkg"
    assert project_name("a.b__c==2") == "a-b-c"


def _pins(extra: str) -> str:
    return (
        'schema_version = 1\n[pkg.sdist]\nrequirement = "pkg==1.0"\n'
        f'filename = "pkg-1.0.tar.gz"\nsha256 = "{DIGEST}"\ntop_dir = "pkg-1.0"\n{extra}'
    )


def _parse(text: str) -> Pin:
    import tomllib

    return parse_pins(tomllib.loads(text), Path("pins.toml")).get("pkg", "sdist")


def test_pins_accept_download_index_and_default_to_pip() -> None:
    assert _parse(_pins('download = "index"\npip_args = []\n[pkg.sdist.env]\n')).download == "index"
    assert _parse(_pins("pip_args = []\n[pkg.sdist.env]\n")).download == "pip"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('download = "curl"\npip_args = []\n[pkg.sdist.env]\n', "must be one of pip, index"),
        ('download = "index"\npip_args = ["--pre"]\n[pkg.sdist.env]\n', "pip_args and env"),
        ('download = "index"\npip_args = []\n[pkg.sdist.env]\nX = "1"\n', "pip_args and env"),
    ],
)
def test_pins_refuse_an_unknown_download_or_pip_settings_it_would_ignore(
    extra: str, message: str
) -> None:
    with pytest.raises(PatchsetError) as info:
        _parse(_pins(extra))
    assert message in " ".join([info.value.message, *info.value.details])
