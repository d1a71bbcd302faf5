"""README's Commands section lists every ``patchset`` command and every ``make`` target, once,
and nothing that does not exist: the commands come from the CLI's own parser, the targets
from the Makefile's ``.PHONY`` lines."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from patchset.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def cli_commands() -> set[str]:
    """The subcommands ``patchset`` accepts."""
    actions = build_parser()._actions
    sub = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def make_targets() -> set[str]:
    """Every target the Makefile declares ``.PHONY`` (continuation lines included)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    return {
        name
        for line in text.splitlines()
        if line.startswith(".PHONY:")
        for name in line.removeprefix(".PHONY:").split()
    }


def readme_commands() -> list[tuple[str, str]]:
    """(``patchset`` or ``make``, name) for each line of README's Commands section that
    starts with one, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Commands\n(.*?)^## ", text, re.MULTILINE | re.DOTALL)
    assert match, "README.md has no '## Commands' section"
    found = re.findall(r"^(patchset|make) ([a-z][a-z0-9-]*)", match.group(1), re.MULTILINE)
    return [(tool, name) for tool, name in found]


def test_readme_lists_every_patchset_command_once() -> None:
    listed = [name for tool, name in readme_commands() if tool == "patchset"]
    assert sorted(listed) == sorted(set(listed)), f"listed twice: {listed}"
    assert set(listed) == cli_commands(), (
        f"missing from README: {sorted(cli_commands() - set(listed))}; "
        f"not a command: {sorted(set(listed) - cli_commands())}"
    )


def test_readme_lists_every_make_target_once() -> None:
    listed = [name for tool, name in readme_commands() if tool == "make"]
    assert sorted(listed) == sorted(set(listed)), f"listed twice: {listed}"
    assert set(listed) == make_targets(), (
        f"missing from README: {sorted(make_targets() - set(listed))}; "
        f"not a target: {sorted(set(listed) - make_targets())}"
    )
