"""Upstream export: one submittable mbox and one PR body per patch, and the standalone check.

An exported mbox is the series patch with the series-only trailers (``Upstream-Status:``,
``Depends-on:``) removed and the series' placeholder sign-off replaced by the exporting user's
git identity (``git config user.name`` / ``user.email``), as author and ``Signed-off-by:`` (DCO:
upstream's check wants a real address matching the author); the diff is kept byte for byte. vLLM
titles are ``[Tag] Title``; ``git am`` strips every leading ``[...]`` from a subject unless
told otherwise, so the mbox must be applied with ``git am --keep-non-patch`` (which strips only
``[PATCH]``), as the check does.

The standalone check builds a scratch git repository of the pinned base (:mod:`patchset.gitops`)
and, per patch, applies the mboxes of its declared dependencies and then its own with
``git am``: a patch that only applies on top of an undeclared earlier patch is reported as
"needs X". Where it applies, the patch's own tests under ``tests/`` run on CPU against an
installed vLLM with the patched files laid over it (:class:`OverlayTestRunner`).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from patchset.errors import ExternalToolError, PatchsetError, SeriesError
from patchset.gitops import ScratchRepo, series_checkout_state
from patchset.mailfrom import from_field, git_ident_name, identity_parts, mail_parts
from patchset.model import Patch
from patchset.outputs import replace_dir
from patchset.patchfile import serialise_header, split_patch

SERIES_TRAILERS = ("upstream-status", "depends-on")
"""Trailers that describe the patch's place in dcp-series and mean nothing upstream."""

_PATCH_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_VLLM_SUBJECT = re.compile(r"^(?:\[[^\[\]\s][^\[\]]*\])+ \S.*$")
_SECTION = re.compile(r"^(Purpose|Test Plan|Test Result):[ \t]*(.*)$")
_PYTEST_COUNTS = re.compile(
    r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)"
)

Log = Callable[[str], None]
PYTEST_NO_TESTS = 5
"""pytest's exit code when no test ran (here: every module skipped itself)."""


def _quiet(_: str) -> None:
    return None


# -- header -> upstream form -------------------------------------------------------------------


def upstream_subject(subject: str) -> str:
    """The commit title upstream sees: the subject without its ``[PATCH ...]`` prefix."""
    return _PATCH_PREFIX.sub("", subject, count=1).strip()


def subject_problem(subject: str) -> str | None:
    """Why the title is not in vLLM's ``[Tag] Title`` form, or None."""
    title = upstream_subject(subject)
    if not _VLLM_SUBJECT.match(title):
        return f"subject {title!r} is not in vLLM's '[Tag] Title' form (e.g. '[Model] Fix x')"
    return None


@dataclass(frozen=True)
class Description:
    """A patch description split into the three parts of vLLM's PR template."""

    purpose: str
    test_plan: str
    test_result: str


def split_description(text: str) -> Description:
    """Split at lines starting ``Test Plan:`` / ``Test Result:`` (a leading ``Purpose:`` label
    is optional): text before the first label is the purpose; a section runs to the next label.
    """
    sections: dict[str, list[str]] = {"Purpose": [], "Test Plan": [], "Test Result": []}
    current = "Purpose"
    previous_blank = True
    for line in text.split("\n"):
        match = _SECTION.match(line)
        if match and (match.group(1) != "Purpose" or previous_blank):
            current = match.group(1)
            if match.group(2):
                sections[current].append(match.group(2))
        else:
            sections[current].append(line)
        previous_blank = not line.strip()
    return Description(*("\n".join(sections[key]).strip() for key in sections))


def test_files(patch: Patch) -> tuple[str, ...]:
    """The test modules a patch adds or changes under ``tests/`` (its own vLLM-tree tests)."""
    return tuple(
        f.path
        for f in patch.files
        if f.op != "delete"
        and f.path.startswith("tests/")
        and re.search(r"(^|/)(test_[^/]*|[^/]*_test)\.py$", f.path)
    )


