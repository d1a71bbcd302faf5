#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A GPU lease's vLLM-tree test logs as one result record.

``evidence/dev/gpu_h200_session.sh tree-tests`` runs the series' test files on the patched tree,
one pytest per file, and logs each as ``== <file>``, pytest's output and ``== <file>: rc=N
(...)``, or ``== <file>: not run (stage time out)``. This script reads one or more such logs
(``tree-tests-h200.log``, or the ``lease-logs.tgz`` a lease call brought back) and writes per
file: its exit status, pytest's counts (passed, failed, skipped, errors), the test it was in
when a time limit cut it (pytest printed no summary; its counts are then the outcomes its
verbose lines reached), and whether it ran at all. A file that several logs ran keeps the run
that went furthest (a finished run over a cut one over none).

    python3 evidence/tree_tests_record.py --gpu "NVIDIA H100 80GB HBM3" \\
        --out results/tree-tests-h100-0.34.0.json build/leases/STAMP/gpu-lease-logs*.tgz

Fails when no log holds a test file, or when a file failed (``failed`` or ``errors`` above 0).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import provenance  # noqa: E402

HEADER = re.compile(r"^== (\S+\.py)$")
# the end marker: on its own line, or after the last test id of a run a time limit cut
END = re.compile(r"(?:^|\s)== (\S+\.py): (?:rc=(\d+)|not run)")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")
SUMMARY = re.compile(r"^=+ .* in [\d.]+s")
NODE = re.compile(r"^(\S+\.py::\S+)(?: (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b)?")
VERBOSE = {
    "PASSED": "passed",
    "FAILED": "failed",
    "SKIPPED": "skipped",
    "ERROR": "errors",
    "XFAIL": "xfailed",
    "XPASS": "xpassed",
}
LOG_NAME = "tree-tests-h200.log"


def _entry(
    rc: str | None, summary: str | None, last_node: str | None, seen: dict[str, int]
) -> dict[str, Any]:
    """One file's run: its counts from pytest's summary line, or, without one (a time limit or
    a crash cut it), from the outcomes its verbose lines reached."""
    counts: dict[str, int] = {} if summary else dict(seen)
    for n, kind in COUNT.findall(summary or ""):
        key = "errors" if kind.startswith("error") else kind
        counts[key] = counts.get(key, 0) + int(n)
    status = "not run" if rc is None else "finished" if summary else "cut"
    return {
        "status": status,
        "rc": None if rc is None else int(rc),
        "counts": counts,
        "cut_in": last_node if status == "cut" else None,
    }


def parse(text: str) -> dict[str, dict[str, Any]]:
    """Per test file of one log: ``status`` (finished, cut, not run), ``rc``, pytest's
    ``counts`` and, for a cut run, ``cut_in``: the last test id its output reached."""
    files: dict[str, dict[str, Any]] = {}
    summary: str | None = None
    last_node: str | None = None
    seen: dict[str, int] = {}
    for line in text.splitlines():
        if HEADER.match(line):
            summary, last_node, seen = None, None, {}
            continue
        if SUMMARY.match(line):
            summary = line
        node = NODE.match(line)
        if node:
            last_node = node.group(1)
            if node.group(2):
                key = VERBOSE[node.group(2)]
                seen[key] = seen.get(key, 0) + 1
        end = END.search(line)
        if end:
            files[end.group(1)] = _entry(end.group(2), summary, last_node, seen)
            summary, last_node, seen = None, None, {}
    return files


_RANK = {"not run": 0, "cut": 1, "finished": 2}


def _progress(e: dict[str, Any]) -> tuple[int, int]:
    """How far a run went: finished > cut > not run, then the most tests counted."""
    return _RANK[e["status"]], sum(e["counts"].values())


def merge(logs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One entry per file: the run that went furthest (``_progress``)."""
    out: dict[str, dict[str, Any]] = {}
    for log in logs:
        for name, e in log.items():
            if name not in out or _progress(e) > _progress(out[name]):
                out[name] = e
    return out


def read_logs(path: Path) -> list[str]:
    """The tree-test logs in ``path``: the log itself, or every one inside a .tgz."""
    if not tarfile.is_tarfile(path):
        return [path.read_text(errors="replace")]
    texts = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(LOG_NAME):
                f = tar.extractfile(member)
                if f is not None:
                    texts.append(f.read().decode(errors="replace"))
    return texts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path, help="tree-test logs or lease-logs .tgz")
    ap.add_argument("--gpu", required=True, help="the GPU the lease ran on (its name)")
    ap.add_argument("--series", help="the series revision the lease ran (default: HEAD)")
    ap.add_argument("--base", default="0.34.0", help="the vLLM release of the tree")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    files = merge([parse(t) for p in args.logs for t in read_logs(p)])
    if not files:
        print("no test file in the logs", file=sys.stderr)
        return 1
    failed = sorted(
        n for n, e in files.items() if e["counts"].get("failed") or e["counts"].get("errors")
    )
    totals: dict[str, int] = {}
    for e in files.values():
        for k, v in e["counts"].items():
            totals[k] = totals.get(k, 0) + v
    doc = {
        "schema_version": 1,
        "kind": "tree_tests_gpu",
        "what": "the series' vLLM-tree test files on one GPU, one pytest per file",
        "command": provenance.command(None if argv is None else [__file__, *argv]),
        "revision": {"series": args.series or provenance.git_revision()},
        "base": {"vllm": args.base},
        "machine": {"gpus": [{"name": args.gpu}]},
        "files": dict(sorted(files.items())),
        "totals": totals,
        "finished": sorted(n for n, e in files.items() if e["status"] == "finished"),
        "cut": sorted(n for n, e in files.items() if e["status"] == "cut"),
        "not_run": sorted(n for n, e in files.items() if e["status"] == "not run"),
        "failed": failed,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{len(doc['finished'])} files finished, {len(doc['cut'])} cut, "
        f"{len(doc['not_run'])} not run; {totals}"
    )
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
