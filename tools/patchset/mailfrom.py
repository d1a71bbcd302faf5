"""The ``From:`` header field as ``git format-patch`` writes it, so ``git am`` reads back the
name that was written.

git writes a name that needs it as an RFC 2047 encoded word (``=?UTF-8?q?...?=``: a non-ASCII
character, or ``=?`` that would read as one), else in RFC 822 quotes when it holds a special
(``()<>[]:;@,."\\``), else as it is (``pretty.c``: ``needs_rfc2047_encoding``, ``add_rfc2047``
with its 76-column folding, ``needs_rfc822_quoting``, ``add_rfc822_quoted``). A name git am
cannot read back is refused: a control character, ``@``, or over 60 bytes (``git mailinfo``'s
``get_sane_name`` then records the e-mail address as the name).
"""

from __future__ import annotations

import email.header
import email.utils

from patchset.errors import PatchsetError

ENCODING = "UTF-8"
_RFC822_SPECIALS = frozenset('()<>[]:;@,."\\')
_ADDRESS_SAFE = frozenset("!*+-/")
_MAX_ENCODED = 76


def identity_parts(identity: str) -> tuple[str, str]:
    """(name, address) of ``Name <email>`` as ``git config`` gives them: the name verbatim."""
    name, sep, rest = identity.rpartition(" <")
    if not sep or not name or not rest.endswith(">") or "@" not in rest:
        raise PatchsetError(f"{identity!r} is not 'Name <email>'")
    return name, rest[:-1]


def mail_parts(value: str) -> tuple[str, str]:
    """(name, address) of a ``From:`` value as a mail has it (quoted, encoded, folded)."""
    name, address = email.utils.parseaddr(value.replace("\n", ""))
    if not address or "@" not in address:
        raise PatchsetError(f"From: {value!r} is not one 'Name <email>'")
    if "=?" in name:  # adjacent encoded words join without the space between them
        name = str(email.header.make_header(email.header.decode_header(name)))
    return name, address


_CRUD = frozenset(".,:;<>\"\\'")


def git_ident_name(name: str) -> str:
    """``name`` as git records it in a commit: its ``crud`` (whitespace, control characters and
    ``.,:;<>"\\'``) stripped from both ends (``ident.c``: ``strbuf_addstr_without_crud``)."""
    start, end = 0, len(name)
    while start < end and (ord(name[start]) <= 32 or name[start] in _CRUD):
        start += 1
    while end > start and (ord(name[end - 1]) <= 32 or name[end - 1] in _CRUD):
        end -= 1
    return name[start:end]


def from_field(name: str, address: str) -> str:
    """The ``From:`` value git format-patch writes for a commit by ``name`` and ``address``
    (the name as git records it: :func:`git_ident_name`)."""
    name = git_ident_name(name)
    if len(name.encode("utf-8")) > 60 or "@" in name:
        raise PatchsetError(
            f"the name {name!r} is over 60 bytes or holds '@': git am would record the e-mail "
            "address as the author's name",
            hint="set a shorter name (git config user.name)",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise PatchsetError(
            f"the name {name!r} holds a control character: git am would not read it back",
            hint="set a name without tabs or control characters (git config user.name)",
        )
    if any(ord(c) > 0x7F for c in name) or "=?" in name:
        return f"{_rfc2047(name, start=len('From: '))} <{address}>"
    if any(c in _RFC822_SPECIALS for c in name):
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{quoted}" <{address}>'
    return f"{name} <{address}>"


def _rfc2047(text: str, start: int) -> str:
    """git's ``add_rfc2047`` for an address phrase: Q-encoding, every special byte ``=XX``,
    folded with ``?=\\n =?UTF-8?q?`` before a line would pass 76 columns."""
    head = f"=?{ENCODING}?q?"
    out = [head]
    column = start + len(ENCODING) + 5
    for char in text:
        raw = char.encode("utf-8")
        if len(raw) > 1 or _special(char):
            piece = "".join(f"={byte:02X}" for byte in raw)
        else:
            piece = char
        if column + len(piece) + 2 > _MAX_ENCODED:
            out.append(f"?=\n {head}")
            column = len(ENCODING) + 5 + 1
        out.append(piece)
        column += len(piece)
    return "".join(out) + "?="


def _special(char: str) -> bool:
    """``is_rfc2047_special`` for RFC2047_ADDRESS (one ASCII character)."""
    if not char.isprintable() or ord(char) > 0x7F:
        return True
    if char in "=?_" or char.isspace():
        return True
    return not (char.isalnum() or char in _ADDRESS_SAFE)
