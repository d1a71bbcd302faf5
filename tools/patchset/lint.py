"""Per-patch lint: vLLM's ruff config on the files a patch touches, SPDX headers, stray prints.

Each patch is linted as the series makes its files: the pristine base with every earlier patch
of its target applied in memory (:func:`patchset.diffparse.apply_file`), then this one. Ruff runs
in a scratch directory that mirrors the touched paths under a copy of the base tree's
``pyproject.toml``, so vLLM's own settings (rules, per-file ignores, excludes) apply. Ruff
findings already present in the preimage are not the patch's: only findings whose
(file, rule) count grows are reported, and a file is "not formatted" only when its preimage was.
SPDX headers follow vLLM's ``tools/pre_commit/check_spdx_header.py`` (new ``.py``/``.rs``/
``.proto`` files need both lines); prints and debugger calls are flagged on added lines of
library code only.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from patchset import precommit
from patchset.diffparse import apply_file, split_lines
from patchset.errors import ExternalToolError
from patchset.export import export_problems
from patchset.model import Patch

SPDX_LINES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "SPDX-License-Identifier: Apache-2.0",
        "SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
    ),
}
"""Per target, the SPDX lines every new source file needs (no entry: not checked)."""

SPDX_SUFFIXES: dict[str, str] = {".py": "#", ".rs": "//", ".proto": "//"}
PRINT_EXEMPT_DIRS = ("tests/", "examples/", "benchmarks/", "tools/", "scripts/", "docs/")
_DEBUG_CALLS = {"print", "breakpoint"}
_RUFF_REV = re.compile(
    r"astral-sh/ruff-pre-commit\s*\n\s*rev:\s*(?:v?(?P<version>[0-9][0-9.]*)\b"
    r"|(?P<sha>[0-9a-f]{40})\s*#\s*frozen:\s*v?(?P<frozen>[0-9][0-9.]*))",
    re.MULTILINE,
)
"""The ruff-pre-commit ``rev:``: a tag (``v0.14.0``, vLLM 0.33) or a commit SHA frozen by
``pre-commit autoupdate --freeze`` with the tag in its comment (``<sha>  # frozen: v0.17.2``,
vLLM 0.34)."""

BaseReader = Callable[[str], bytes | None]
HookPython = Callable[[precommit.HookConfig], str]
"""Given a base's pre-commit hooks, the python to run them with (:func:`precommit.hook_env`)."""


def this_python(_config: precommit.HookConfig) -> str:
    """Run the hooks with this interpreter (it must have their dependencies)."""
    return sys.executable


