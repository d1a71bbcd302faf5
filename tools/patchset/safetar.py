"""Extract a tar archive's regular files and directories, the same way on every Python >= 3.11.

``tarfile``'s ``filter="data"`` (PEP 706) arrived in Python 3.12 and 3.11.4; Debian 12's
``python3`` is 3.11.2, where ``extractall(filter=...)`` is a ``TypeError``. :func:`extract`
gives one set of guarantees with or without it:

- every member is checked first (:func:`member_problems`) and one :class:`UnsafeArchive`
  lists every unsafe one before anything is written: no absolute path, no ``..``, no
  backslash, nothing that resolves outside the destination, no symbolic or hard link, no
  device, FIFO or other special file: regular files and directories only;
- what is written is what the ``data`` filter writes: file modes without set-id, sticky or
  group/other write bits, owner read/write always, executable bits only where the owner's is
  set; directories with the default mode (``0o777`` less the umask); no ownership from the
  archive; modification times kept.

Where the filter exists it is used (after the checks); where it does not, the members are
written from sanitised copies (:func:`data_copy`) by plain ``extractall``.
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

from .errors import PinError

HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
"""Whether this Python's ``tarfile`` has PEP 706's extraction filters (3.12, 3.11.4+)."""


class UnsafeArchive(PinError):
    """An archive has members that may not be extracted; ``details`` names each one."""


def member_problems(members: Sequence[tarfile.TarInfo], dest: Path) -> list[str]:
    """Why each member may not be extracted into ``dest``; empty when all are safe."""
    root = os.path.realpath(dest)
    problems = []
    for member in members:
        name = member.name
        parts = name.split("/")
        if not name or name.startswith("/") or os.path.isabs(name) or "\\" in name:
            problems.append(f"{name or '(no name)'}: absolute or not a POSIX relative path")
        elif ".." in parts:
            problems.append(f"{name}: '..' escapes the destination")
        elif os.path.commonpath([root, os.path.realpath(os.path.join(root, name))]) != root:
            problems.append(f"{name}: resolves outside the destination")
        elif member.issym() or member.islnk():
            problems.append(f"{name}: a link (to {member.linkname!r})")
        elif member.ischr() or member.isblk() or member.isfifo():
            problems.append(f"{name}: a device or FIFO")
        elif not (member.isreg() or member.isdir()):
            problems.append(f"{name}: not a regular file or directory")
    return problems


def data_copy(member: tarfile.TarInfo, umask: int) -> tarfile.TarInfo:
    """A copy of a checked member carrying what the ``data`` filter would extract: its mode
    sanitised, its ownership the extracting process's own (so a ``chown`` is a no-op)."""
    out = copy.copy(member)
    if member.isdir():
        out.mode = 0o777 & ~umask
    else:
        mode = member.mode & 0o755
        if not mode & 0o100:
            mode &= ~0o111
        out.mode = mode | 0o600
    out.uid, out.gid = os.geteuid(), os.getegid()
    out.uname = out.gname = ""
    return out


def extract(
    tar: tarfile.TarFile,
    members: Sequence[tarfile.TarInfo],
    dest: Path,
    *,
    use_filter: bool | None = None,
) -> None:
    """Extract ``members`` of ``tar`` into ``dest`` (see the module doc for the guarantees).

    ``use_filter`` forces the path (None: the ``data`` filter when this Python has it); a
    ``True`` where it is missing is refused. Raises :class:`UnsafeArchive`, nothing written.
    """
    problems = member_problems(members, dest)
    if problems:
        raise UnsafeArchive(
            f"{os.fsdecode(tar.name) if tar.name else 'archive'}: refusing to extract: "
            f"{len(problems)} unsafe member(s)",
            details=problems,
        )
    if use_filter is None:
        use_filter = HAS_DATA_FILTER
    if use_filter:
        if not HAS_DATA_FILTER:
            raise PinError("this Python's tarfile has no extraction filters (PEP 706)")
        tar.extractall(dest, members=members, filter="data")
        return
    umask = os.umask(0o022)
    os.umask(umask)
    tar.extractall(dest, members=[data_copy(m, umask) for m in members], numeric_owner=True)
