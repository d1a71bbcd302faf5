"""RECORD: parse/write round trips and every malformed row reported at once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from patchset.errors import WheelError
from patchset.hashing import record_digest
from patchset.record import RecordEntry, check_member, parse_record, write_record

RECORD = "pkg-1.0.dist-info/RECORD"

# Paths as wheels carry them: any printable text except the path separators' edge cases and
# line breaks (which RECORD cannot hold unquoted and no wheel uses).
_path = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\r\n"),
    min_size=1,
    max_size=40,
).filter(lambda p: p != RECORD)
_entry = st.builds(lambda path, data: RecordEntry.of(path, data), _path, st.binary(max_size=64))


@given(st.lists(_entry, unique_by=lambda e: e.path, max_size=20))
def test_write_then_parse_is_identity(entries: list[RecordEntry]) -> None:
    """Writing rows and parsing them back gives the same rows, RECORD's own row last."""
    parsed = parse_record(write_record(entries, RECORD))
    assert parsed == [*entries, RecordEntry(RECORD, None, None)]


@given(st.lists(_entry, unique_by=lambda e: e.path, max_size=20))
def test_write_is_deterministic_and_lf_only(entries: list[RecordEntry]) -> None:
    """The same rows always give the same bytes, with LF line endings and RECORD last."""
    first = write_record(entries, RECORD)
    assert first == write_record(list(entries), RECORD)
    assert b"\r" not in first
    assert first.endswith(f"{RECORD},,\n".encode())


def test_record_digest_is_urlsafe_base64_without_padding() -> None:
    """The digest of b'' is the RFC 4648 urlsafe encoding of sha256(b'') without '='."""
    assert record_digest(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_parse_reports_every_malformed_row() -> None:
    """Bad field counts, hashes, sizes and duplicates are all listed in one error."""
    good = RecordEntry.of("a.py", b"x")
    text = (
        f"{good.path},{good.digest},{good.size}\n"
        "b.py,md5=abc,3\n"
        "c.py,sha256=AAAA,notanumber\n"
        "d.py,only-two\n"
        f"{good.path},{good.digest},{good.size}\n"
    ).encode()
    with pytest.raises(WheelError) as err:
        parse_record(text)
    details = "\n".join(err.value.details)
    assert len(err.value.details) == 5, details
    assert "b.py: hash" in details
    assert "c.py: size" in details
    assert "expected 3 fields" in details
    assert "a.py: listed twice" in details


def test_check_member_names_the_disagreement() -> None:
    """A member that differs from its row in hash or size, or has no row, is described."""
    entry = RecordEntry.of("a.py", b"abc")
    assert check_member(entry, "a.py", record_digest(b"abc"), 3) is None
    assert "RECORD says" in (check_member(entry, "a.py", record_digest(b"abd"), 3) or "")
    assert "RECORD says" in (check_member(entry, "a.py", record_digest(b"abc"), 4) or "")
    assert "not listed" in (check_member(None, "a.py", record_digest(b"abc"), 3) or "")
