"""Scratch git repositories for export checks and rebases: import trees, ``git am``, 3-way apply.

Every repository here is a throw-away made in a directory the caller owns (b4-style): patchset
never runs git in the user's checkout or in the dcp-series repository. git runs as a subprocess
(bytes in, bytes out: mail and patches are not text to Python) with a fixed identity and
committer date, no user or system git configuration, no hooks and the C locale, so its output
is reproducible and parseable.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from patchset.errors import ExternalToolError

IDENTITY = ("dcp-series", "dcp-series@example.invalid")
FIXED_DATE = "1980-01-01T00:00:00+0000"
FORMAT_PATCH_ARGS = (
    "--full-index",
    "--no-signature",
    "--zero-commit",
    "--no-numbered",
    "--no-stat",
    "--no-renames",
    "--stdout",
)
"""The flags the series' patches are made with (CONTRIBUTING.md), plus ``--no-renames``."""

AM_ARGS = ("--keep-non-patch", "--keep-cr", "--no-gpg-sign")
"""``git am`` flags: ``--keep-non-patch`` strips only ``[PATCH]`` from the subject, so a
vLLM ``[Tag] Title`` survives (plain ``git am`` would strip every leading ``[...]``)."""

UNMERGED_STATES: dict[str, str] = {
    "UU": "both modified",
    "AA": "both added",
    "DU": "deleted in the new base, modified by the patch",
    "UD": "deleted by the patch, modified in the new base",
    "AU": "added by the patch, path changed in the new base",
    "UA": "added in the new base, path changed by the patch",
    "DD": "deleted on both sides",
}
"""git's unmerged status codes, in the words the rebase report uses (ours = new base)."""

_CONFLICT_START = re.compile(rb"^<{7}(?: |$)", re.MULTILINE)
_OFFSET = re.compile(
    r"^Hunk #(\d+) succeeded at (\d+) \((?:offset (-?\d+) lines?)?(?:, )?(?:fuzz (\d+))?\)"
)
_APPLY_FAIL = re.compile(r"^error: patch failed: (?P<path>.+):(?P<line>\d+)$")


SERIES_FILES = ("series", "pins.toml", "patches")
"""What a checkout's series is made of: its revision speaks for them only when they are clean."""


def series_checkout_state(root: Path) -> tuple[str, list[str]] | None:
    """(HEAD, ``git status --porcelain`` lines of :data:`SERIES_FILES`, untracked files each) of
    the user's checkout at ``root``; None when ``root`` is no git checkout (no ``.git`` there:
    a parent's repository does not count). Raises ExternalToolError when git cannot say."""
    if not (root / ".git").exists():
        return None
    args = ["status", "--porcelain", "--untracked-files=all", "--", *SERIES_FILES]
    try:
        status = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        )
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        )
    except OSError as exc:
        raise ExternalToolError(f"{root}: cannot run git ({exc})") from exc
    if status.returncode != 0 or head.returncode != 0:
        raise ExternalToolError(
            f"{root}: cannot read the checkout's git state",
            details=(status.stderr + head.stderr).strip().splitlines()[-5:],
        )
    return head.stdout.strip(), [line for line in status.stdout.splitlines() if line.strip()]


