"""No tracked file names a path that exists on one machine only.

A lab machine's folders (``/work/...``, ``/root/...``, ``/opt/<tool>/...``), a user's home
(``/home/<user>``, ``/Users/<user>``) and a named folder under ``/tmp`` mean nothing on another
machine: commands and defaults say ``<tree>``, ``<venv>``, ``<work>`` or a path relative to the
repository instead, and a script's scratch default is made under ``tempfile.gettempdir()``.

``results/`` is not checked: its files are run records, and the command and paths each one
records (where the run wrote, which tree it imported) are part of what it measured; a record is
never edited after its run. What the repository renders from them (design/results.md, the
README's status table) shows those commands without the machine's paths and is checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

MACHINE_PATH = re.compile(
    r"(?<![\w.~/<>$])"  # the start of a path, not a part of one, a URL or `$VAR/...`
    r"(?:/work/|/root/|/home/|/Users/|/opt/|/mnt/|/scratch/|/tmp/)[\w.-]+"
)
"""An absolute path under a folder that is one machine's own."""

EXCLUDED = ("results/", "tests/test_machine_paths.py")
"""Run records (the module docstring says why), and this file: it names what it looks for."""

ALLOWED = {
    ("tests/test_fetch.py", "/tmp/escape.py"): "an absolute tar member name the extractor refuses",
    ("tests/test_safetar.py", "/tmp/escape.py"): "an absolute tar member name safetar refuses",
    ("evidence/tests/test_results_tables.py", "/root/lab"): "a recorded command the tables redact",
}
"""(file, path) pairs that are data, not a machine's folder: why each one is."""


def tracked_files() -> list[str]:
    """The files git tracks, and those it would (untracked, not ignored: a file not yet added)."""
    listing = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), *listing], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): the tracked files are unknown")
    return [name for name in out.decode().split("\0") if name]


def machine_paths(text: str) -> list[str]:
    """The machine paths ``text`` names, in order."""
    return MACHINE_PATH.findall(text)


def test_the_pattern_finds_machine_paths_and_leaves_relative_and_placeholder_paths() -> None:
    text = (
        "cd /work/lab && /root/lab/bin/python x.py --work=/tmp/lab --venv /home/lab/v\n"
        "ok: <tree>/vllm, $OUT/gate, build/tmp/x, https://example.org/home/a, ~/src/vllm,\n"
        "ok: ${TMPDIR:-/tmp}/dcp-res, /tmp alone, /dev/null, /proc/cpuinfo, a/work/b\n"
    )
    assert machine_paths(text) == ["/work/lab", "/root/lab", "/tmp/lab", "/home/lab"]


def test_no_tracked_file_outside_results_names_a_machine_path() -> None:
    hits = []
    for name in tracked_files():
        if name.startswith(EXCLUDED):
            continue
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary, or deleted / a submodule in this working tree
        for number, line in enumerate(text.splitlines(), 1):
            for path in machine_paths(line):
                if (name, path) not in ALLOWED:
                    hits.append(f"{name}:{number}: {path}")
    assert hits == []
