"""The data model: frozen records for patches, diffs, the lock, the in-tree state and the
overlay wheel.

Nothing here reads or writes files; parsing lives in ``patchfile``/``diffparse``/``series``,
I/O in ``apply``/``state``/``lockfile``. Byte content is ``bytes``; hashes are sha256 hex.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

TARGETS: tuple[str, ...] = ("vllm", "b12x")
"""The trees a series entry may target; the first path component of an entry names one."""

FileOp = Literal["modify", "add", "delete"]
FILE_MODES: tuple[str, ...] = ("100644", "100755")
"""The only file modes a patch may carry (regular file, executable file)."""

UPSTREAM_STATUSES: tuple[str, ...] = ("Pending", "Submitted", "Backport", "Inappropriate")


@dataclass(frozen=True)
class PatchHeader:
    """The mail header and description of a ``git format-patch`` file.

    ``description`` is the body between the subject and the trailer block (no leading or
    trailing blank lines); ``trailers`` are the ``Key: value`` lines of the last paragraph.
    """

    commit: str
    author: str
    date: str
    subject: str
    description: str
    trailers: tuple[tuple[str, str], ...]

    def trailer_values(self, key: str) -> tuple[str, ...]:
        """Every value of trailer ``key`` (case-insensitive), in order."""
        lowered = key.lower()
        return tuple(v for k, v in self.trailers if k.lower() == lowered)

    @property
    def upstream_status(self) -> str | None:
        values = self.trailer_values("Upstream-Status")
        return values[0] if values else None

    @property
    def depends_on(self) -> tuple[str, ...]:
        return self.trailer_values("Depends-on")


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk; ``lines`` are (kind, bytes) with kind in ``' '``, ``'-'``, ``'+'``.

    Each line's bytes include its ``\\n`` unless the diff marked it ``\\ No newline``.
    Line numbers are 1-based as in the header (a zero-length side has start 0 for empty files).
    """

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[tuple[str, bytes], ...]

    @property
    def old_lines(self) -> list[bytes]:
        return [text for kind, text in self.lines if kind != "+"]

    @property
    def new_lines(self) -> list[bytes]:
        return [text for kind, text in self.lines if kind != "-"]


@dataclass(frozen=True)
class FilePatch:
    """The change one patch makes to one file (no renames, no mode changes, text only)."""

    path: str
    op: FileOp
    mode: str
    old_blob: str
    new_blob: str
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class Patch:
    """A parsed patch file of the series.

    ``header_text`` is the verbatim bytes before the first ``diff --git`` line (kept as-is by
    ``refresh``); ``sha256`` is the digest of the whole file.
    """

    name: str
    sha256: str
    header: PatchHeader
    header_text: bytes
    files: tuple[FilePatch, ...]

    @property
    def target(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


@dataclass(frozen=True)
class FileImage:
    """One touched file of one patch: operation, pre/post sha256 (None = absent), mode."""

    path: str
    op: FileOp
    pre: str | None
    post: str | None
    mode: str


@dataclass(frozen=True)
class PatchImages:
    """A patch's digest and the images of every file it touches (a lock or state entry)."""

    name: str
    sha256: str
    files: tuple[FileImage, ...]

    def image(self, path: str) -> FileImage | None:
        for image in self.files:
            if image.path == path:
                return image
        return None


@dataclass(frozen=True)
class FinalImage:
    """A touched file after the whole series: sha256 (None = deleted) and mode."""

    sha256: str | None
    mode: str


@dataclass(frozen=True)
class Lock:
    """``series.lock``: the pins it was made against, per patch images, per target finals."""

    pins: dict[str, str]
    patches: tuple[PatchImages, ...]
    final: dict[str, dict[str, FinalImage]]

    def entry(self, name: str) -> PatchImages | None:
        for entry in self.patches:
            if entry.name == name:
                return entry
        return None


@dataclass(frozen=True)
class AppliedPatch:
    """One patch of the in-tree applied stack, with the directories its added files needed."""

    images: PatchImages
    created_dirs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.images.name


@dataclass(frozen=True)
class TreeState:
    """``.patchset/state.json``: which patches are applied to this tree, and from what.

    ``backups`` maps each touched path to the sha256 of its pristine bytes kept under
    ``.patchset/base/`` (None: the path did not exist before the series); ``modes`` the
    permission bits (octal text) of each pristine file and of each directory a deletion removed,
    so unapply restores them.
    """

    target: str
    base_pin: str | None
    git_head: str | None
    applied: tuple[AppliedPatch, ...] = ()
    backups: dict[str, str | None] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)

    @property
    def applied_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.applied)

    def expected(self) -> dict[str, tuple[str | None, str]]:
        """path -> (expected sha256 now, owning patch name), for every file the stack touched."""
        out: dict[str, tuple[str | None, str]] = {}
        for applied in self.applied:
            for image in applied.images.files:
                out[image.path] = (image.post, applied.name)
        return out


@dataclass(frozen=True)
class OverlayFile:
    """A package file the series changes: the wheel gets ``sha256`` (None: it is removed)."""

    path: str
    op: FileOp
    sha256: str | None
    patches: tuple[str, ...]


@dataclass(frozen=True)
class Overlay:
    """What the series does to the wheel: package files laid over, tree files not carried."""

    files: tuple[OverlayFile, ...]
    not_carried: tuple[str, ...]


@dataclass(frozen=True)
class BuiltWheel:
    """A verified overlay wheel."""

    path: Path
    sha256: str
    version: str
    base_version: str
    overlay: Overlay