_PLAN_TEST = re.compile(r"(?<![\w./-])tests/[\w./-]*\.py\b")


def plan_test_paths(patch: Patch) -> tuple[str, ...]:
    """The vLLM-tree test files (``tests/...py``) the Test Plan names, in order, once each.

    Paths of the dcp-series checkout (``proofs/...``, ``evidence/tests/...``) do not count:
    only a path that starts with ``tests/`` is one the PR's reviewer can run."""
    plan = split_description(patch.header.description).test_plan
    return tuple(dict.fromkeys(m.group(0) for m in _PLAN_TEST.finditer(plan)))


_PLAN_KEYWORD = re.compile(r"""(?:^|\s)-k(?:\s+|=)?(?:"([^"]*)"|'([^']*)'|([^\s;#()]+))""")
_GPU_MARK = re.compile(r"\b(GPU|CUDA)\b")


def plan_selections(patch: Patch) -> dict[str, str]:
    """Test file -> the ``-k`` expression the Test Plan's CPU command selects in it.

    A command is one Test Plan line (``\\``-continued lines joined, ``;`` separating two); a
    command marked ``GPU`` or ``CUDA`` is not run by ``export --check`` and its ``-k`` does not
    count. A file the Test Plan names without ``-k`` is absent: it runs whole."""
    plan = split_description(patch.header.description).test_plan
    selections: dict[str, str] = {}
    for line in re.sub(r"\\[ \t]*\n", " ", plan).splitlines():
        for command in line.split(";"):
            match = _PLAN_KEYWORD.search(command)
            if match is None or _GPU_MARK.search(command):
                continue
            keyword = next(g for g in match.groups() if g is not None)
            for path in _PLAN_TEST.findall(command):
                selections.setdefault(path, keyword)
    return selections


BODY_MAX_WORDS = 300
"""The longest PR body (title and description, trailers apart) a reviewer reads in a minute."""


def body_words(patch: Patch) -> int:
    """Words of the PR body: the upstream title and the description, split at whitespace (a
    command counts as its arguments; the trailers are not counted)."""
    return len(upstream_subject(patch.header.subject).split()) + len(
        patch.header.description.split()
    )


def export_problems(patch: Patch) -> list[str]:
    """Every reason ``patch`` is not submittable as is (subject, DCO, Test Plan/Result, a PR
    body over :data:`BODY_MAX_WORDS` words)."""
    problems = []
    reason = subject_problem(patch.header.subject)
    if reason:
        problems.append(reason)
    words = body_words(patch)
    if words > BODY_MAX_WORDS:
        problems.append(
            f"the PR body is {words} words, over {BODY_MAX_WORDS}: keep the user problem, the "
            "change, the Test Plan and today's Test Result; move the rest to design notes"
        )
    if not patch.header.trailer_values("Signed-off-by"):
        problems.append("no 'Signed-off-by:' trailer (vLLM requires DCO sign-off)")
    description = split_description(patch.header.description)
    if not description.test_plan:
        problems.append("description has no 'Test Plan:' paragraph")
    if not description.test_result:
        problems.append("description has no 'Test Result:' paragraph")
    return problems


PLACEHOLDER_IDENTITY = "dcp-series <dcp-series@example.invalid>"
"""The series' own sign-off: no DCO check accepts it, so an export replaces it."""

_IDENTITY = re.compile(r"^[^<>\n]+ <[^<>@\s]+@[^<>\s]+>$")


