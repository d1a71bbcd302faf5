# SPDX-License-Identifier: Apache-2.0
"""The named suites of evidence/dcp_gate.py, read from the data files in ``gate/suites/``.

A suite file ``suites/<name>.json`` is named by what it tests and holds ``what`` (one sentence),
``checkpoints`` (name -> make_dsa_gate_ckpt.py arguments), ``runs`` (gate configurations;
``model`` names a checkpoint as ``@name``), ``noise`` (label -> [checkpoint, reference run,
candidate run, reference pass, candidate pass]) and ``gates`` (name -> [reference run,
candidate run] or a dict with ``ref``, ``cand``, ``kind``, ``noise`` and optionally ``cand_pass``
(the candidate's pass compared with the reference's clean one: clean, or repeat for a prefix-cache
hit) and ``control`` (a run of the candidate's configuration whose fault pass is the negative
control, for a candidate that cannot run one)), and optionally ``distances`` (name -> a dict
with ``ref``, ``cand`` and ``noise``: two runs whose distance is measured and stated, never
gated, e.g. one KV-cache format against another on the same checkpoint; ``noise`` names the
noise group that gives it a scale and must be one of the suite's own). A suite may name runs of
another suite (a queue runs them in one work folder and reuses them). ``suites/queues.json``
lists suites to run as one priority queue (``--suites NAME``); ``suites/checkpoints.json`` the
named checkpoints. Loading validates every run as a :class:`plan.GateConfig`, every gate's kind,
that every run a gate or noise pair names exists in some suite, and that a checkpoint name means
the same arguments everywhere.

Stock vLLM serves FLASHMLA_SPARSE under DCP only on its mixed-batch fp8 path, i.e. with fewer
than 32 local heads that pad to the same kernel envelope as the gathered heads: the 64-head GLM
checkpoints therefore run their stock DCP gates at TP 4 (16 local heads) and the 32-head V3.2
ones at TP 2 or 4. The series' rows run with ``variant: patched`` (the launcher puts
``$GATE_VLLM_PATCHED`` first on their ranks' ``PYTHONPATH``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate import plan, verdict

SUITE_DIR = Path(__file__).resolve().parent / "suites"
_META = ("checkpoints.json", "queues.json")


@dataclass(frozen=True)
class Suite:
    """One suite file, validated."""

    name: str
    what: str
    checkpoints: dict[str, list[str]]
    runs: tuple[dict[str, Any], ...]
    noise: dict[str, list[Any]]
    gates: dict[str, Any]
    distances: dict[str, dict[str, str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The form the launcher and merge_suites take."""
        return {
            "checkpoints": dict(self.checkpoints),
            "runs": [dict(r) for r in self.runs],
            "noise": dict(self.noise),
            "gates": dict(self.gates),
            "distances": {k: dict(v) for k, v in self.distances.items()},
        }


GATE_KEYS = ("ref", "cand", "kind", "noise", "cand_pass", "control")
DISTANCE_KEYS = ("ref", "cand", "noise")


def _distance_problems(spec: Any, noise: dict[str, list[Any]]) -> list[str]:
    """What is wrong with one distance entry of a suite whose noise pairs are ``noise``."""
    if not isinstance(spec, dict) or set(spec) != set(DISTANCE_KEYS):
        got = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        return [f"keys {got}; want {', '.join(DISTANCE_KEYS)}"]
    out = []
    if spec["ref"] == spec["cand"]:
        out.append("ref and cand are one run")
    if spec["noise"] not in {pair[0] for pair in noise.values()}:
        out.append(f"noise group {spec['noise']!r} is none of this suite's noise pairs")
    return out


def _gate_runs(spec: Any) -> tuple[str, str, str]:
    if isinstance(spec, dict):
        return spec["ref"], spec["cand"], spec.get("kind", "dcp")
    ref, cand = spec
    return ref, cand, "dcp"


def _gate_problems(spec: Any) -> list[str]:
    """What is wrong with one gate entry on its own: unknown keys, kind, candidate pass, a
    control run where the kind takes none."""
    ref, cand, kind = _gate_runs(spec)
    out = []
    if kind not in verdict.GATE_KINDS:
        out.append(f"kind {kind!r}; valid: {', '.join(verdict.GATE_KINDS)}")
    if not isinstance(spec, dict):
        return out
    unknown = sorted(set(spec) - set(GATE_KEYS))
    if unknown:
        out.append(f"unknown keys {unknown}; valid: {', '.join(GATE_KEYS)}")
    cand_pass = spec.get("cand_pass", "clean")
    if cand_pass not in verdict.GATE_CAND_PASSES:
        out.append(f"cand_pass {cand_pass!r}; valid: {', '.join(verdict.GATE_CAND_PASSES)}")
    if "control" in spec and kind not in verdict.GATE_CONTROL_KINDS:
        out.append(f"a control run needs kind {' or '.join(verdict.GATE_CONTROL_KINDS)}")
    if spec.get("control") in (ref, cand):
        out.append("the control must be a run of its own")
    return out


