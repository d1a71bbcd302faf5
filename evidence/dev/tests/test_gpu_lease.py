# SPDX-License-Identifier: Apache-2.0
"""The lease script's first call, dry-run on CPU with stub commands: it runs the two benches
(the session script's stages) before the gates start, detaches the tree tests, and returns
its results in at most 8 files under $OUT."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

STUB_PYTHON = """#!/bin/bash
echo "$PWD: $*" >> "$CALLS"
out=$(echo "$*" | sed -n 's/.*--out \\([^ ]*\\).*/\\1/p')
case "$*" in
  *bench_sparse_mla_kernel*|*bench_dcp_topk*) echo '{}' > "$out" ;;
  *"-m pytest"*) echo "1 passed" ;;
  *prewarm_flashinfer*) sleep 1; echo "prewarm done" >> "$CALLS" ;;
esac
exit 0
"""


def lease_call(tree: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`gpu_lease.sh ARGS` in the stub tree."""
    return subprocess.run(
        ["bash", "evidence/dev/gpu_lease.sh", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def first_call(tree: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`gpu_lease.sh first 500` in the stub tree."""
    return lease_call(tree, env, "first", "500")


def stub_lease_tree(tmp_path: Path) -> tuple[Path, dict[str, str], Path, Path]:
    """A working tree as a lease call carries it (scripts, .gpu stubs, the last staging part,
    the overlay and the test bundle) and an environment whose python3 and nvidia-smi are
    stubs that log their calls: (tree, env, out, calls)."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "evidence", tree / "evidence")
    for name in ("device-install", "device-overlay"):
        (tree / ".gpu").mkdir(exist_ok=True)
        (tree / ".gpu" / f"{name}.sh").write_text("true\n")
    (tree / ".gpu" / "device-env.sh").write_text("true\n")
    (tree / ".gpu" / "device-recv.sh").write_text('echo "device-recv $PWD" >> "$CALLS"\n')
    (tree / ".gpu-parts" / "31").mkdir(parents=True)
    (tree / ".gpu-parts" / "31" / "chunk.v03").write_text("part")
    (tree / ".gpu-tests").mkdir()
    (tree / ".gpu-tests" / "SERIES_TESTS").write_text("tests/x.py\n")
    (tree / ".gpu-overlay").mkdir()
    (tree / ".gpu-overlay" / "MANIFEST").write_text("vllm/x.py\n")
    stub = tmp_path / "stub"
    stub.mkdir()
    for name, body in (("python3", STUB_PYTHON), ("nvidia-smi", "#!/bin/bash\n")):
        (stub / name).write_text(body)
        (stub / name).chmod(0o755)
    (tmp_path / "home" / "gpu-vllm-patched").mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    calls = tmp_path / "calls.log"
    env = {
        **os.environ,
        "PATH": f"{stub}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "OUT": str(out),
        "LEASE_ROOT": str(tmp_path / "root"),
        "CALL_S": "40",
        "CALLS": str(calls),
    }
    return tree, env, out, calls


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_first_call_orders_benches_before_gates_and_returns_few_files(tmp_path: Path) -> None:
    """FlashInfer's all-reduce module is built (detached) and the gate checkpoints are made
    beside the benches, the benches run before `dcp_gate.py start` (alone on the GPU), the
    tree tests run detached after it, and $OUT holds the bench archives, the logs and
    nothing else."""
    tree, env, out, calls = stub_lease_tree(tmp_path)
    first_call(tree, env).check_returncode()
    log = tmp_path / "root" / "lease" / "tree-tests" / "tree-tests-h200.log"
    for _ in range(50):  # the detached tree tests
        if log.is_file() and "passed" in log.read_text():
            break
        time.sleep(0.1)
    lines = calls.read_text().splitlines()
    # the carried staging part is received first; the environment is kept for later calls
    assert lines[0].startswith("device-recv ")
    assert (tmp_path / "root" / "device-env.sh").is_file()
    order = [
        next(i for i, line in enumerate(lines) if key in line)
        for key in ("bench_sparse_mla_kernel", "bench_dcp_topk", "dcp_gate.py start", "-m pytest")
    ]
    assert order == sorted(order)
    # the gate checkpoints are made beside the benches and finished before the gates start
    ckpt = next(i for i, line in enumerate(lines) if "dcp_gate.py checkpoints" in line)
    assert ckpt < order[2] and "--suites all" in lines[ckpt]
    assert "--suites all" in lines[order[2]] and "--deadline-s 500" in lines[order[2]]
    # FlashInfer's build is detached, and the gates start only once it is done
    done = lines.index("prewarm done")
    assert any("prewarm_flashinfer" in line for line in lines[:done]) and done < order[2]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["kernel.tar.gz", "lease-logs.tgz", "topk.tar.gz"]
    with tarfile.open(out / "kernel.tar.gz") as tar:
        assert "kernel-bench-h200-0.34.0.json" in tar.getnames()
    assert "passed" in log.read_text()
    # what later calls need is off the working tree (the next call replaces it)
    root = tmp_path / "root"
    assert (root / "overlay" / "MANIFEST").read_text() == "vllm/x.py\n"
    assert (root / "gpu-tests" / "SERIES_TESTS").is_file()
    assert lines[order[3]].startswith(f"{root / 'gpu-tests'}:")
    # LEASE_END_S fits the gates' deadline into the lease: it counts from the call's start,
    # less the collection margin, and the positional deadline is only an upper bound
    calls.write_text("")
    first_call(tree, {**env, "LEASE_END_S": "300"}).check_returncode()
    start = next(line for line in calls.read_text().splitlines() if "dcp_gate.py start" in line)
    fit = int(start.split("--deadline-s ")[1].split()[0])
    assert 300 - 90 - 15 <= fit <= 300 - 90
    # BENCH_STAGES=none runs no bench and still starts the gates
    calls.write_text("")
    shutil.rmtree(out)
    out.mkdir()
    quiet = first_call(tree, {**env, "BENCH_STAGES": "none"})
    quiet.check_returncode()
    assert "unknown stage" not in quiet.stdout + quiet.stderr
    text = calls.read_text()
    assert "bench_" not in text and "dcp_gate.py start" in text
    assert not (out / "kernel.tar.gz").exists() and not (out / "topk.tar.gz").exists()
    calls.write_text("")
    late = first_call(tree, {**env, "LEASE_END_S": "80"})
    assert late.returncode == 1 and "no time left for the gates" in late.stdout
    assert "dcp_gate.py start" not in calls.read_text()
    # a first call that does not carry the overlay or the bundle stops before any bench
    shutil.rmtree(tree / ".gpu-overlay")
    calls.write_text("")
    bad = first_call(tree, env)
    assert bad.returncode == 1 and "carry .gpu-overlay and .gpu-tests" in bad.stdout
    assert "bench_" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_first_call_reuses_a_landed_leases_runs_and_runs_only_the_named(tmp_path: Path) -> None:
    """GATE_REUSE puts a landed lease archive's run records into the gate work folder before
    the suite starts (the suite reuses finished runs), GATE_ONLY reaches `start --only`, and
    an archive without runs/ stops the call before the gates start."""
    tree, env, out, calls = stub_lease_tree(tmp_path)
    src = tmp_path / "landed"
    (src / "runs").mkdir(parents=True)
    (src / "runs" / "p-a.json").write_text('{"ok": true}\n')
    (src / "status.json").write_text("{}\n")
    with tarfile.open(tree / "lease.tgz", "w:gz") as tar:
        tar.add(src / "runs", arcname="runs")
        tar.add(src / "status.json", arcname="status.json")
    env = {**env, "BENCH_STAGES": "none", "GATE_REUSE": "lease.tgz", "GATE_ONLY": "p-b,p-c"}
    got = first_call(tree, env)
    got.check_returncode()
    gate = tmp_path / "root" / "gate"
    assert (gate / "runs" / "p-a.json").read_text() == '{"ok": true}\n'
    assert not (gate / "status.json").exists()
    assert "reusing 1 runs of lease.tgz" in got.stdout
    start = next(line for line in calls.read_text().splitlines() if "dcp_gate.py start" in line)
    assert "--only p-b,p-c" in start
    with tarfile.open(tree / "empty.tgz", "w:gz") as tar:
        tar.add(src / "status.json", arcname="status.json")
    calls.write_text("")
    bad = first_call(tree, {**env, "GATE_REUSE": "empty.tgz"})
    assert bad.returncode == 1 and "no runs/ in empty.tgz" in bad.stdout
    assert "dcp_gate.py start" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_first_call_passes_the_rank_limit_and_can_leave_out_the_tree_tests(
    tmp_path: Path,
) -> None:
    """GATE_MAX_RANKS reaches `start --max-ranks` (unset: the launcher's default), and
    TREE_STAGE_S=0 starts the gates without the tree tests beside them."""
    tree, env, out, calls = stub_lease_tree(tmp_path)
    env = {**env, "BENCH_STAGES": "none", "GATE_MAX_RANKS": "24", "TREE_STAGE_S": "0"}
    first_call(tree, env).check_returncode()
    time.sleep(0.5)  # a detached tree-test stage would have logged its pytest by now
    text = calls.read_text()
    start = next(line for line in text.splitlines() if "dcp_gate.py start" in line)
    assert "--max-ranks 24" in start
    assert "-m pytest" not in text
    calls.write_text("")
    del env["GATE_MAX_RANKS"], env["TREE_STAGE_S"]
    first_call(tree, env).check_returncode()
    for _ in range(50):
        if "-m pytest" in calls.read_text():
            break
        time.sleep(0.1)
    text = calls.read_text()
    start = next(line for line in text.splitlines() if "dcp_gate.py start" in line)
    assert "--max-ranks" not in start and "-m pytest" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_logs_changing_while_packed_do_not_fail_the_call(tmp_path: Path) -> None:
    """The detached tree tests may write their logs while the call packs them: tar's status
    1 (a file changed as it was read; the archive is written) leaves the call's status 0,
    a worse tar status still fails it."""
    tree, env, out, calls = stub_lease_tree(tmp_path)
    real_tar = shutil.which("tar")
    stub = Path(env["PATH"].split(":")[0]) / "tar"
    stub.write_text(
        f'#!/bin/bash\n"{real_tar}" "$@"; rc=$?\n'
        'case "$*" in *lease-logs.tgz*) exit "${TAR_RC:-$rc}" ;; esac\nexit $rc\n'
    )
    stub.chmod(0o755)
    env = {**env, "BENCH_STAGES": "none", "TREE_STAGE_S": "0"}
    assert first_call(tree, {**env, "TAR_RC": "1"}).returncode == 0
    assert (out / "lease-logs.tgz").is_file()
    assert first_call(tree, {**env, "TAR_RC": "2"}).returncode != 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tests_phase_installs_and_runs_only_the_tree_tests(tmp_path: Path) -> None:
    """`gpu_lease.sh tests` receives the carried part, installs, runs the tree tests in the
    foreground and returns their logs alone: no bench, no gate, no checkpoint."""
    tree, env, out, calls = stub_lease_tree(tmp_path)

    def tests_call(**extra: str) -> subprocess.CompletedProcess:
        return lease_call(tree, {**env, **extra}, "tests")

    # a call too short for the stage (its default: the call's seconds less 40) says so
    short = tests_call(CALL_S="60")
    assert short.returncode == 1 and "no time left for the tree tests" in short.stdout
    assert "-m pytest" not in calls.read_text()
    calls.write_text("")
    done = tests_call(CALL_S="120")
    done.check_returncode()
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("device-recv ")
    assert any("-m pytest" in line and "tests/x.py" in line for line in lines)
    assert not any("bench_" in line or "dcp_gate.py" in line for line in lines)
    assert "== tests/x.py: rc=0" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["lease-logs.tgz"]
    with tarfile.open(out / "lease-logs.tgz") as tar:
        assert "./tree-tests/tree-tests-h200.log" in tar.getnames()
    wrong = lease_call(tree, env, "later")
    assert wrong.returncode == 2 and "first | wait | tests" in wrong.stdout


STAGE_PYTHON = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in
  *"pip install"*) exit 0 ;;
  *--noconftest*tests/b.py) echo "1 failed"; exit 1 ;;
  *tests/b.py) echo "ImportError while loading conftest"; exit 4 ;;
  *tests/slow.py) sleep 30 ;;
  *) echo "1 passed"; exit 0 ;;
