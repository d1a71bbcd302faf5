"""The base's own pre-commit hooks on the files each patch touches (``patchset lint``).

vLLM's ``.pre-commit-config.yaml`` runs, besides ruff, a set of local Python checkers
(``tools/pre_commit/*.py``: forbidden imports, ``torch.cuda`` calls, test tethering, SPDX, lazy
imports, config docstrings, ...). A PR fails vLLM's pre-commit job when one of them fails on
the files it changes, so each patch is checked as its PR would be:

* a scratch copy of the pristine base, committed to a scratch git repository (some hooks ask
  ``git ls-files``), is brought to each patch's state in series order (every earlier patch of
  the target applied, then this one);
* each hook of ``language: python`` runs the way pre-commit runs it: with the patch's touched
  paths that its ``files`` / ``exclude`` / ``types`` / ``types_or`` select (and the config's
  top-level ``exclude``), passed as arguments unless ``pass_filenames: false``;
* a hook that fails on the patch's state is rerun on the state before the patch (the same
  paths, those that existed); when it fails there too, only the output lines the patch adds
  are the patch's (none: a note). A hook that changes a file fails, as under pre-commit.

The hooks run in one environment, as pre-commit's do in theirs: :func:`hook_env` makes a venv in
the download cache holding the union of the hooks' ``additional_dependencies`` (``mypy`` with its
pinned version, stubs and pydantic plugin among them) and puts its ``bin`` first on ``PATH``.
Hooks of other languages (``system``, ``script``: shell and Rust tooling) are not run; each run
says so. ``types`` are matched by file suffix (pre-commit's ``identify`` also reads shebangs;
the series adds no extension-less scripts).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import ExternalToolError, PatchsetError
from patchset.fetch import file_lock
from patchset.gitops import ScratchRepo

CONFIG = ".pre-commit-config.yaml"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_TYPE_SUFFIXES: dict[str, tuple[str, ...]] = {
    "file": ("",),
    "text": ("",),
    "python": (".py", ".pyi"),
    "pyi": (".pyi",),
    "jupyter": (".ipynb",),
    "rust": (".rs",),
    "proto": (".proto",),
    "png": (".png",),
    "yaml": (".yaml", ".yml"),
    "json": (".json",),
    "markdown": (".md",),
    "shell": (".sh",),
}
"""pre-commit ``types`` tags by file suffix ("" = any file)."""


@dataclass(frozen=True)
class Hook:
    """One local Python hook of the base's pre-commit config."""

    id: str
    argv: tuple[str, ...]
    """The entry, split as a shell would (``python`` first)."""
    files: str = ""
    exclude: str = ""
    types: tuple[str, ...] = ()
    types_or: tuple[str, ...] = ()
    pass_filenames: bool = True

    def selects(self, path: str, global_exclude: str = "") -> bool:
        """Whether pre-commit would hand ``path`` to this hook."""
        if global_exclude and re.search(global_exclude, path):
            return False
        if self.files and not re.search(self.files, path):
            return False
        if self.exclude and re.search(self.exclude, path):
            return False
        if self.types and not all(_has_type(path, t) for t in self.types):
            return False
        return not self.types_or or any(_has_type(path, t) for t in self.types_or)


def _has_type(path: str, tag: str) -> bool:
    suffixes = _TYPE_SUFFIXES.get(tag)
    if suffixes is None:
        return False  # a tag this matcher does not know selects nothing (said in the notes)
    return any(path.endswith(s) for s in suffixes)


@dataclass(frozen=True)
class HookConfig:
    """The runnable hooks of a base, the global ``exclude``, what is not run and why, and the
    requirements their environment needs (the hooks' ``additional_dependencies``, sorted)."""

    hooks: tuple[Hook, ...]
    exclude: str = ""
    not_run: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()