def signer_identity(cwd: Path) -> str:
    """``Name <email>`` of the user exporting, from ``git config`` (as ``git commit -s`` reads
    it); refuses when either is unset or the address is the series' placeholder."""
    values = []
    for key in ("user.name", "user.email"):
        proc = subprocess.run(
            ["git", "config", "--get", key], cwd=cwd, capture_output=True, text=True, check=False
        )
        values.append(proc.stdout.strip())
    identity = f"{values[0]} <{values[1]}>"
    if not all(values) or not _IDENTITY.match(identity) or identity == PLACEHOLDER_IDENTITY:
        raise PatchsetError(
            "export signs every patch off as you (DCO), but git config has no usable "
            f"user.name / user.email (got {identity!r})",
            hint='git config --global user.name "Your Name" && '
            "git config --global user.email you@example.com",
        )
    return identity


def mbox_bytes(patch: Patch, data: bytes, signer: str | None = None) -> bytes:
    """The upstream mbox of ``patch`` (its file bytes ``data``): series trailers dropped. With
    ``signer`` (``Name <email>``), the author is the signer and the placeholder sign-off is
    replaced by the signer's (other sign-offs are kept, the signer's comes last)."""
    _header_text, diff = split_patch(data)
    trailers = [
        (key, value) for key, value in patch.header.trailers if key.lower() not in SERIES_TRAILERS
    ]
    header = replace(patch.header, trailers=tuple(trailers))
    if signer is not None:
        # the name as git records it in the commit and in `git commit -s`'s sign-off
        name, address = identity_parts(signer)
        signer = f"{git_ident_name(name)} <{address}>"
        trailers = [
            (key, value)
            for key, value in trailers
            if not (key.lower() == "signed-off-by" and value in (PLACEHOLDER_IDENTITY, signer))
        ]
        trailers.append(("Signed-off-by", signer))
        header = replace(header, author=signer, trailers=tuple(trailers))
    # the author as git format-patch writes it (quoted or encoded where git would)
    name, address = identity_parts(signer) if signer is not None else mail_parts(header.author)
    header = replace(header, author=from_field(name, address))
    return serialise_header(header).rstrip(b"\n") + b"\n---\n" + diff


def pr_body(patch: Patch, depends_on: Sequence[str] = ()) -> str:
    """A PR description in vLLM's template sections, from the header and the patch's tests;
    ``depends_on`` names the PRs (titles) this one builds on."""
    description = split_description(patch.header.description)
    tests = test_files(patch)
    plan = description.test_plan or "(the patch states no Test Plan)"
    if tests:
        plan += "\n\nTests this PR adds or changes:\n" + "".join(f"- `{t}`\n" for t in tests)
        plan += "\n```bash\npython -m pytest -q " + " ".join(tests) + "\n```"
    result = description.test_result or "(the patch states no Test Result)"
    parts = [
        f"# {upstream_subject(patch.header.subject)}",
        "## Purpose",
        description.purpose or "(the patch states no purpose)",
        "## Test Plan",
        plan.rstrip(),
        "## Test Result",
        result,
    ]
    if depends_on:
        parts += [
            "## Depends on",
            "This PR builds on: " + "; ".join(f"`{d}`" for d in depends_on) + ".",
        ]
    return "\n\n".join(parts) + "\n"


# -- selection and dependencies ----------------------------------------------------------------


def select(patches: tuple[Patch, ...], names: Sequence[str]) -> tuple[Patch, ...]:
    """The named patches in series order (all when ``names`` is empty)."""
    if not names:
        return patches
    known = {p.name for p in patches}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SeriesError(
            f"not in series: {', '.join(unknown)}", hint="name patches as series lists them"
        )
    wanted = set(names)
    return tuple(p for p in patches if p.name in wanted)


def dependency_closure(patch: Patch, patches: tuple[Patch, ...]) -> tuple[Patch, ...]:
    """The patches ``patch`` declares it depends on, transitively, in series order."""
    by_name = {p.name: p for p in patches}
    needed: set[str] = set()
    stack = list(patch.header.depends_on)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        if name not in by_name:
            raise SeriesError(f"{patch.name}: Depends-on {name} is not in the series")
        needed.add(name)
        stack.extend(by_name[name].header.depends_on)
    return tuple(p for p in patches if p.name in needed)