esac
"""


def _tree_stage(tmp_path: Path, series_tests: list[str], wheels: list[str], **env: str) -> str:
    """Run the session script's tree-tests stage on a bundle listing series_tests, with the
    pytest stand-in STAGE_PYTHON as python3; its log (calls go to tmp_path / calls.log)."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "evidence", tree / "evidence")
    bundle = tree / ".gpu-tests"
    (bundle / "wheels").mkdir(parents=True)
    for w in wheels:
        (bundle / "wheels" / w).write_text("")
    (bundle / "SERIES_TESTS").write_text("".join(f"{t}\n" for t in series_tests))
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "python3").write_text(STAGE_PYTHON)
    (stub / "python3").chmod(0o755)
    res = tmp_path / "res"
    res.mkdir()
    subprocess.run(
        ["bash", "evidence/dev/gpu_h200_session.sh", "tree-tests"],
        cwd=tree,
        env={
            **os.environ,
            "PATH": f"{stub}:{os.environ['PATH']}",
            "RES": str(res),
            "OUT": str(res),
            "CALLS": str(tmp_path / "calls.log"),
            "DCP_VLLM_TREE": str(tree),
            **env,
        },
        check=True,
        capture_output=True,
        timeout=60,
    )
    return (res / "tree-tests-h200.log").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tree_tests_stage_runs_each_file_and_reports_how(tmp_path: Path) -> None:
    """The tree-tests stage installs the bundle's wheels offline, runs one pytest per file
    with short tracebacks, reruns a file without vLLM's conftest only when that cannot be
    imported (exit 4), cuts a file at the stage's time limit and names the files it never
    started."""
    log = _tree_stage(
        tmp_path,
        ["tests/a.py", "tests/b.py", "tests/slow.py", "tests/c.py"],
        ["tblib-3.0.0-py3-none-any.whl"],
        STAGE_TIMEOUT="12",
    )
    summary = [
        line.split(" (")[0] for line in log.splitlines() if line.startswith("== ") and ": " in line
    ]
    assert summary == [
        "== tests/a.py: rc=0",
        "== tests/b.py: rc=1",
        "== tests/slow.py: rc=124",
        "== tests/c.py: not run",
    ]
    assert "(noconftest," in log and "(conftest," in log
    lines = (tmp_path / "calls.log").read_text().splitlines()
    assert "pip install -q --no-index --no-deps wheels/tblib-3.0.0-py3-none-any.whl" in lines[0]
    assert all("--tb=short" in line for line in lines[1:])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_tree_tests_first_runs_its_patterns_in_their_order(tmp_path: Path) -> None:
    """TREE_TESTS_FIRST="c|a" runs tests/c.py, then tests/a.py, then the bundle's other
    files in the bundle's order, each file once (a file two patterns match runs once)."""
    log = _tree_stage(
        tmp_path,
        ["tests/a.py", "tests/b.py", "tests/c.py", "tests/ca.py"],
        [],
        STAGE_TIMEOUT="30",
        TREE_TESTS_FIRST="c|a",
    )
    started = [line[3:] for line in log.splitlines() if line.startswith("== ") and ": " not in line]
    assert started == ["tests/c.py", "tests/ca.py", "tests/a.py", "tests/b.py"]


