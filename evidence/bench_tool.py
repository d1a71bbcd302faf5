"""Benchmark the tool (not a test): apply+verify of the whole series, and the overlay wheel build.

Each figure is the wall time of the real command line (``python -m patchset ...``, interpreter
start included) on a fresh vLLM tree unpacked from the pinned sdist (the unpack is not timed).
Targets on 2 cores: apply+verify <= 2 s, wheel <= 60 s. Writes
``results/bench_tool-<UTC time>.json`` with the command, git revision, machine and figures.

    python evidence/bench_tool.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "evidence"))

import provenance  # noqa: E402
from patchset.fetch import unpack_sdist  # noqa: E402
from patchset.series import for_target, load_series  # noqa: E402

TARGETS_S = {"apply_verify": 2.0, "wheel": 60.0}


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return elapsed


def machine() -> dict[str, Any]:
    """The shared provenance record, without GPUs; the load the runs started under."""
    info = provenance.machine(gpus=False)
    info["load_avg_1m_at_start"] = info.pop("load_avg_1m")
    return info


def git_revision() -> str:
    return provenance.git_revision(dirty=True) or "unknown"


def summary(samples: list[float]) -> dict[str, Any]:
    return {
        "samples_s": [round(s, 3) for s in samples],
        "min_s": round(min(samples), 3),
        "median_s": round(statistics.median(samples), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "results")
    args = parser.parse_args()
    host = machine()  # before the runs, so the load average is the one they started under
    patchset = [sys.executable, "-m", "patchset", "-C", str(REPO)]
    patches = for_target(load_series(REPO), "vllm")
    apply_verify: list[float] = []
    wheel: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-tool-") as tmp:
        work = Path(tmp)
        for i in range(args.repeat):
            tree = work / f"vllm-{i}"
            unpack_sdist("vllm", tree, root=REPO)
            apply_s = timed([*patchset, "apply", "--tree", str(tree)]) if patches else 0.0
            verify_s = timed([*patchset, "verify", "--tree", str(tree)]) if patches else 0.0
            apply_verify.append(apply_s + verify_s)
            wheel.append(timed([*patchset, "wheel", "--tree", str(tree), "--out", str(work / "d")]))
            shutil.rmtree(tree)
    figures = {"apply_verify": summary(apply_verify), "wheel": summary(wheel)}
    result = {
        "benchmark": "bench_tool",
        "command": provenance.command(),
        "git_revision": git_revision(),
        "machine": host,
        "series": {"vllm_patches": len(patches), "names": [p.name for p in patches]},
        "figures": figures,
        "targets_s": TARGETS_S,
        "within_targets": {k: figures[k]["median_s"] <= v for k, v in TARGETS_S.items()},
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"bench_tool-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    path.write_text(text)
    print(text, end="")
    print(f"wrote {path}")
    return 0 if all(result["within_targets"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
