"""The errors patchset raises. Library code raises only these; the CLI turns them into exit codes.

Exit codes: 0 ok, 1 error or drift, 2 nothing to do. Each error carries a one-line message
(what failed, then why), an optional hint (the next step), and optional detail lines.
"""

from __future__ import annotations


class PatchsetError(Exception):
    """Base class: an operation failed; the tree was left as it was."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = list(details or [])

    def __str__(self) -> str:
        return self.message


class NothingToDo(PatchsetError):
    """The requested state is already there (e.g. apply on an applied tree)."""

    exit_code = 2


class SeriesError(PatchsetError):
    """The series file or the patch directory is inconsistent (missing, unlisted, duplicate)."""


class PatchFormatError(PatchsetError):
    """A patch file is malformed or asks for something the series refuses."""


class PinError(PatchsetError):
    """pins.toml is malformed or a pinned artefact cannot be fetched or does not match."""


class HashMismatch(PatchsetError):
    """A file's content does not have the sha256 the lock or pin expects."""


class PatchDoesNotApply(PatchsetError):
    """A hunk's context or removed lines do not match the file exactly (zero fuzz)."""


class DriftError(PatchsetError):
    """Files in the tree differ from the postimages the lock records."""


class LockError(PatchsetError):
    """series.lock is missing, malformed or stale."""


class TreeBusy(PatchsetError):
    """Another patchset process holds the tree's lock."""


class TreeStateError(PatchsetError):
    """The in-tree state record is missing, malformed or disagrees with the series."""


class NativeSourceError(PatchsetError):
    """A patch touches native sources, which the overlay wheel cannot carry."""


class WheelError(PatchsetError):
    """The base wheel or the built wheel fails a check."""


class ExternalToolError(PatchsetError):
    """An external program (pip, git) failed."""