def _engine(run: dict[str, Any]) -> dict[str, Any]:
    """A run's engine configuration as GateConfig reads it (defaults filled in), less what a
    control run may change (verdict.CONTROL_MAY_DIFFER)."""
    full = plan.GateConfig.from_json({**run, "model": run["model"]}).to_json()
    return {k: v for k, v in full.items() if k not in verdict.CONTROL_MAY_DIFFER}


def _gate_run_problems(spec: Any, runs: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with a gate entry given every suite's runs: the candidate must serve the
    pass it is compared on; a control must run the fault pass on the candidate's engine."""
    if not isinstance(spec, dict):
        return []
    out = []
    cand = runs[spec["cand"]]
    cand_pass = spec.get("cand_pass", "clean")
    if cand_pass not in cand["passes"]:
        out.append(f"candidate {spec['cand']} serves no {cand_pass!r} pass")
    control = spec.get("control")
    if control is not None:
        if control not in runs:
            return [*out, f"control {control} is a run no suite defines"]
        if "fault" not in runs[control]["passes"]:
            out.append(f"control {control} serves no 'fault' pass")
        if _engine(runs[control]) != _engine(cand):
            out.append(f"control {control} is not the engine of candidate {spec['cand']}")
    return out


def load_suite(path: Path) -> Suite:
    """Read one suite file; a malformed run, gate or key is an error naming the file."""
    data = json.loads(path.read_text())
    keys = {"what", "checkpoints", "runs", "noise", "gates"}
    if not keys <= set(data) <= keys | {"distances"}:
        raise ValueError(
            f"{path.name}: keys {sorted(data)}, want {sorted(keys)} (and optionally distances)"
        )
    names = [r["name"] for r in data["runs"]]
    if len(names) != len(set(names)):
        raise ValueError(f"{path.name}: a run name appears twice")
    for run in data["runs"]:
        plan.GateConfig.from_json({**run, "model": "m"})  # raises on an unknown key or value
        if run["model"].startswith("@") and run["model"][1:] not in data["checkpoints"]:
            raise ValueError(f"{path.name}: run {run['name']} names checkpoint {run['model']}")
    for gate, spec in data["gates"].items():
        problems = _gate_problems(spec)
        if problems:
            raise ValueError(f"{path.name}: gate {gate}: " + "; ".join(problems))
    for name, spec in data.get("distances", {}).items():
        problems = _distance_problems(spec, data["noise"])
        if problems:
            raise ValueError(f"{path.name}: distance {name}: " + "; ".join(problems))
        if name in data["gates"]:
            raise ValueError(f"{path.name}: distance {name} has a gate's name")
    return Suite(
        name=path.stem,
        what=data["what"],
        checkpoints=data["checkpoints"],
        runs=tuple(data["runs"]),
        noise=data["noise"],
        gates=data["gates"],
        distances=data.get("distances", {}),
    )


def load_suites(folder: Path = SUITE_DIR) -> dict[str, Suite]:
    """Every suite file of ``folder``, checked against each other."""
    suites = {p.stem: load_suite(p) for p in sorted(folder.glob("*.json")) if p.name not in _META}
    run_defs: dict[str, dict[str, Any]] = {}
    for s in suites.values():
        for r in s.runs:
            run_defs.setdefault(r["name"], r)
    every_run = set(run_defs)
    defined: dict[str, list[str]] = {}
    for s in suites.values():
        for name, argv in s.checkpoints.items():
            if defined.setdefault(name, argv) != argv:
                raise ValueError(f"checkpoint {name!r} means different arguments in {s.name}")
        for gate, spec in s.gates.items():
            ref, cand, _ = _gate_runs(spec)
            if not {ref, cand} <= every_run:
                raise ValueError(f"{s.name}: gate {gate} compares a run no suite defines")
            problems = _gate_run_problems(spec, {**run_defs, **{r["name"]: r for r in s.runs}})
            if problems:
                raise ValueError(f"{s.name}: gate {gate}: " + "; ".join(problems))
        for label, pair in s.noise.items():
            if not set(pair[1:3]) <= every_run:
                raise ValueError(f"{s.name}: noise pair {label!r} names a run no suite defines")
        for name, spec in s.distances.items():
            if not {spec["ref"], spec["cand"]} <= every_run:
                raise ValueError(f"{s.name}: distance {name} compares a run no suite defines")
    return suites


SUITE_RECORDS = load_suites()
SUITES: dict[str, dict[str, Any]] = {n: s.as_dict() for n, s in SUITE_RECORDS.items()}
QUEUES: dict[str, list[str]] = {
    k: v for k, v in json.loads((SUITE_DIR / "queues.json").read_text()).items() if k[0] != "_"
}
for _queue, _names in QUEUES.items():
    for _name in _names:
        if _name not in SUITES:
            raise ValueError(f"queue {_queue!r} names unknown suite {_name!r}")

_CKPTS = json.loads((SUITE_DIR / "checkpoints.json").read_text())
NEEDLE_ARGS: list[str] = _CKPTS["needle_args"]
"""The answer-needle knobs every needle checkpoint shares (make_dsa_gate_ckpt.py arguments)."""
NEEDLE_CKPTS: dict[str, list[str]] = _CKPTS["needle"]
MTP_ACCEPT_CKPT: list[str] = _CKPTS["mtp_accept"]
"""The checkpoint whose MTP draft retrieves the answer through its own attention (glmnm)."""
CALIBRATE_GAINS: tuple[str, ...] = tuple(_CKPTS["calibrate_o_gains"])
LONG_CKPTS: dict[str, list[str]] = _CKPTS["long"]
"""The long-prompt gates' checkpoints: a needle checkpoint's arguments plus a
--max-position-embeddings that a 1M-token prompt fits under."""


def merge_suites(suites: list[dict[str, Any]]) -> dict[str, Any]:
    """Several suites as one queue: runs in the given order (first definition of a name
    wins), warm-up runs moved to the front, checkpoints, noise pairs, gates and distances
    united."""
    out: dict[str, Any] = {
        "checkpoints": {},
        "runs": [],
        "noise": {},
        "gates": {},
        "distances": {},
    }
    seen = set()
    for suite in suites:
        for k, v in suite.get("checkpoints", {}).items():
            if out["checkpoints"].setdefault(k, v) != v:
                raise ValueError(f"checkpoint {k!r} is defined twice, differently")
        for run in suite.get("runs", []):
            if run["name"] not in seen:
                seen.add(run["name"])
                out["runs"].append(run)
        out["noise"].update(suite.get("noise", {}))
        out["gates"].update(suite.get("gates", {}))
        out["distances"].update(suite.get("distances", {}))
    out["runs"].sort(key=lambda r: not r.get("warmup", False))  # stable: priority kept
    return out


def patched_suite(backend: str, kv_cache_dtype: str | None = "fp8_ds_mla") -> dict[str, Any]:
    """Any backend on the patched tree, TP 2 DCP 2 against DCP 1 on the GLM needle
    checkpoint (32 local heads), with the references for its noise floor."""

    def run(name: str, tp: int, dcp: int, passes: list[str]) -> dict[str, Any]:
        return {
            "name": name,
            "model": "@glmn",
            "tp": tp,
            "dcp": dcp,
            "graphs": False,
            "passes": passes,
            "backend": backend,
            "kv_cache_dtype": kv_cache_dtype,
            "variant": "patched",
        }

    return {
        "checkpoints": {"glmn": NEEDLE_CKPTS["glmn"]},
        "runs": [
            run("p-glmn-tp1-dcp1", 1, 1, ["clean", "repeat", "sensitivity"]),
            run("p-glmn-tp2-dcp1", 2, 1, ["clean", "repeat"]),
            run("p-glmn-tp2-dcp2", 2, 2, ["clean", "fault"]),
        ],
        "noise": {
            "glmn: TP=2 DCP=1 vs TP=1": [
                "glmn",
                "p-glmn-tp1-dcp1",
                "p-glmn-tp2-dcp1",
                "clean",
                "clean",
            ],
            "glmn: p-glmn-tp1-dcp1 repeated": [
                "glmn",
                "p-glmn-tp1-dcp1",
                "p-glmn-tp1-dcp1",
                "clean",
                "repeat",
            ],
            "glmn: p-glmn-tp2-dcp1 repeated": [
                "glmn",
                "p-glmn-tp2-dcp1",
                "p-glmn-tp2-dcp1",
                "clean",
                "repeat",
            ],
        },
        "gates": {f"p-glmn-tp2-dcp2-{backend.lower()}": ["p-glmn-tp2-dcp1", "p-glmn-tp2-dcp2"]},
    }
