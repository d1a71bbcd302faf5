"""Run ``make test``'s suites on every core, each suite's output kept whole, each one timed.

Usage: ``run_suites.py [--jobs N] [--logs DIR] NAME=COMMAND ...`` (a COMMAND is a shell line).

- Suites start in the order given, at most ``--jobs`` at a time (default: the number of CPUs,
  at most 2 here): list the longest first. A suite that fails does not stop the others.
- Each suite writes to ``<logs>/<name>.log``; when it ends, its whole log is printed in one
  block under ``== <name>`` (so pytest's closing line of every suite is in the output, never
  interleaved with another suite's), then its verdict and wall time.
- At the end: one line per suite (verdict, seconds), the run's wall time, and the exit status
  1 when any suite failed, else 0. SIGINT/SIGTERM stop every suite's process group.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

NAME = re.compile(r"[a-z][a-z0-9-]*\Z")


@dataclass
class Suite:
    name: str
    command: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    seconds: float = 0.0
    returncode: int | None = None
    out: IO[bytes] | None = None


def parse_suite(spec: str, logs: Path) -> Suite:
    name, sep, command = spec.partition("=")
    if not sep or not NAME.match(name) or not command.strip():
        raise SystemExit(f"run_suites: {spec!r} is not NAME=COMMAND (NAME: {NAME.pattern})")
    return Suite(name, command, logs / f"{name}.log")


def default_jobs() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 2))


def start(suite: Suite) -> None:
    suite.log.parent.mkdir(parents=True, exist_ok=True)
    suite.out = suite.log.open("wb")
    suite.started = time.monotonic()
    suite.proc = subprocess.Popen(
        ["bash", "-c", suite.command],
        stdin=subprocess.DEVNULL,
        stdout=suite.out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finish(suite: Suite, returncode: int) -> None:
    suite.returncode = returncode
    suite.seconds = time.monotonic() - suite.started
    if suite.out is not None:
        suite.out.close()
    verdict = "passed" if returncode == 0 else f"FAILED (exit {returncode})"
    sys.stdout.write(f"== {suite.name}: {suite.command}\n")
    sys.stdout.flush()
    with suite.log.open("rb") as log:
        while chunk := log.read(1 << 16):
            sys.stdout.buffer.write(chunk)
    sys.stdout.write(f"== {suite.name}: {verdict} in {suite.seconds:.0f} s\n")
    sys.stdout.flush()


def stop_all(suites: list[Suite]) -> None:
    for suite in suites:
        if suite.proc is not None and suite.proc.poll() is None:
            try:
                os.killpg(suite.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def run(suites: list[Suite], jobs: int) -> int:
    begin = time.monotonic()
    waiting = list(suites)
    running: list[Suite] = []
    names = ", ".join(s.name for s in suites)
    print(f"run_suites: {len(suites)} suite(s) ({names}), {jobs} at a time", flush=True)
    while waiting or running:
        while waiting and len(running) < jobs:
            suite = waiting.pop(0)
            start(suite)
            running.append(suite)
        time.sleep(0.2)
        for suite in list(running):
            assert suite.proc is not None
            code = suite.proc.poll()
            if code is not None:
                running.remove(suite)
                finish(suite, code)
    print("== suite times")
    for suite in suites:
        verdict = "passed" if suite.returncode == 0 else f"FAILED (exit {suite.returncode})"
        print(f"  {suite.name}: {verdict} in {suite.seconds:.0f} s")
    failed = [s.name for s in suites if s.returncode != 0]
    wall = time.monotonic() - begin
    verdict = "FAILED: " + ", ".join(failed) if failed else "all passed"
    print(f"run_suites: {verdict} in {wall:.0f} s")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="suites at a time")
    parser.add_argument("--logs", type=Path, default=Path("build") / "test-logs")
    parser.add_argument("suites", nargs="+", metavar="NAME=COMMAND")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    suites = [parse_suite(spec, args.logs) for spec in args.suites]
    seen = [s.name for s in suites]
    if len(set(seen)) != len(seen):
        parser.error(f"suite names repeat: {seen}")

    def on_signal(signum: int, _frame: object) -> None:
        stop_all(suites)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return run(suites, args.jobs)
    finally:
        stop_all(suites)


if __name__ == "__main__":
    raise SystemExit(main())