def load_config(text: str) -> HookConfig:
    """Parse a ``.pre-commit-config.yaml``: its ``repo: local`` hooks of ``language: python``
    become :class:`Hook` s; every other local hook and each id in :data:`NOT_RUN` is listed in
    ``not_run`` with the reason."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PatchsetError(f"{CONFIG}: not valid YAML ({exc})") from exc
    hooks: list[Hook] = []
    not_run: list[str] = []
    requirements: set[str] = set()
    for repo in data.get("repos") or []:
        if repo.get("repo") != "local":
            continue  # ruff (patchset lint's own check), typos, markdownlint, ...: remote hooks
        for raw in repo.get("hooks") or []:
            hook_id = str(raw.get("id"))
            if raw.get("language") != "python":
                not_run.append(f"{hook_id} (language {raw.get('language')})")
                continue
            unknown = [t for t in _tags(raw) if t not in _TYPE_SUFFIXES]
            if unknown:
                not_run.append(f"{hook_id} (file types {', '.join(unknown)})")
                continue
            requirements.update(str(r) for r in raw.get("additional_dependencies") or ())
            hooks.append(
                Hook(
                    id=hook_id,
                    argv=tuple(shlex.split(str(raw["entry"]))) + tuple(raw.get("args") or ()),
                    files=str(raw.get("files") or ""),
                    exclude=str(raw.get("exclude") or ""),
                    types=tuple(raw.get("types") or ()),
                    types_or=tuple(raw.get("types_or") or ()),
                    pass_filenames=bool(raw.get("pass_filenames", True)),
                )
            )
    return HookConfig(
        tuple(hooks), str(data.get("exclude") or ""), tuple(not_run), tuple(sorted(requirements))
    )


def hook_env(cache: Path, requirements: Sequence[str], *, offline: bool = False) -> str:
    """The python of a venv under ``cache`` that holds ``requirements`` (pip installs them once).

    The venv is reused while its marker names the same requirements and this interpreter; one
    without the marker (a killed run, a failed pip) is removed and made again. ``offline``: a
    venv that is not made yet is an error, not a download.
    """
    wanted = sorted(set(requirements))
    key = hashlib.sha256(json.dumps([sys.version, wanted]).encode()).hexdigest()[:16]
    env = cache / f"hook-env-{key}"
    python = env / "bin" / "python"
    marker = env / ".patchset-hook-env"
    text = json.dumps({"python": sys.version, "requirements": wanted}, indent=1) + "\n"
    cache.mkdir(parents=True, exist_ok=True)
    with file_lock(cache / f".hook-env-{key}.lock"):
        if marker.is_file() and marker.read_text(encoding="utf-8") == text and python.exists():
            return str(python)
        if offline:
            raise PatchsetError(
                f"the pre-commit hooks' environment {env} is not made and --offline forbids pip",
                hint="run once without --offline, or pass --hooks-python",
            )
        if env.exists():
            shutil.rmtree(env)
        _run([sys.executable, "-m", "venv", *([] if wanted else ["--without-pip"]), str(env)])
        if wanted:
            pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            _run([*pip, *wanted])
        marker.write_text(text, encoding="utf-8")
    return str(python)


def _run(argv: list[str]) -> None:
    env = {**os.environ, "PIP_NO_INPUT": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise ExternalToolError(
            f"making the pre-commit hooks' environment failed (exit {proc.returncode}): "
            f"{shlex.join(argv)}",
            details=(proc.stdout + proc.stderr).strip().splitlines()[-20:],
            hint="check the network and the index, or pass --hooks-python",
        )


def _tags(raw: Mapping[str, Any]) -> list[str]:
    return [str(t) for t in (*(raw.get("types") or ()), *(raw.get("types_or") or ()))]


@dataclass(frozen=True)
class HookRun:
    """One hook on one patch's paths: ``ok`` False is a failure the patch brings (``output``:
    the lines that say so; for a hook failing before the patch too, the lines it adds)."""

    hook: str
    paths: tuple[str, ...]
    ok: bool
    output: tuple[str, ...] = ()
    before_too: bool = False
    """It fails on the state before the patch as well (its failure there is not the patch's)."""


class HookTree:
    """A scratch git checkout of a base that is moved from patch state to patch state."""

    def __init__(self, base: Path, root: Path, python: str):
        self.repo = ScratchRepo.create(root / "tree")  # no user config, no hooks (gitops)
        self.path = self.repo.path
        self.python = python
        self.repo.import_tree(base, "base")

    def write(self, images: Mapping[str, bytes | None]) -> None:
        """Make each path hold its image (None: absent), in the files and git's index."""
        for rel, data in images.items():
            path = self.path / rel
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        if images:
            self.repo.git("add", "-A", "-f", "--", *images)

    def _environ(self) -> dict[str, str]:
        """This environment with the hook python's ``bin`` first on ``PATH`` (a hook may call
        a tool of its environment by name, as vLLM's mypy hook calls ``mypy``)."""
        bin_dir = Path(self.python).parent
        env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
        if (bin_dir.parent / "pyvenv.cfg").is_file():
            env["VIRTUAL_ENV"] = str(bin_dir.parent)
        return env

    def run(self, hook: Hook, paths: Sequence[str]) -> tuple[bool, tuple[str, ...]]:
        """Run ``hook`` as pre-commit would; (passed, its output lines). A hook that changed a
        file it was given fails; the change is undone."""
        argv = list(hook.argv)
        if argv and argv[0] in ("python", "python3"):
            argv[0] = self.python
        if hook.pass_filenames:
            argv += list(paths)
        before = {p: _read(self.path / p) for p in paths}
        try:
            proc = subprocess.run(
                argv,
                cwd=self.path,
                env=self._environ(),
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, (f"could not run {shlex.join(argv[:2])}: {exc}",)
        text = _ANSI.sub("", proc.stdout + proc.stderr)
        lines = tuple(line.rstrip() for line in text.strip().splitlines())
        missing = [line for line in lines if "ModuleNotFoundError" in line]
        if proc.returncode != 0 and missing:  # the environment's fault, not the patch's
            raise PatchsetError(
                f"pre-commit hook {hook.id} cannot run with {self.python}: {missing[-1].strip()}",
                hint="install the hook's additional_dependencies (.pre-commit-config.yaml) "
                "there, or pass another python",
            )
        changed = [p for p, data in before.items() if _read(self.path / p) != data]
        for p in changed:
            self.write({p: before[p]})
        if changed:
            lines += (f"the hook changed {', '.join(changed)} (reverted)",)
        return proc.returncode == 0 and not changed, lines


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@contextmanager
def hook_tree(base: Path, python: str, workdir: Path | None = None) -> Iterator[HookTree]:
    with tempfile.TemporaryDirectory(dir=workdir, prefix="precommit-") as tmp:
        yield HookTree(base, Path(tmp), python)


def check_patch(
    tree: HookTree,
    config: HookConfig,
    images: Mapping[str, tuple[bytes | None, bytes | None]],
) -> list[HookRun]:
    """Run every hook that selects one of the patch's paths on the tree at the patch's state
    (``images``: path -> (preimage, postimage); the tree holds the preimages on entry and the
    postimages on return). A failing hook is rerun on the preimages to tell whose it is."""
    post = {p: img[1] for p, img in images.items()}
    pre = {p: img[0] for p, img in images.items()}
    tree.write(post)
    runs: list[HookRun] = []
    for hook in config.hooks:
        paths = tuple(
            p for p, data in post.items() if data is not None and hook.selects(p, config.exclude)
        )
        if not paths:
            continue
        ok, output = tree.run(hook, paths)
        if ok:
            runs.append(HookRun(hook.id, paths, True))
            continue
        tree.write(pre)
        existed = tuple(p for p in paths if pre[p] is not None)
        before: tuple[str, ...] = ()
        before_ok = True
        if existed or not hook.pass_filenames:
            before_ok, before = tree.run(hook, existed)
        tree.write(post)
        if before_ok:
            runs.append(HookRun(hook.id, paths, False, output))
            continue
        # failing before the patch too: only what the patch adds to the output is its own
        new = tuple(line for line in output if line not in set(before))
        runs.append(HookRun(hook.id, paths, not new, new, before_too=True))
    return runs