# -- writing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    """The files written for one patch."""

    name: str
    mbox: Path
    pr_body: Path
    title: str
    depends_on: tuple[str, ...]
    tests: tuple[str, ...]
    problems: tuple[str, ...]


def export_patches(
    repo: Path,
    patches: tuple[Patch, ...],
    selected: tuple[Patch, ...],
    dest: Path,
    *,
    signer: str | None = None,
) -> list[Exported]:
    """Make ``dest`` hold ``<target>/<stem>.mbox`` and ``.pr.md`` for every selected patch,
    signed off by ``signer`` (``Name <email>``; the series' own trailers when None) and, in
    ``<target>/series.mbox``, the selection as one ``git am``-able series: nothing else. The
    directory is built aside and swapped in whole (:func:`outputs.replace_dir`): a killed
    export leaves the previous run's files, never a mix of two runs."""
    out = []
    files: dict[str, bytes] = {}
    mboxes: dict[str, list[bytes]] = {}
    for patch in selected:
        data = (repo / "patches" / patch.name).read_bytes()
        deps = tuple(p.name for p in dependency_closure(patch, patches))
        stem = patch.name.removesuffix(".patch")
        mbox = mbox_bytes(patch, data, signer)
        titles = tuple(
            upstream_subject(p.header.subject) for p in dependency_closure(patch, patches)
        )
        files[f"{stem}.mbox"] = mbox
        files[f"{stem}.pr.md"] = pr_body(patch, titles).encode("utf-8")
        mboxes.setdefault(patch.target, []).append(mbox if mbox.endswith(b"\n") else mbox + b"\n")
        out.append(
            Exported(
                patch.name,
                dest / f"{stem}.mbox",
                dest / f"{stem}.pr.md",
                upstream_subject(patch.header.subject),
                deps,
                test_files(patch),
                tuple(export_problems(patch)),
            )
        )
    for target, parts in mboxes.items():
        files[f"{target}/series.mbox"] = b"".join(parts)
    replace_dir(dest, files)
    return out


# -- standalone check --------------------------------------------------------------------------


@dataclass(frozen=True)
class TestRun:
    """The patch's own tests on CPU: ``ok`` None means not run (``summary`` says why)."""

    __test__ = False  # not a pytest test class

    files: tuple[str, ...]
    ok: bool | None
    summary: str
    output_tail: tuple[str, ...] = ()
    seconds: float | None = None
    selections: tuple[tuple[str, str], ...] = ()
    """(file, ``-k`` expression) for the files the Test Plan runs with a selection."""


class TestRunner(Protocol):
    def __call__(
        self, tree: Path, changed: Sequence[str], tests: Sequence[str], keyword: str | None = None
    ) -> TestRun: ...


def combine_runs(runs: Sequence[tuple[str | None, TestRun]]) -> TestRun:
    """One ``TestRun`` of several pytest invocations (one per ``-k`` selection, None = whole
    files): failed if one failed, passed if none failed and one passed, else not run."""
    if len(runs) == 1 and runs[0][0] is None:
        return runs[0][1]
    oks = [run.ok for _, run in runs]
    ok = False if False in oks else True if True in oks else None
    files = tuple(f for _, run in runs for f in run.files)
    selections = tuple((f, k) for k, run in runs if k is not None for f in run.files)
    summary = "; ".join((f"-k {k!r}: " if k is not None else "") + run.summary for k, run in runs)
    tail = tuple(line for _, run in runs if run.ok is False for line in run.output_tail)
    seconds = [run.seconds for _, run in runs if run.seconds is not None]
    return TestRun(
        files,
        ok,
        summary,
        tail,
        round(sum(seconds), 1) if seconds else None,
        selections,
    )


Verdict = Literal["ok", "needs", "fails"]