def _env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GIT_") and key not in ("LANG", "LANGUAGE")
    }
    env.update(
        {
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_AUTHOR_NAME": IDENTITY[0],
            "GIT_AUTHOR_EMAIL": IDENTITY[1],
            "GIT_COMMITTER_NAME": IDENTITY[0],
            "GIT_COMMITTER_EMAIL": IDENTITY[1],
            "GIT_COMMITTER_DATE": FIXED_DATE,
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    return env


@dataclass(frozen=True)
class GitResult:
    """The outcome of one git command that may legitimately fail (am, apply --check)."""

    ok: bool
    output: str

    def tail(self, lines: int = 20) -> list[str]:
        return self.output.strip().splitlines()[-lines:]


@dataclass(frozen=True)
class HunkOffset:
    """``git apply -v`` applied hunk ``number`` of ``path`` at ``line``, moved or fuzzed."""

    path: str
    number: int
    line: int
    offset: int
    fuzz: int


@dataclass(frozen=True)
class ApplyCheck:
    """``git apply --check -v`` of one patch: applies or not, hunks that moved, hunks that fail."""

    ok: bool
    offsets: tuple[HunkOffset, ...]
    failed: tuple[tuple[str, int], ...]
    output: str


class ScratchRepo:
    """A git repository with a work tree at ``path``, made and owned by patchset (or a linked
    work tree of one, whose ``.git`` is a file: :meth:`add_worktree`)."""

    def __init__(self, path: Path):
        if not (path / ".git").is_dir() and not (path / ".git").is_file():
            raise ExternalToolError(f"{path}: not a scratch git repository (no .git directory)")
        self.path = path

    @classmethod
    def create(cls, path: Path) -> ScratchRepo:
        """``git init`` a new repository at ``path`` (absent or empty) on branch ``base``."""
        if path.exists() and any(path.iterdir()):
            raise ExternalToolError(f"refusing to create a scratch repository in non-empty {path}")
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["git", "init", "-q", "--initial-branch=base", str(path)],
            env=_env(),
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ExternalToolError(
                f"git init failed in {path}",
                details=proc.stderr.decode("utf-8", "replace").splitlines()[-20:],
            )
        repo = cls(path)
        for key, value in (
            ("user.name", IDENTITY[0]),
            ("user.email", IDENTITY[1]),
            ("core.autocrlf", "false"),
            ("core.fileMode", "true"),
            ("core.hooksPath", os.devnull),
            ("commit.gpgSign", "false"),
            ("am.threeWay", "false"),
            ("gc.auto", "0"),
        ):
            repo.git("config", key, value)
        return repo

    def git(self, *args: str, ok_codes: tuple[int, ...] = (0,)) -> str:
        """Run ``git <args>`` in the work tree; raise ExternalToolError on another exit code."""
        return self._run(list(args), ok_codes=ok_codes)[1]

    def _run(
        self, args: list[str], *, ok_codes: tuple[int, ...] = (0,), stdin: bytes | None = None
    ) -> tuple[int, str]:
        proc = subprocess.run(
            ["git", *args],
            cwd=self.path,
            env=_env(),
            input=stdin,
            capture_output=True,
            check=False,
        )
        output = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        if proc.returncode not in ok_codes:
            raise ExternalToolError(
                f"git {args[0]} failed (exit {proc.returncode}) in scratch repository {self.path}",
                details=output.strip().splitlines()[-20:],
                hint=f"inspect it with: git -C {self.path} status",
            )
        return proc.returncode, output

    # -- trees and commits ---------------------------------------------------------------------

    def import_tree(self, tree: Path, message: str, *, date: str = FIXED_DATE) -> str:
        """Make the work tree exactly ``tree``'s files and commit them; return the commit id.

        Every file is taken (``--force``: the tree's own ``.gitignore`` does not hide files);
        a ``.git`` inside ``tree`` is refused.
        """
        if (tree / ".git").exists():
            raise ExternalToolError(f"{tree}: is a git checkout; import a plain tree")
        self.clean()
        for entry in self.path.iterdir():
            if entry.name == ".git":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        shutil.copytree(tree, self.path, dirs_exist_ok=True, symlinks=True)
        for dirpath, _dirs, files in os.walk(self.path):
            if ".git" in Path(dirpath).relative_to(self.path).parts[:1]:
                continue
            for name in files:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    os.chmod(full, os.stat(full).st_mode | 0o200)
        self.git("add", "--all", "--force", ".")
        return self.commit(message, date=date, allow_empty=True)

    def commit(self, message: str, *, date: str = FIXED_DATE, allow_empty: bool = False) -> str:
        """Commit the index with ``message`` as author date ``date``; return the commit id."""
        args = ["commit", "-q", "--no-verify", f"--date={date}", "-m", message]
        if allow_empty:
            args.append("--allow-empty")
        self.git(*args)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def branch(self, name: str, rev: str) -> None:
        self.git("branch", "-f", name, rev)

    def checkout(self, rev: str) -> None:
        """Detach the work tree at ``rev`` and remove every untracked file."""
        self.abort_am()
        self.git("checkout", "-q", "-f", "--detach", rev)
        self.clean()

    def clean(self) -> None:
        self.git("reset", "-q", "--hard")
        self.git("clean", "-q", "-f", "-d", "-x")

    def message(self, rev: str = "HEAD") -> str:
        return self.git("log", "-1", "--format=%B", rev)

    def subject(self, rev: str = "HEAD") -> str:
        return self.git("log", "-1", "--format=%s", rev).strip()

    def changed_paths(self, old: str, new: str) -> list[str]:
        out = self.git("diff", "--name-only", "--no-renames", "-z", old, new)
        return sorted(p for p in out.split("\0") if p)

    def is_empty_commit(self, rev: str = "HEAD") -> bool:
        return not self.changed_paths(f"{rev}~1", rev)

    def format_patch(self, rev: str = "HEAD") -> bytes:
        """``git format-patch`` of the single commit ``rev`` with the series' flags."""
        proc = subprocess.run(
            ["git", "format-patch", *FORMAT_PATCH_ARGS, "-1", rev],
            cwd=self.path,
            env=_env(),
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ExternalToolError(
                f"git format-patch failed in {self.path}",
                details=proc.stderr.decode("utf-8", "replace").splitlines()[-20:],
            )
        return proc.stdout

    def read(self, rev: str, path: str) -> bytes | None:
        """The bytes of ``path`` at ``rev``, or None when it is absent there."""
        proc = subprocess.run(
            ["git", "cat-file", "blob", f"{rev}:{path}"],
            cwd=self.path,
            env=_env(),
            capture_output=True,
            check=False,
        )
        return proc.stdout if proc.returncode == 0 else None

    # -- applying mail and patches -------------------------------------------------------------

    def am(self, mbox: bytes, *, three_way: bool = False) -> GitResult:
        """``git am`` one mbox onto HEAD; on failure the am session is left for inspection."""
        args = ["-c", "merge.renames=false", "am", *AM_ARGS, "--committer-date-is-author-date"]
        if three_way:
            args.append("-3")
        code, output = self._run(args, ok_codes=(0, 1, 128), stdin=mbox)
        return GitResult(code == 0, output)

    def abort_am(self) -> None:
        """Abort a ``git am`` session left by a failed :meth:`am` (no-op without one)."""
        if self.am_in_progress():
            self.git("am", "--abort")

    def am_in_progress(self) -> bool:
        """Whether a ``git am`` session is open in this work tree (its own, in a linked one)."""
        dot_git = self.path / ".git"
        git_dir = (
            dot_git
            if dot_git.is_dir()
            else Path(self.git("rev-parse", "--absolute-git-dir").strip())
        )
        return (git_dir / "rebase-apply").exists()

    def add_worktree(self, path: Path, branch: str, rev: str) -> ScratchRepo:
        """``git worktree add -b branch path rev``: a linked work tree on a new branch."""
        self.git("worktree", "add", "-q", "-b", branch, str(path), rev)
        return ScratchRepo(path)

    def apply_check(self, patch: bytes, *, reverse: bool = False) -> ApplyCheck:
        """``git apply --check -v`` against the work tree (exact; reports moved hunks)."""
        args = ["apply", "--check", "-v"]
        if reverse:
            args.append("--reverse")
        code, output = self._run(args, ok_codes=(0, 1, 128), stdin=patch)
        offsets = []
        failed = []
        current = ""
        for line in output.splitlines():
            if line.startswith("Checking patch "):
                current = line[len("Checking patch ") :].rstrip(".")
            match = _OFFSET.match(line)
            if match:
                offsets.append(
                    HunkOffset(
                        current,
                        int(match.group(1)),
                        int(match.group(2)),
                        int(match.group(3) or 0),
                        int(match.group(4) or 0),
                    )
                )
            fail = _APPLY_FAIL.match(line)
            if fail:
                failed.append((fail.group("path"), int(fail.group("line"))))
        return ApplyCheck(code == 0, tuple(offsets), tuple(failed), output)

    def conflicted_paths(self) -> list[str]:
        out = self.git("diff", "--name-only", "--diff-filter=U", "-z")
        return sorted(p for p in out.split("\0") if p)

    def unmerged(self) -> dict[str, str]:
        """Unmerged paths after a failed 3-way merge -> git's two-letter status (``UU``, ``DU``,
        ``UD``, ``AA``, ``AU``, ``UA``, ``DD``)."""
        out = self.git("status", "--porcelain=v1", "-z", "--untracked-files=no")
        states = {}
        for entry in out.split("\0"):
            if len(entry) > 3 and entry[:2] in UNMERGED_STATES:
                states[entry[3:]] = entry[:2]
        return states

    def conflict_regions(self, path: str) -> int:
        """How many ``<<<<<<<`` conflict regions the work-tree file ``path`` holds."""
        full = self.path / path
        if not full.is_file():
            return 0
        return len(_CONFLICT_START.findall(full.read_bytes()))