@dataclass(frozen=True)
class Finding:
    """One lint problem of one patch: ``rule`` is ``ruff:<code>``, ``format``, ``spdx``,
    ``debug-print``, ``pre-commit:<hook id>`` or ``header``; ``line`` is 1-based in the
    postimage (0 = whole file)."""

    patch: str
    path: str
    rule: str
    message: str
    line: int = 0

    def describe(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path or "(header)"
        return f"{self.patch}: {where}: {self.rule}: {self.message}"


@dataclass(frozen=True)
class LintReport:
    """The findings of one patch, and notes that are not failures."""

    patch: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()


def ruff_command() -> list[str]:
    """The ruff to run: ``$PATCHSET_RUFF`` (a path), ``ruff`` on PATH, or ``python -m ruff``."""
    chosen = os.environ.get("PATCHSET_RUFF") or shutil.which("ruff")
    return [chosen] if chosen else [sys.executable, "-m", "ruff"]


def ruff_version(ruff: Sequence[str]) -> str:
    try:
        proc = subprocess.run([*ruff, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ExternalToolError(
            f"cannot run ruff ({exc})", hint="install ruff or set PATCHSET_RUFF"
        ) from exc
    return proc.stdout.strip().removeprefix("ruff ").strip()


def pinned_ruff_version(base_tree: Path) -> str | None:
    """The ruff version the base tree's pre-commit config pins, if any."""
    config = base_tree / ".pre-commit-config.yaml"
    if not config.is_file():
        return None
    match = _RUFF_REV.search(config.read_text(encoding="utf-8"))
    if match is None:
        return None
    return match.group("version") or match.group("frozen")


def series_images(
    patches: Sequence[Patch], base: BaseReader
) -> dict[str, dict[str, tuple[bytes | None, bytes | None]]]:
    """Per patch name, per touched path: (preimage, postimage) as the series makes them."""
    current: dict[str, bytes | None] = {}
    out: dict[str, dict[str, tuple[bytes | None, bytes | None]]] = {}
    for patch in patches:
        images = {}
        for fp in patch.files:
            if fp.path not in current:
                current[fp.path] = base(fp.path)
            pre = current[fp.path]
            post = apply_file(pre, fp)
            images[fp.path] = (pre, post)
            current[fp.path] = post
        out[patch.name] = images
    return out


def added_lines(pre: bytes | None, post: bytes) -> set[int]:
    """1-based line numbers of ``post`` that are not in ``pre`` (by a line diff)."""
    a, b = split_lines(pre or b""), split_lines(post)
    added: set[int] = set()
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            added.update(range(j1 + 1, j2 + 1))
    return added


def debug_calls(source: bytes, lines: set[int]) -> list[tuple[int, str]]:
    """``print(``/``breakpoint(``/``pdb.set_trace(`` calls on ``lines`` (``# noqa: T201`` ok)."""
    found = []
    try:
        tokens = list(tokenize.tokenize(io.BytesIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    text_lines = source.decode("utf-8", "replace").splitlines()
    for i, tok in enumerate(tokens[:-1]):
        row = tok.start[0]
        if row not in lines or tok.type != tokenize.NAME:
            continue
        nxt = tokens[i + 1]
        prev = tokens[i - 1] if i else None
        if nxt.string != "(":
            continue
        is_call = tok.string in _DEBUG_CALLS and not (prev and prev.string == ".")
        is_trace = tok.string == "set_trace" and prev is not None and prev.string == "."
        if (is_call or is_trace) and "noqa: T201" not in text_lines[row - 1]:
            found.append((row, tok.string))
    return found


def spdx_problem(target: str, path: str, data: bytes) -> str | None:
    """Why a new file lacks its target's SPDX header, or None."""
    wanted = SPDX_LINES.get(target)
    prefix = SPDX_SUFFIXES.get(Path(path).suffix)
    if not wanted or prefix is None or not data.strip():
        return None
    lines = {line.strip() for line in data.decode("utf-8", "replace").splitlines()}
    missing = [w for w in wanted if f"{prefix} {w}" not in lines]
    if missing:
        return "new file lacks " + " and ".join(f"'{prefix} {w}'" for w in missing)
    return None


def _ruff_findings(
    ruff: Sequence[str], root: Path, paths: list[str]
) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], list[tuple[int, str]]], set[str]]:
    """Ruff check and format --check over ``paths`` under ``root``: counts, details, unformatted."""
    counts: Counter[tuple[str, str]] = Counter()
    details: dict[tuple[str, str], list[tuple[int, str]]] = {}
    if not paths:
        return counts, details, set()
    base = [*ruff]
    check = subprocess.run(
        [*base, "check", "--no-cache", "--force-exclude", "--output-format=json", *paths],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode not in (0, 1):
        raise ExternalToolError(
            f"ruff check failed (exit {check.returncode})",
            details=check.stderr.strip().splitlines()[-10:],
        )
    for item in json.loads(check.stdout or "[]"):
        rel = Path(item["filename"]).resolve().relative_to(root.resolve()).as_posix()
        key = (rel, str(item.get("code") or "syntax"))
        counts[key] += 1
        details.setdefault(key, []).append((item["location"]["row"], item["message"]))
    unformatted = set()
    for rel in paths:
        # One `ruff format -` per file: the formatted text is compared with the file itself,
        # which does not depend on how a ruff version words its --check report.
        data = (root / rel).read_bytes()
        fmt = subprocess.run(
            [*base, "format", "--no-cache", "--force-exclude", "--stdin-filename", rel, "-"],
            cwd=root,
            input=data,
            capture_output=True,
            check=False,
        )
        if fmt.returncode != 0 or fmt.stdout != data:
            unformatted.add(rel)
    return counts, details, unformatted


def module_paths(tree: Path) -> list[str]:
    """Every ``.py``/``.pyi`` file of ``tree`` (relative), skipping hidden directories.

    Ruff decides that an import is first-party by finding the imported module's file under the
    project root, so the lint mirror needs (empty) stand-ins for all of them.
    """
    out = []
    for dirpath, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(dirpath).relative_to(tree)
        out += [(rel / name).as_posix() for name in files if name.endswith((".py", ".pyi"))]
    return sorted(out)


class _Mirror:
    """A scratch project for ruff: the tree's ``pyproject.toml`` and an empty stand-in for each
    of its modules (so ruff's config and first-party detection match the tree), made once;
    :meth:`lint` writes real files in, runs ruff, and puts the stand-ins back."""

    def __init__(self, tree: Path, root: Path, stand_ins: Sequence[str]):
        self.root = root
        self.stand_ins = set(stand_ins)
        root.mkdir(parents=True)
        config = tree / "pyproject.toml"
        if config.is_file():
            shutil.copyfile(config, root / "pyproject.toml")
        for rel in sorted(self.stand_ins):
            out = root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.touch()

    def lint(
        self, ruff: Sequence[str], files: dict[str, bytes]
    ) -> tuple[Counter[tuple[str, str]], dict[tuple[str, str], list[tuple[int, str]]], set[str]]:
        for rel, data in files.items():
            out = self.root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
        try:
            return _ruff_findings(ruff, self.root, sorted(files))
        finally:
            for rel in files:
                if rel in self.stand_ins:
                    (self.root / rel).write_bytes(b"")
                else:
                    (self.root / rel).unlink()


def lint_patches(
    patches: Sequence[Patch],
    selected: Sequence[Patch],
    base_trees: dict[str, Path],
    *,
    ruff: Sequence[str] | None = None,
    workdir: Path | None = None,
    hooks_python: HookPython | None = this_python,
) -> list[LintReport]:
    """Lint each selected patch (``patches`` is the whole series, for the images); where the
    base has a pre-commit config, its local Python hooks run on each patch's state with the
    python ``hooks_python`` gives for that config (:mod:`patchset.precommit`; None: not run)."""
    ruff = list(ruff or ruff_command())
    version = ruff_version(ruff)
    reports = []
    images_by_target = {}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="lint-") as tmp:
        mirrors: dict[str, tuple[_Mirror, _Mirror]] = {}
        for target in dict.fromkeys(p.target for p in selected):
            tree = base_trees[target]

            def read(rel: str, tree: Path = tree) -> bytes | None:
                path = tree / rel
                return path.read_bytes() if path.is_file() else None

            series = [p for p in patches if p.target == target]
            images_by_target[target] = series_images(series, read)
            modules = set(module_paths(tree)) | {
                f.path for p in series for f in p.files if f.path.endswith((".py", ".pyi"))
            }
            mirrors[target] = (
                _Mirror(tree, Path(tmp) / target / "post", sorted(modules)),
                _Mirror(tree, Path(tmp) / target / "pre", sorted(modules)),
            )
        for patch in selected:
            reports.append(
                _lint_one(patch, base_trees[patch.target], images_by_target, mirrors, ruff, version)
            )
        if hooks_python is not None:
            hooked = _hook_findings(
                patches, selected, base_trees, images_by_target, hooks_python, Path(tmp)
            )
            reports = [
                replace(
                    r,
                    findings=r.findings + hooked[r.patch][0],
                    notes=r.notes + hooked[r.patch][1],
                )
                for r in reports
            ]
    return reports


def _hook_findings(
    patches: Sequence[Patch],
    selected: Sequence[Patch],
    base_trees: dict[str, Path],
    images_by_target: dict[str, dict[str, dict[str, tuple[bytes | None, bytes | None]]]],
    hooks_python: HookPython,
    workdir: Path,
) -> dict[str, tuple[tuple[Finding, ...], tuple[str, ...]]]:
    """Per selected patch: the base's pre-commit hooks' findings and notes."""
    out: dict[str, tuple[tuple[Finding, ...], tuple[str, ...]]] = {
        p.name: ((), ()) for p in selected
    }
    wanted = {p.name for p in selected}
    for target in dict.fromkeys(p.target for p in selected):
        config_file = base_trees[target] / precommit.CONFIG
        if not config_file.is_file():
            continue
        config = precommit.load_config(config_file.read_text(encoding="utf-8"))
        skipped = "not run: " + "; ".join(config.not_run) if config.not_run else None
        announced = False
        python = hooks_python(config)
        with precommit.hook_tree(base_trees[target], python, workdir) as tree:
            for patch in (p for p in patches if p.target == target):
                images = images_by_target[target][patch.name]
                if patch.name not in wanted:
                    tree.write({path: post for path, (_pre, post) in images.items()})
                    continue
                findings: list[Finding] = []
                notes: list[str] = []
                for run in precommit.check_patch(tree, config, images):
                    if run.before_too and run.ok:
                        notes.append(
                            f"pre-commit {run.hook} fails before the patch too, and the patch "
                            "adds nothing to its output"
                        )
                    if run.ok:
                        continue
                    lines = [line.strip() for line in run.output if line.strip()]
                    named = [p for p in run.paths if any(p in line for line in lines)]
                    findings.append(
                        Finding(
                            patch.name,
                            ", ".join(named or run.paths),
                            f"pre-commit:{run.hook}",
                            "; ".join(lines[-6:]) or "failed (no output)",
                        )
                    )
                if not announced:  # said once per target, on its first selected patch
                    ran = ", ".join(h.id for h in config.hooks)
                    notes.append(f"the {target} base's pre-commit hooks run ({python}): {ran}")
                    if skipped:
                        notes.append(f"the {target} base's pre-commit hooks {skipped}")
                    announced = True
                out[patch.name] = (tuple(findings), tuple(notes))
    return out


def _lint_one(
    patch: Patch,
    tree: Path,
    images_by_target: dict[str, dict[str, dict[str, tuple[bytes | None, bytes | None]]]],
    mirrors: dict[str, tuple[_Mirror, _Mirror]],
    ruff: Sequence[str],
    version: str,
) -> LintReport:
    notes = []
    pinned = pinned_ruff_version(tree)
    if pinned and pinned != version:
        notes.append(f"ruff {version} runs; the {patch.target} base pins ruff {pinned}")
    findings = [Finding(patch.name, "", "header", p) for p in export_problems(patch)]
    images = images_by_target[patch.target][patch.name]
    py_post = {
        p: post
        for p, (_pre, post) in images.items()
        if post is not None and p.endswith((".py", ".pyi"))
    }
    py_pre = {p: pre for p in py_post if (pre := images[p][0]) is not None}
    post_mirror, pre_mirror = mirrors[patch.target]
    post_counts, post_details, post_unformatted = post_mirror.lint(ruff, py_post)
    pre_counts, _pre_details, pre_unformatted = pre_mirror.lint(ruff, py_pre)
    for key, count in sorted(post_counts.items()):
        before = pre_counts.get(key, 0)
        if count <= before:
            continue
        path, code = key
        if before == 0:
            findings += [
                Finding(patch.name, path, f"ruff:{code}", message, row)
                for row, message in post_details[key]
            ]
        else:
            findings.append(
                Finding(
                    patch.name,
                    path,
                    f"ruff:{code}",
                    f"{count - before} more finding(s) than the preimage had ({before})",
                )
            )
    for path in sorted(post_unformatted):
        if path in pre_unformatted:
            notes.append(f"{path}: not ruff-formatted before the patch either")
        else:
            findings.append(Finding(patch.name, path, "format", "not ruff-formatted (ruff format)"))
    for fp in patch.files:
        pre, post = images[fp.path]
        if post is None:
            continue
        if fp.op == "add":
            reason = spdx_problem(patch.target, fp.path, post)
            if reason:
                findings.append(Finding(patch.name, fp.path, "spdx", reason))
        if fp.path.endswith(".py") and not fp.path.startswith(PRINT_EXEMPT_DIRS):
            for row, name in debug_calls(post, added_lines(pre, post)):
                findings.append(
                    Finding(patch.name, fp.path, "debug-print", f"stray {name}() call", row)
                )
    return LintReport(patch.name, tuple(findings), tuple(notes))