@dataclass(frozen=True)
class Standalone:
    """Whether a patch applies with only its declared dependencies, and its tests there."""

    name: str
    verdict: Verdict
    depends_on: tuple[str, ...]
    needs: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    tests: TestRun | None = None

    def describe(self) -> str:
        if self.verdict == "ok" and not self.problems:
            return "standalone OK"
        if self.verdict == "ok":
            return "applies; " + "; ".join(self.problems)
        if self.verdict == "needs":
            return "needs " + ", ".join(self.needs) + " (declare Depends-on)"
        return "does not apply: " + (self.problems[0] if self.problems else "see -v")

    @property
    def passed(self) -> bool:
        return (
            self.verdict == "ok"
            and not self.problems
            and (self.tests is None or self.tests.ok is not False)
        )


def check_standalone(
    patches: tuple[Patch, ...],
    selected: tuple[Patch, ...],
    mboxes: dict[str, bytes],
    base_trees: dict[str, Path],
    workdir: Path,
    *,
    run_tests: TestRunner | Mapping[str, TestRunner] | None = None,
    test_targets: Sequence[str] = ("vllm",),
    require_tests: bool = False,
    log: Log = _quiet,
) -> list[Standalone]:
    """Apply each selected patch with ``git am`` to a scratch repo of its target's base plus its
    declared dependencies; on failure find the undeclared earlier patches it needs. Where it
    applies, every ``tests/`` file its Test Plan names must be in that tree (else the Test
    Plan cannot run standalone) and, with ``require_tests``, a patch of a target in
    ``test_targets`` must add or change a test module. The patch's own tests run
    (``run_tests``) for the targets in ``test_targets`` only; ``run_tests`` given as a mapping
    (target -> runner) names those targets itself."""
    if isinstance(run_tests, Mapping):
        runners: dict[str, TestRunner] = dict(run_tests)
        test_targets = tuple(runners)
    else:
        runners = {t: run_tests for t in test_targets} if run_tests is not None else {}
    results: list[Standalone] = []
    repos: dict[str, tuple[ScratchRepo, str]] = {}
    for patch in selected:
        target = patch.target
        if target not in repos:
            if target not in base_trees:
                raise PatchsetError(f"no base tree for target {target}")
            log(f"Importing the {target} base into a scratch repository under {workdir}")
            repo = ScratchRepo.create(workdir / target)
            base = repo.import_tree(base_trees[target], f"{target} base")
            repos[target] = (repo, base)
        repo, base = repos[target]
        log(f"Checking {patch.name} standalone")
        runner = runners.get(target)
        results.append(
            _check_one(
                repo,
                base,
                patch,
                patches,
                mboxes,
                runner,
                require_tests=require_tests and target in test_targets,
            )
        )
    return results


def _apply_chain(repo: ScratchRepo, base: str, chain: Sequence[Patch], mboxes: dict[str, bytes]):
    """Check out ``base`` and ``git am`` every patch of ``chain``; return the first failure."""
    repo.checkout(base)
    for patch in chain:
        result = repo.am(mboxes[patch.name])
        if not result.ok:
            repo.abort_am()
            return patch, result
    return None