def test_tree_tests_only_runs_the_named_node_ids_alone(tmp_path: Path) -> None:
    """TREE_TESTS_ONLY="tests/b.py::t tests/a.py" runs those two node ids, in that order,
    and no other file of the bundle."""
    log = _tree_stage(
        tmp_path,
        ["tests/a.py", "tests/b.py", "tests/c.py"],
        [],
        STAGE_TIMEOUT="30",
        TREE_TESTS_ONLY="tests/b.py::t tests/a.py",
    )
    started = [line[3:] for line in log.splitlines() if line.startswith("== ") and ": " not in line]
    assert started == ["tests/b.py::t", "tests/a.py"]


STAGE_BUILD = """#!/bin/bash
# stand-in for ../shared/gpu/stage-build.sh: parts whose folders are NOT in the chunks' name
# order (the 2026-12-02 session moved one by hand; a glob join then misorders the bytes)
set -e
cd "$(dirname "$0")/.."
echo "$VLLM_VERSION $FLASHINFER_PIN" > .gpu-staged-versions
python3 - <<'PY'
import hashlib, os, random
rng = random.Random(7)
mib = 1 << 20
blobs = {"v": rng.randbytes(3 * mib + 5), "d": rng.randbytes(4 * mib + 11)}
for k, b in blobs.items():
    open(f".gpu-blob-{k}", "wb").write(b)
# chunk name -> folder: out of name order on purpose
layout = {"chunk.v00": "03", "chunk.v01": "00", "chunk.d00": "01", "chunk.d01": "02"}
pieces = {"chunk.v00": blobs["v"][: 2 * mib], "chunk.v01": blobs["v"][2 * mib :],
          "chunk.d00": blobs["d"][: 3 * mib], "chunk.d01": blobs["d"][3 * mib :]}
lines = []
for name, folder in layout.items():
    os.makedirs(f".gpu-parts/{folder}", exist_ok=True)
    open(f".gpu-parts/{folder}/{name}", "wb").write(pieces[name])
    lines.append(f"{hashlib.sha256(pieces[name]).hexdigest()}  {folder}/{name}")
open(".gpu-parts/SHA256SUMS", "w").write("\\n".join(lines) + "\\n")
PY
"""


