# SPDX-License-Identifier: Apache-2.0
"""Where every evidence figure comes from: the revision, the machine, the command, and one
writer that puts them into each result file.

Every evidence script records these three things the same way (``git_revision``, ``machine``,
``command``); ``write_result`` adds whichever a record lacks and writes it as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git_revision(path: Path = REPO, *, dirty: bool = False) -> str | None:
    """The commit checked out at ``path`` (default: this repository), or None.

    For this repository ``$DCP_GIT_REV`` wins when set: a GPU machine receives a copy of the
    working tree without ``.git``, so the launching session names the commit there. With
    ``dirty``, ``-dirty`` is appended when tracked files differ from that commit.
    """
    if Path(path).resolve() == REPO and os.environ.get("DCP_GIT_REV"):
        return os.environ["DCP_GIT_REV"]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(path), *args], capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError):
            return None
        return out.stdout.strip()

    rev = git("rev-parse", "HEAD")
    if rev and dirty and git("status", "--porcelain", "--untracked-files=no"):
        rev += "-dirty"
    return rev


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine(*, gpus: bool = True, topology: bool = False) -> dict[str, Any]:
    """The machine a run ran on: host, platform, Python, CPUs and load; torch, CUDA and every
    visible GPU (name, capability, SMs, memory) when torch is importable and ``gpus``; the
    installed vLLM and Triton; ``nvidia-smi topo -m`` with ``topology`` (multi-GPU runs)."""
    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "vllm": package_version("vllm"),
        "triton": package_version("triton"),
    }
    if gpus:
        try:
            import torch
        except ImportError:
            torch = None  # type: ignore[assignment]
        if torch is not None:
            info["torch"] = torch.__version__
            info["cuda"] = torch.version.cuda
            if torch.cuda.is_available():
                devices = []
                for i in range(torch.cuda.device_count()):
                    p = torch.cuda.get_device_properties(i)
                    devices.append(
                        {
                            "name": p.name,
                            "capability": f"{p.major}.{p.minor}",
                            "sms": p.multi_processor_count,
                            "memory_gib": round(p.total_memory / 2**30, 1),
                        }
                    )
                info["gpus"] = devices
    for key in ("NCCL_P2P_DISABLE", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(key) is not None:
            info[key] = os.environ[key]
    if topology:
        try:
            topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
            info["nvidia_smi_topo"] = topo.stdout
        except OSError:
            pass
    return info


def load_module(path: Path, name: str) -> ModuleType:
    """Import the Python file ``path`` as module ``name`` (registered in ``sys.modules``, which
    dataclasses need); an already loaded ``name`` is returned as is."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def command(argv: list[str] | None = None) -> str:
    """The command line of this process (``argv``: ``sys.argv``), shell-quoted, without the
    folders of the machine it runs on: the interpreter by its name (``python3``, not the venv
    it lives in), a script of this repository by its path from the repository root, every other
    argument as given."""
    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).is_file():
        try:
            args[0] = Path(args[0]).resolve().relative_to(REPO).as_posix()
        except ValueError:
            pass  # a script outside the repository: as given
    return shlex.join([Path(sys.executable).name, *args])


def write_json_atomic(path: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as JSON to ``path`` through a temporary file and a rename: a reader
    never sees half a file, a killed run leaves the last complete one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def write_result(path: Path, record: dict[str, Any], **machine_kwargs: Any) -> Path:
    """Write ``record`` as JSON to ``path`` (atomically) with ``command``, ``git_revision`` and
    ``machine`` filled in where the record does not already carry them."""
    record.setdefault("command", command())
    if "revision" not in record:
        record.setdefault("git_revision", git_revision())
    record.setdefault("machine", machine(**machine_kwargs))
    return write_json_atomic(path, record)