def _check_one(
    repo: ScratchRepo,
    base: str,
    patch: Patch,
    patches: tuple[Patch, ...],
    mboxes: dict[str, bytes],
    run_tests: TestRunner | None,
    *,
    require_tests: bool = False,
) -> Standalone:
    deps = dependency_closure(patch, patches)
    dep_names = tuple(p.name for p in deps)
    failure = _apply_chain(repo, base, (*deps, patch), mboxes)
    if failure is not None:
        failed, result = failure
        if failed is not patch:
            return Standalone(
                patch.name,
                "fails",
                dep_names,
                problems=(f"declared dependency {failed.name} does not apply",),
            )
        needs = _find_needed(repo, base, patch, patches, deps, mboxes)
        if needs:
            return Standalone(patch.name, "needs", dep_names, needs=needs)
        return Standalone(patch.name, "fails", dep_names, problems=tuple(result.tail(6)))
    problems = []
    want = upstream_subject(patch.header.subject)
    if repo.subject() != want:
        problems.append(f"git am made subject {repo.subject()!r}, want {want!r}")
    if "Signed-off-by: " not in repo.message():
        problems.append("commit has no Signed-off-by after git am")
    files = test_files(patch)
    for path in (*files, *plan_test_paths(patch)):
        if not (repo.path / path).is_file():
            what = "its test module" if path in files else "named by its Test Plan"
            problems.append(
                f"{path} ({what}) is not in the base with only this patch and its Depends-on "
                "applied"
            )
    if require_tests and not files:
        problems.append("adds or changes no test module under tests/ (each patch brings its own)")
    tests = None
    if run_tests is not None and files:
        # Every path the series touches is laid over the installed package from this tree
        # (base + dependencies + patch), so even a series-patched install runs standalone.
        series_paths = {path for p in patches if p.target == patch.target for path in p.paths}
        changed = sorted(set(repo.changed_paths(base, "HEAD")) | series_paths)
        # The Test Plan's ``-k`` selects within a file: run what the plan says, not more.
        selections = plan_selections(patch)
        groups: dict[str | None, list[str]] = {}
        for path in files:
            groups.setdefault(selections.get(path), []).append(path)
        tests = combine_runs(
            [(k, run_tests(repo.path, changed, group, keyword=k)) for k, group in groups.items()]
        )
    elif files:
        tests = TestRun(files, None, "not run (no test runner)")
    return Standalone(patch.name, "ok", dep_names, problems=tuple(problems), tests=tests)


def _find_needed(
    repo: ScratchRepo,
    base: str,
    patch: Patch,
    patches: tuple[Patch, ...],
    deps: tuple[Patch, ...],
    mboxes: dict[str, bytes],
) -> tuple[str, ...]:
    """The earlier patches (touching the same files) that make ``patch`` apply, or ()."""
    earlier = patches[: patches.index(patch)]
    touched = set(patch.paths)
    candidates: list[Patch] = []
    grew = True
    while grew:
        grew = False
        for other in earlier:
            if other.target != patch.target or other in candidates:
                continue
            if touched & set(other.paths):
                candidates.append(other)
                touched |= set(other.paths)
                grew = True
    chosen = {p.name for p in candidates} | {p.name for p in deps}
    for candidate in list(candidates):
        chosen |= {p.name for p in dependency_closure(candidate, patches)}
    chain = tuple(p for p in earlier if p.name in chosen)
    if not candidates or _apply_chain(repo, base, (*chain, patch), mboxes) is not None:
        return ()
    declared = {p.name for p in deps}
    return tuple(p.name for p in chain if p.name not in declared)


# -- running a patch's tests on CPU ------------------------------------------------------------


def installed_package_dir(python: str, package: str = "vllm") -> Path | None:
    """Where ``python`` would import ``package`` from (found without importing it), or None."""
    if python == sys.executable:
        spec = importlib.util.find_spec(package)
        locations = spec.submodule_search_locations if spec else None
        return Path(list(locations)[0]) if locations else None
    code = (
        "import importlib.util as u, sys; s = u.find_spec(sys.argv[1]); "
        "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
        "else '')"
    )
    try:
        proc = subprocess.run(
            [python, "-c", code, package], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    found = proc.stdout.strip()
    return Path(found) if proc.returncode == 0 and found else None


def overlay_package(installed: Path, tree: Path, changed: Sequence[str], dest: Path) -> Path:
    """A copy of ``installed`` made of symlinks, with the tree's ``changed`` files laid over it.

    ``changed`` are tree-relative paths; those under the package directory replace (or add, or
    remove) the installed file. Returns the directory to put on ``PYTHONPATH``.
    """
    package = installed.name
    root = dest / "overlay"
    target = root / package
    for dirpath, _dirs, files in os.walk(installed):
        rel = Path(dirpath).relative_to(installed)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.symlink(Path(dirpath) / name, target / rel / name)
    for path in changed:
        if not path.startswith(package + "/"):
            continue
        out = root / path
        if out.is_symlink() or out.exists():
            out.unlink()
        source = tree / path
        if source.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, out)
    return root