def _stage_repo(tmp_path: Path) -> tuple[Path, dict[str, str], int]:
    """A checkout `gpu_lease.sh stage` can run in, with STAGE_BUILD as stage-build.sh and
    calls of a size that leaves parts of 2 MiB: (repo, env, tracked tree KiB)."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "evidence", repo / "evidence")
    shutil.copy(REPO / "pins.toml", repo / "pins.toml")
    gpu = repo / ".gpu"
    gpu.mkdir()
    (gpu / "stage-build.sh").write_text(STAGE_BUILD)
    (gpu / "overlay-build.sh").write_text('mkdir -p "$(dirname "$0")/../.gpu-overlay"\n')
    for d in ("build/vllm", "build/base/vllm"):
        (repo / d).mkdir(parents=True)
    bundle = tmp_path / "bundle.py"
    bundle.write_text("import os, sys; os.makedirs(sys.argv[2], exist_ok=True)\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "evidence"], cwd=repo, check=True)
    # what `stage` counts: the tracked files' bytes, then .gpu's disk usage (du -sk)
    tracked = sum(p.stat().st_size for p in (repo / "evidence").rglob("*") if p.is_file())
    gpu_kib = int(
        subprocess.run(
            ["du", "-sk", str(gpu)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    tree_kib = tracked // 1024 + gpu_kib
    call_mib = (tree_kib + 1023) // 1024 + 3  # leaves parts of 2 MiB (1 MiB of margin)
    pystub = tmp_path / "py"
    pystub.write_text(f'#!/bin/bash\nexec python3 {bundle} "${{@:2}}"\n')
    pystub.chmod(0o755)
    return repo, {**os.environ, "CALL_MIB": str(call_mib), "PY": str(pystub)}, tree_kib


def _stage(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`gpu_lease.sh stage` in repo."""
    return subprocess.run(
        ["bash", "evidence/dev/gpu_lease.sh", "stage"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None, reason="bash, git")
def test_stage_recuts_parts_joined_in_chunk_order_and_sized_for_a_call(tmp_path: Path) -> None:
    """`gpu_lease.sh stage` re-cuts parts larger than what a call leaves beside the tree,
    joining the chunks in their names' order whatever folders hold them (the bytes device-
    install.sh reassembles are the original ones), puts the smallest part last, writes
    checksums that match, stages the pinned vLLM, and refuses when a call would be over its
    limit."""
    import hashlib

    repo, env, tree_kib = _stage_repo(tmp_path)
    gpu = repo / ".gpu"
    out = _stage(repo, env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "parts of at most 2 MiB" in out.stdout
    # the vLLM of pins.toml is staged, not stage-build.sh's own default
    pinned = tomllib.loads((REPO / "pins.toml").read_text())["vllm"]["wheel"]["requirement"]
    staged = (repo / ".gpu-staged-versions").read_text().split()
    assert staged == [pinned.split("==")[1], "0.7.4"]
    parts = repo / ".gpu-parts"
    chunks = sorted(parts.glob("*/chunk.*"), key=lambda p: p.name)
    for kind in ("v", "d"):
        joined = b"".join(p.read_bytes() for p in chunks if p.name.startswith(f"chunk.{kind}"))
        assert joined == (repo / f".gpu-blob-{kind}").read_bytes()
    assert all(p.stat().st_size <= 2 << 20 for p in chunks)
    folders = sorted(d for d in parts.iterdir() if d.is_dir())
    sizes = [sum(p.stat().st_size for p in d.iterdir()) for d in folders]
    assert sizes == sorted(sizes, reverse=True)
    sums = (gpu / "parts.sha256").read_text().split("\n")
    for line in filter(None, sums):
        digest, rel = line.split("  ")
        assert hashlib.sha256((parts / rel).read_bytes()).hexdigest() == digest
    # no room: the same tree with a call of its own size
    small = _stage(repo, {**env, "CALL_MIB": str((tree_kib + 1023) // 1024 + 1)})
    assert small.returncode != 0 and "no room" in small.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_land_refuses_to_replace_a_noise_file_unless_it_is_named(tmp_path: Path) -> None:
    """The harness names a noise file by checkpoint only: `land` refuses, before it copies
    any gate file, to replace a different noise file of that name, and LAND_NOISE_SUFFIX
    lands it beside the earlier one as dcp-gate-noise-<ckpt>-<suffix>.json; the gate files
    keep their names and the earlier noise file its bytes."""
    import json

    tree = tmp_path / "tree"
    shutil.copytree(REPO / "evidence", tree / "evidence")
    (tree / "results").mkdir()
    earlier = tree / "results" / "dcp-gate-noise-glmn-patched.json"
    earlier.write_text('{"kind": "dcp_gate_noise", "lease": "earlier"}\n')
    src = tmp_path / "gate" / "results"
    src.mkdir(parents=True)
    (src / "dcp-gate-noise-glmn-patched.json").write_text(
        '{"kind": "dcp_gate_noise", "lease": "new"}\n'
    )
    gate = {"kind": "dcp_gate", "max_abs_logprob_diff": 0.03, "negative_control_detected": True}
    (src / "dcp-gate-g-0.34.0.json").write_text(json.dumps(gate))
    files_at = tmp_path / "call"
    files_at.mkdir()
    with tarfile.open(files_at / "gate.tgz", "w:gz") as tar:
        tar.add(src, arcname="results")
    env = {**os.environ, "LEASE_ARCHIVE": str(tmp_path / "archive")}

    refused = lease_call(tree, env, "land", "T1", str(files_at))
    assert refused.returncode == 2 and "would replace results/dcp-gate-noise" in refused.stdout
    assert not (tree / "results" / "dcp-gate-g-0.34.0.json").exists()
    assert json.loads(earlier.read_text())["lease"] == "earlier"

    named = lease_call(tree, {**env, "LAND_NOISE_SUFFIX": "0.34.0-x"}, "land", "T2", str(files_at))
    named.check_returncode()
    landed = tree / "results" / "dcp-gate-noise-glmn-patched-0.34.0-x.json"
    assert json.loads(landed.read_text())["lease"] == "new"
    assert json.loads(earlier.read_text())["lease"] == "earlier"
    assert (tree / "results" / "dcp-gate-g-0.34.0.json").is_file()


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None, reason="bash, git")
def test_stage_wheels_carries_the_overlay_wheels_in_place_of_the_tree(tmp_path: Path) -> None:
    """STAGE_WHEELS=1: the vLLM chunks, joined, are a tar.gz of dist/'s x86_64 overlay wheel,
    the b12x overlay wheel and their receipts (what `serve` pip-installs); the dependency
    chunks are stage-build's; staging again without it re-stages the official tree; without an
    overlay wheel in dist/ it refuses."""
    import io

    repo, env, _ = _stage_repo(tmp_path)
    missing = _stage(repo, {**env, "STAGE_WHEELS": "1"})
    assert missing.returncode == 2 and "run make wheel" in missing.stdout
    dist = repo / "dist"
    dist.mkdir()
    names = {
        "vllm-0.34.0+dcp.ab12-cp38-abi3-manylinux_2_28_x86_64.whl": b"x86",
        "vllm-0.34.0+dcp.ab12-cp38-abi3-manylinux_2_28_aarch64.whl": b"arm",
        "b12x-1.5.1+dcp.cd34-py3-none-any.whl": b"b12x",
        "receipt.json": b"{}",
        "receipt-b12x.json": b"{}",
        "receipt-aarch64.json": b"{}",
    }
    for name, body in names.items():
        (dist / name).write_bytes(body)

    def joined(kind: str) -> bytes:
        chunks = sorted((repo / ".gpu-parts").glob(f"*/chunk.{kind}*"), key=lambda p: p.name)
        return b"".join(p.read_bytes() for p in chunks)

    wheels = _stage(repo, {**env, "STAGE_WHEELS": "1"})
    assert wheels.returncode == 0, wheels.stdout + wheels.stderr
    with tarfile.open(fileobj=io.BytesIO(joined("v")), mode="r:gz") as tar:
        got = {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers()}
    assert got == {n: b for n, b in names.items() if "aarch64" not in n}
    assert joined("d") == (repo / ".gpu-blob-d").read_bytes()
    assert (repo / ".gpu-parts" / "STAGED").read_text().strip() == "wheels"

    tree = _stage(repo, env)
    assert tree.returncode == 0 and "re-staging (tree)" in tree.stdout
    assert joined("v") == (repo / ".gpu-blob-v").read_bytes()
    assert not (repo / ".gpu-parts" / "STAGED").exists()


SERVE_PYTHON = """#!/bin/bash
echo "python3 $*" >> "$CALLS"
case "$*" in
  "-m pip install"*)
    site=$(echo "$*" | sed -n 's/.*--target \\([^ ]*\\).*/\\1/p')
    mkdir -p "$site/vllm" "$site/bin"
    printf 'patched\\n' > "$site/vllm/x.py"; : > "$site/bin/vllm" ;;
  "- "*) cat > /dev/null; echo '{"how": "stub"}' > "$3" ;;
esac
exit 0
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_serve_pip_installs_staged_wheels_and_serves_with_their_vllm_script(
    tmp_path: Path,
) -> None:
    """With overlay wheels staged in the official tree's place, `serve` pip-installs them
    (no index, no deps, into a target), checks the installed patched files against the
    overlay's MANIFEST, and runs the smoke with that install's `vllm` script and its install
    record; an installed file that differs from the overlay stops the call before any serve."""
    import hashlib

    tree, env, out, calls = stub_lease_tree(tmp_path)
    (tmp_path / "stub" / "python3").write_text(SERVE_PYTHON)
    staged = tmp_path / "home" / "gpu-vllm"
    staged.mkdir(parents=True)
    for name in (
        "vllm-0.34.0+dcp.ab12-cp38-abi3-manylinux_2_28_x86_64.whl",
        "b12x-1+dcp.c-py3-none-any.whl",
    ):
        (staged / name).write_bytes(b"wheel")
    manifest = tree / ".gpu-overlay" / "MANIFEST"
    digest = hashlib.sha256(b"patched\n").hexdigest()
    manifest.write_text(f"{digest}  vllm/x.py\n")
    done = lease_call(tree, env, "serve")
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "root" / "wheel-site"
    lines = calls.read_text().splitlines()
    pip = next(line for line in lines if "-m pip install" in line)
    assert "--no-index --no-deps" in pip and f"--target {site}" in pip
    assert all(str(staged / n) in pip for n in os.listdir(staged))
    smoke = next(line for line in lines if "serve_smoke.py all" in line)
    assert f"--vllm {site}/bin/vllm" in smoke and "--install-record" in smoke
    assert sorted(p.name for p in out.iterdir()) == ["serve-logs.tgz"]
    with tarfile.open(out / "serve-logs.tgz") as tar:
        assert "install.json" in tar.getnames()

    (site / "vllm" / "x.py").write_text("stock\n")  # the installed file is not the overlay's
    calls.write_text("")
    bad = lease_call(tree, env, "serve")
    assert bad.returncode == 1 and "differ from the overlay" in bad.stdout
    assert "serve_smoke.py" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_mtp_phase_writes_the_checkpoint_once_and_runs_the_bench_to_the_calls_end(
    tmp_path: Path,
) -> None:
    """`gpu_lease.sh mtp` installs, writes the cost-realistic checkpoint unless a previous
    call did, runs the depth benchmark with a deadline inside the call and MTP_ARGS, and
    returns mtp-bench.tgz and the lease logs; no gate, no tree test."""
    tree, env, out, calls = stub_lease_tree(tmp_path)
    done = lease_call(tree, {**env, "CALL_S": "300", "MTP_ARGS": "--repeats 1"}, "mtp")
    done.check_returncode()
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("device-recv ")
    assert sum("make_mtp_cost_ckpt.py" in line for line in lines) == 1
    bench = [line for line in lines if "bench_mtp_depth.py run" in line]
    assert len(bench) == 1 and "--repeats 1" in bench[0]
    deadline = int(bench[0].split("--deadline-s ")[1].split()[0])
    assert 200 < deadline <= 260
    assert not any("dcp_gate.py" in line or "-m pytest" in line for line in lines)
    assert sorted(p.name for p in out.iterdir()) == ["lease-logs.tgz", "mtp-bench.tgz"]
    # a second call on the same machine finds the checkpoint's record and keeps it
    ckpt = tmp_path / "root" / "mtp" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "mtp_cost_ckpt.json").write_text("{}")
    calls.write_text("")
    lease_call(tree, {**env, "CALL_S": "300"}, "mtp").check_returncode()
    assert "make_mtp_cost_ckpt.py" not in calls.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_carried_b12x_wheel_is_installed_into_the_patched_tree(tmp_path: Path) -> None:
    """The b12x overlay wheel that `stage` puts in .gpu-overlay/b12x-wheel is pip-installed,
    without dependencies or the index, into the patched vLLM tree every call that installs;
    a call without it installs nothing."""
    tree, env, _, calls = stub_lease_tree(tmp_path)
    lease_call(tree, {**env, "CALL_S": "300"}, "mtp").check_returncode()
    assert "pip install" not in calls.read_text()
    wheel = tree / ".gpu-overlay" / "b12x-wheel" / "b12x-1.5.1+dcp.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_text("wheel")
    calls.write_text("")
    lease_call(tree, {**env, "CALL_S": "300"}, "mtp").check_returncode()
    (install,) = [line for line in calls.read_text().splitlines() if "pip install" in line]
    patched = tmp_path / "home" / "gpu-vllm-patched"
    assert f"--no-index --no-deps --no-compile --target {patched}" in install
    assert install.endswith("b12x-1.5.1+dcp.0-py3-none-any.whl")