HF_HOST = "huggingface.co"


def hub_offline_env(host: str = HF_HOST, timeout: float = 5.0) -> dict[str, str]:
    """Environment for vLLM tests where the Hugging Face hub cannot be reached, else ``{}``.

    ``HF_HUB_OFFLINE=1`` makes hub lookups fail at once instead of retrying, and
    ``DCP_HUB_UNREACHABLE=1`` lets the test venv's ``dcp_ci_support`` pytest plugin report a
    failure that is only the hub's offline error as a skip with that reason. An explicit
    ``HF_HUB_OFFLINE`` in the environment is left alone (no probe).
    """
    if "HF_HUB_OFFLINE" in os.environ:
        return {}
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return {}
    except OSError:
        return {"HF_HUB_OFFLINE": "1", "DCP_HUB_UNREACHABLE": "1"}


@dataclass
class OverlayTestRunner:
    """Run a patch's tests with ``python -m pytest`` against an installed vLLM plus the patch.

    The installed package (``python``'s ``package``, e.g. ``vllm``) is laid under the patched
    files in a symlink overlay on ``PYTHONPATH``; the tree's ``tests/`` is copied next to
    nothing else, so pytest cannot import the source tree's package directory instead.
    ``extra_path`` is prepended to ``PYTHONPATH`` after the overlay (e.g. vLLM test-only
    dependencies).
    """

    python: str = sys.executable
    workdir: Path | None = None
    extra_path: str = ""
    timeout_s: int = 1800
    env: dict[str, str] | None = None
    installed: Path | None = None
    """The installed package directory (default: where ``python`` imports ``package`` from)."""
    package: str = "vllm"
    """The import package the patches change (the target's: ``vllm``, ``b12x``)."""

    def __call__(
        self, tree: Path, changed: Sequence[str], tests: Sequence[str], keyword: str | None = None
    ) -> TestRun:
        files = tuple(tests)
        installed = self.installed or installed_package_dir(self.python, self.package)
        if installed is None:
            return TestRun(files, None, f"not run: {self.python} has no {self.package} installed")
        with tempfile.TemporaryDirectory(dir=self.workdir, prefix="tests-") as tmp:
            run = Path(tmp)
            overlay = overlay_package(installed, tree, changed, run)
            shutil.copytree(tree / "tests", run / "run" / "tests", symlinks=True)
            env = {**os.environ, **hub_offline_env(), **(self.env or {})}
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(overlay), self.extra_path) if p)
            argv = [self.python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files]
            if keyword is not None:
                argv += ["-k", keyword]
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    argv,
                    cwd=run / "run",
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                return TestRun(
                    files, False, f"timed out after {self.timeout_s} s", seconds=self.timeout_s
                )
            seconds = round(time.monotonic() - started, 1)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        if proc.returncode == PYTEST_NO_TESTS:
            # Every test skipped itself at module level (e.g. "CUDA required"): not a CPU test.
            reasons = [line for line in lines if line.startswith("SKIPPED")]
            if keyword is not None and not reasons:  # the Test Plan's -k matches nothing
                return TestRun(
                    files, False, f"-k {keyword!r} selects no test", tuple(lines[-15:]), seconds
                )
            why = reasons[0].split(": ", 1)[-1] if reasons else pytest_summary(lines)
            return TestRun(files, None, f"not run on CPU: {why}", tuple(lines[-15:]), seconds)
        return TestRun(
            files, proc.returncode == 0, pytest_summary(lines), tuple(lines[-15:]), seconds
        )


def pytest_summary(lines: Sequence[str]) -> str:
    """pytest's final counts line (e.g. ``21 passed in 7.7s``), or its last line."""
    for line in reversed(lines):
        if _PYTEST_COUNTS.search(line) and " in " in line:
            return line.strip("= ").strip()
    return lines[-1].strip() if lines else "no output"


def table(results: Sequence[Standalone]) -> list[str]:
    """The check table: patch -> standalone verdict -> tests."""
    rows = [("patch", "standalone", "tests")]
    for r in results:
        tests = "-" if r.tests is None else r.tests.summary
        if r.tests is not None and r.tests.ok is False:
            tests = "FAILED: " + tests
        rows.append((r.name, r.describe(), tests))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}".rstrip() for a, b, c in rows]


def python_package_version(python: str, package: str = "vllm") -> str | None:
    """The installed distribution version of ``package`` for ``python`` (None: not installed)."""
    code = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"
    try:
        proc = subprocess.run(
            [python, "-c", code, package], capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


CHECK_SCHEMA_VERSION = 1


def test_run_record(tests: TestRun | None) -> dict[str, object] | None:
    """A patch's test run as JSON (None: the patch has no tests to run)."""
    if tests is None:
        return None
    return {
        "files": list(tests.files),
        "ok": tests.ok,
        "summary": tests.summary,
        "selections": dict(tests.selections),
        "seconds": tests.seconds,
    }


def checkout_revision(root: Path) -> dict[str, object]:
    """The checkout's git HEAD and whether ``series``, ``pins.toml`` or ``patches/`` differ from
    it (both None when ``root`` is no git checkout or git cannot say)."""
    try:
        state = series_checkout_state(root)
    except ExternalToolError:
        state = None
    if state is None:
        return {"git_revision": None, "series_uncommitted": None}
    head, dirty = state
    return {"git_revision": head, "series_uncommitted": bool(dirty)}


def check_record(
    results: Sequence[Standalone],
    *,
    bases: dict[str, dict[str, object]],
    tests: dict[str, object] | None,
    require_tests: bool,
    command: Sequence[str],
    seconds: float,
    patch_sha256: Mapping[str, str],
    checkout: Mapping[str, object],
) -> dict[str, object]:
    """The standalone check as one JSON document (``export --check --json``): what was checked
    (each patch file's sha256, the checkout's revision) against what (each target's base pin,
    the test python and its vLLM, the environment the tests got) on which machine, each patch's
    verdict and test summary, and the totals."""
    from patchset import __version__

    patches = []
    for r in results:
        patches.append(
            {
                "name": r.name,
                "sha256": patch_sha256[r.name],
                "verdict": r.verdict,
                "standalone": r.describe(),
                "depends_on": list(r.depends_on),
                "needs": list(r.needs),
                "problems": list(r.problems),
                "passed": r.passed,
                "tests": test_run_record(r.tests),
            }
        )
    ran = [r.tests for r in results if r.tests is not None]
    return {
        "schema_version": CHECK_SCHEMA_VERSION,
        "tool": f"patchset {__version__}",
        "command": list(command),
        **checkout,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "bases": bases,
        "tests": tests,
        "require_tests": require_tests,
        "patches": patches,
        "summary": {
            "patches": len(results),
            "standalone_ok": sum(1 for r in results if r.verdict == "ok" and not r.problems),
            "needs": [r.name for r in results if r.verdict == "needs"],
            "does_not_apply": [r.name for r in results if r.verdict == "fails"],
            "tests_passed": sum(1 for t in ran if t.ok is True),
            "tests_failed": [r.name for r in results if r.tests and r.tests.ok is False],
            "tests_not_run": [r.name for r in results if r.tests and r.tests.ok is None],
            "without_tests": [r.name for r in results if r.tests is None],
            "passed": all(r.passed for r in results),
        },
        "wall_s": round(seconds, 1),
    }
