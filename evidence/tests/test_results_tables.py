# SPDX-License-Identifier: Apache-2.0
"""evidence/results_tables.py: the figures it derives agree with what the benches recorded,
and every table names the vLLM base it was measured on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import results_tables  # noqa: E402


def _schema2_kernel_benches() -> list[tuple[str, dict]]:
    return [
        (n, d)
        for n, d in results_tables.load("kernel-bench-*.json")
        if d.get("schema_version", 1) >= 2
    ]


def test_policy_split_counts_equal_the_launches_the_kernel_bench_recorded():
    """The split counts results_tables computes for "fill" and "occupancy" are the ones the
    kernel's own planner chose in every committed sweep point recorded under that policy."""
    files = _schema2_kernel_benches()
    assert files, "no schema-2 kernel bench committed"
    checked = 0
    for _, d in files:
        sms = d["machine"]["sms"]
        for e in d["decode"] + d["extend"]:
            rows = e.get("batch", e.get("rows"))
            for p in e["points"]:
                if p["splits_arg"] not in ("fill", "occupancy"):
                    continue
                block_h, block_n = p["tiling"][:2]
                programs = rows * -(-e["heads"] // block_h)
                got = results_tables.policy_num_splits(
                    p["splits_arg"], programs, e["topk"], block_h, block_n, sms
                )
                assert got == p["num_splits"], (rows, e["heads"], p)
                checked += 1
    assert checked > 100


def test_auto_rule_is_timed_on_every_row_and_follows_the_thresholds():
    for _, d in _schema2_kernel_benches():
        for e in d["decode"] + d["extend"]:
            rule, point = results_tables.auto_rule(e, d["machine"]["sms"])
            assert point is not None, (e["kind"], e.get("batch", e.get("rows")), e["heads"], rule)
            assert point["variant"] == "base"
            programs = e.get("batch", e.get("rows")) * -(
                -e["heads"] // e["default_plan"]["block_h"]
            )
            plan = e["default_plan"]
            default = [plan["block_h"], plan["block_n"], plan["num_warps"], plan["num_stages"]]
            if programs <= results_tables.AUTO_FEW_PROGRAMS:
                assert point["tiling"] == [plan["block_h"], 64, 8, 2] and "fill" in rule
            elif programs <= results_tables.AUTO_FILL_PROGRAMS:
                assert point["tiling"] == default and "fill" in rule
            else:
                assert point["tiling"] == default and "occupancy" in rule


def test_render_labels_each_table_with_its_base():
    text = results_tables.render()
    for old in ("vllm 0.26.0", "vllm 0.33.0"):  # superseded bases' files left results/
        assert old not in text
    assert "vllm 0.34.0, `kernel-bench-h200-0.34.0.json`" in text
    assert "(H100 80GB HBM3, vllm 0.34.0), `serve-smoke-0.34.0.json`" in text
    assert "not timed" not in text  # every auto launch of the committed sweep was timed


def test_gate_problems_are_shortened_and_counted():
    assert results_tables._problems({}) == "-"
    long = {"problems": ["a | b " + "x" * 200, "second"]}
    cell = results_tables._problems(long)
    assert "|" not in cell and cell.endswith("… (+1 more)") and len(cell) < 110


def test_export_table_has_a_row_per_checked_patch_with_its_verdict():
    """The export-check table shows what ``patchset export --check --json`` recorded: one row
    per patch, its verdict and its tests' summary, under the vLLM base it was checked on."""
    files = results_tables.load("export-check*.json")
    assert files, "no export check committed"
    lines = results_tables.export_section()
    for name, d in files:
        version = d["bases"]["vllm"]["version"]
        assert f"### Each patch standalone on vLLM {version} (+ its Depends-on), `{name}`" in lines
        for p in d["patches"]:
            [row] = [line for line in lines if line.startswith(f"| {p['name']} |")]
            assert p["standalone"] in row
            assert (p["tests"] or {}).get("summary", "no test module") in row


def test_status_sentence_names_each_card_with_its_meaningful_gates(tmp_path, monkeypatch):
    """The README's status sentence counts the meaningful gates per GPU the records name (a
    gate run on another card is not filed under the H200); a record without a card reads
    "?"."""
    import json

    def gate(name: str, gpu: str, meaningful: bool = True) -> None:
        (tmp_path / f"dcp-gate-{name}.json").write_text(
            json.dumps(
                {"kind": "dcp_gate", "meaningful": meaningful, "machine": {"gpus": [{"name": gpu}]}}
            )
        )

    gate("a", "NVIDIA H200")
    gate("b", "NVIDIA H200")
    gate("c", "NVIDIA H100 80GB HBM3")
    gate("d", "NVIDIA H100 80GB HBM3", meaningful=False)
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    monkeypatch.setattr(results_tables, "status_rows", lambda: [["release"]])
    text = " ".join(results_tables.status_block().split())
    assert "3 meaningful DCP gates" in text
    assert "sharing one GPU (H200: 2, H100 80GB HBM3: 1)" in text
    assert results_tables.card({}) == "?"


def test_serve_table_says_how_vllm_was_installed_and_where_the_depth_went():
    """The committed serving smoke passed with the pip-installed overlay wheel whose sha256
    dist/receipt.json would name, and its table shows the adaptive depth's path."""
    files = results_tables.load("serve-smoke-*.json")
    assert files, "no serving smoke committed"
    rows = "\n".join(results_tables.serve_section())
    for _, d in files:
        assert d["ok"] and not d["problems"]
        wheel = next(w for w in d["install"]["wheels"] if w["file"].startswith("vllm-"))
        assert f"sha256 {wheel['sha256'][:12]}" in rows
        path = results_tables.depth_path(d["depth_changes"])
        assert f"| {path} |" in rows
    assert results_tables.depth_path([]) == "-"
    assert results_tables.depth_path([{"from": 2, "to": 4}, {"from": 4, "to": 2}]) == "2 -> 4 -> 2"
    assert "overlay files" in results_tables.installed_as(None)


def test_memory_table_shows_each_run_its_control_and_the_capacity(tmp_path, monkeypatch):
    """A memory test renders a row per run (the refused control as refused, caught) and the
    capacity rows with their ratio to DCP 1."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gate import memory
    from test_gate_memory import run

    gib = 1 << 30
    runs = {
        "m-dcp2": run("m-dcp2"),
        "m-dcp2-unreserved": run(
            "m-dcp2-unreserved", drop="all", ok=False, error="DCP headroom check: no"
        ),
        "m-dcp1": run("m-dcp1", dcp=1),
        "c-dcp1": run(
            "c-dcp1",
            dcp=1,
            ok=False,
            error="(1 GiB KV cache is needed, which is larger than the available KV cache memory"
            " (0.5 GiB). ... the estimated maximum model length is 39488.",
        ),
    }
    doc = memory.memory_result(runs) | {"machine": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}}
    (tmp_path / "dcp-memory.json").write_text(json.dumps(doc))
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    text = "\n".join(results_tables.memory_section())
    assert "All DCP runs within: True (DCP = 1 baseline: True); negative controls caught: True" in (
        text
    )
    assert "| `m-dcp2-unreserved` | 2/2 | - | query | all | refused | True |" in text
    assert (
        f"| `m-dcp2` | 2/2 | - | query | - | True | - | {5 * gib / gib:.2f} | 4.00 | 1.00 |" in text
    )
    assert "| `m-dcp1` | glmn | 2048 | 1/1 | 64,000 | 1 | 65,536 |" in text
    assert "| `c-dcp1` | glmn | 2048 | 1/1 | refused 65,600 (holds 39488) | - | - |" in text
    assert "| `m-dcp2` | glmn | 2048 | 2/2 | 128,000 | 2 | 65,536 |" in text


def test_nvfp4_tables_show_both_formats_per_regime_and_each_target():
    """The accuracy table has one row per regime with the fp8 and nvfp4 figures of the file;
    the compile table one row per target, and a failed launch is not shown as fitting."""
    (name, d), *_ = results_tables.load("nvfp4-accuracy-*.json")
    lines = results_tables.nvfp4_accuracy_table(name, d)
    for regime, e in d["regimes"].items():
        row = next(x for x in lines if x.startswith(f"| {regime} |"))
        f8 = results_tables.fmt(e["fp8_ds_mla"]["format"]["out_rel_fro"])
        f4 = results_tables.fmt(e["nvfp4_ds_mla"]["format"]["out_rel_fro"])
        assert f"| {f8} / {f4} |" in row
    files = results_tables.load("nvfp4-compile-*.json")
    assert {f[1]["rows"][0]["capability"] for f in files} == {90, 120, 121}
    rows = [x for x in results_tables.nvfp4_compile_table(files) if x.startswith("| sm_")]
    assert len(rows) == 3 and all("| yes |" in r for r in rows)
    broken = {**files[0][1], "failed": 1}
    (row,) = [
        x for x in results_tables.nvfp4_compile_table([("x.json", broken)]) if x.startswith("| sm_")
    ]
    assert "NO: 1 failed" in row


def test_nvfp4_bench_table_states_the_time_ratio_per_shape():
    """One row per decode and extend shape, the ratio being nvfp4's time over fp8's; a cut
    run says so; the capacity line carries both token ratios."""
    (name, d), *_ = results_tables.load("nvfp4-bench-*.json")
    lines = results_tables.nvfp4_bench_table(name, d)
    shapes = d["decode"] + d["extend"]
    rows = [x for x in lines if x.startswith(("| decode |", "| extend |"))]
    assert len(rows) == len(shapes)
    for row, r in zip(rows, shapes, strict=True):
        assert f"| {results_tables.ratio(r['nvfp4_over_fp8'])} |" in row
    assert "1.86x" in "".join(lines)
    cut = {**d, "complete": False}
    assert "cut by its time budget" in "".join(results_tables.nvfp4_bench_table(name, cut))


def test_distance_table_states_the_ratios_without_a_verdict():
    d = {
        "backend": {
            "reference_kv_cache_dtype": "fp8_ds_mla",
            "candidate_kv_cache_dtype": "nvfp4_ds_mla",
        },
        "max_abs_logprob_diff": 0.5,
        "max_first_step_abs_logprob_diff": 0.25,
        "scale": {"ratio_to_noise_floor": 10.0, "ratio_to_tolerance": 2.0},
        "tokens_exact": {"all_exact": False},
        "git_revision": "abc",
    }
    lines = results_tables.distance_table([("dcp-distance-x.json", d)])
    (row,) = [x for x in lines if x.startswith("| `dcp-distance-x.json`")]
    assert "| nvfp4_ds_mla vs fp8_ds_mla | 0.5 | 0.25 | 10.00 | 2.00 | - | False | abc |" in row
    assert not any("equivalent" in x.lower() or "verdict" in x.lower() for x in lines)


def test_results_readme_has_a_line_per_file_and_is_current():
    """results/README.md is what the renderer writes now: one row per file under results/
    (nested run records included), each with what it shows and where it ran; nothing there
    lacks a description."""
    text, unexplained = results_tables.results_readme()
    assert unexplained == []
    readme = results_tables.RESULTS / "README.md"
    assert readme.read_text() == text, "results/README.md is stale: run evidence/results_tables.py"
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    names = [
        f.relative_to(results_tables.RESULTS).as_posix() for f in results_tables.results_files()
    ]
    assert [row.split("`")[1] for row in rows] == names
    assert "dcp-gate-runs/base034-ledger/runs/p-glmn-tp2-dcp2-ledger.json" in names
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 4 and all(cells), row
    gate = next(r for r in rows if "`dcp-gate-p-glmn-tp2-dcp2-ckv-0.34.0.json`" in r)
    assert "packed-CKV prefill route vs DCP = 1" in gate and "H200, one-GPU emulation" in gate
    assert "| CPU |" in next(r for r in rows if "`export-check-vllm-0.34.0.json`" in r)


def test_every_result_is_on_the_pinned_base():
    """results/ holds the current base's results only: a vLLM version in a file's name or its
    recorded base is the one pins.toml pins (earlier bases' files are in git log)."""
    import json
    import re
    import tomllib

    pins = tomllib.loads((results_tables.REPO / "pins.toml").read_text())
    pinned = pins["vllm"]["sdist"]["requirement"].split("==")[1]
    checked = 0
    for path in results_tables.results_files():
        versions = set(re.findall(r"\d+\.\d+\.\d+", path.name))
        base = results_tables.base_of(json.loads(path.read_text()))
        versions |= set(re.findall(r"\d+\.\d+\.\d+", base))
        assert versions <= {pinned}, (path.name, versions)
        checked += bool(versions)
    assert checked > 50


def test_check_fails_on_an_unexplained_or_stale_file(tmp_path, monkeypatch, capsys):
    """--check fails when a results file has nothing that says what it shows (no `kind` the
    renderer knows, no `what`, no file-name pattern) and when results/README.md is stale;
    writing refuses the unexplained file too."""
    import json

    results = tmp_path / "results"
    results.mkdir()
    (results / "serve-smoke-x.json").write_text(
        json.dumps({"kind": "dcp_gate_ckpt_check", "checkpoints": {"a": {}}, "revision": "abc"})
    )
    readme = tmp_path / "README.md"
    markers = f"{results_tables.STATUS_BEGIN}\n{results_tables.STATUS_END}\n"
    readme.write_text(markers)
    monkeypatch.setattr(results_tables, "REPO", tmp_path)
    monkeypatch.setattr(results_tables, "RESULTS", results)
    monkeypatch.setattr(results_tables, "OUT", tmp_path / "results.md")
    monkeypatch.setattr(results_tables, "README", readme)
    monkeypatch.setattr(results_tables, "render", lambda: "tables\n")
    monkeypatch.setattr(results_tables, "status_block", lambda: markers)
    assert results_tables.main([]) == 0
    assert results_tables.main(["--check"]) == 0
    assert "layer 0 of 1 gate checkpoints" in (results / "README.md").read_text()

    (results / "mystery.json").write_text(json.dumps({"figures": [1, 2]}))
    capsys.readouterr()
    assert results_tables.main(["--check"]) == 1
    assert "results/mystery.json: nothing says what it shows" in capsys.readouterr().out
    assert results_tables.main([]) == 1  # written without it, still refused
    assert "mystery.json" not in (results / "README.md").read_text()

    (results / "mystery.json").write_text(json.dumps({"what": "a described measurement"}))
    assert results_tables.main(["--check"]) == 1  # explained now, but the README is stale
    assert results_tables.main([]) == 0 and results_tables.main(["--check"]) == 0
    assert (
        "| `mystery.json` | a described measurement | CPU | - |"
        in (results / "README.md").read_text()
    )


def test_the_writers_records_without_a_committed_file_get_a_line():
    """Records the lab's scripts write but results/ holds none of now (`make bench-tool`, the
    top-k benches) get a line, so writing one does not fail the check; a record with none of
    kind, what or a known name gets none."""
    d = results_tables.describe
    tool = {"figures": {"apply_verify": {}, "wheel": {}}, "series": {"vllm_patches": 10}}
    assert "10 vLLM patches" in d("bench_tool-20270101T000000Z.json", tool)
    merge = {"summary": {"cases": 4, "cases_identical": 4}}
    assert "4/4 cases identical" in d("dcp-topk-merge-h200-0.34.0.json", merge)
    assert "1 case)" in d(
        "topk-order-h200-0.34.0.json", {"kind": "topk_order_repro", "order": [{}]}
    )
    assert d("bench_tool.json", tool) is None  # the name pattern is the writer's: bench_tool-<UTC>
    assert d("x.json", {"kind": "unknown"}) is None and d("x.log", None) is None


def test_the_nvfp4_records_and_a_distance_get_lines_from_their_data():
    """The nvfp4 accuracy and compile records say what they show from their own figures (the
    regimes, bytes per token; the target, its launches and whether all fit), and a distance
    record (kind dcp_gate_distance, written by `dcp_gate.py report` once the nvfp4 queue runs)
    states its two caches, its largest difference over the tolerance and the noise floor, and
    that it is not a gate."""
    import json

    from gate import verdict

    d = results_tables.describe
    (name, acc), *_ = results_tables.load("nvfp4-accuracy-*.json")
    line = d(name, acc)
    assert line.startswith("nvfp4_ds_mla (0013/0014) beside fp8_ds_mla")
    assert "against bf16 attention" in line
    assert all(r in line for r in acc["regimes"]) and "nvfp4_ds_mla 352" in line
    for name, comp in results_tables.load("nvfp4-compile-*.json"):
        cap = comp["rows"][0]["capability"]
        assert f"compiled offline for sm_{cap}, no GPU" in d(name, comp)
        assert "all compile and fit" in d(name, comp)
        assert results_tables.where_ran(comp) == "CPU"
    broken = {**comp, "failed": 2}
    assert "2 failed" in d(name, broken) and "all compile and fit" not in d(name, broken)

    cand = {"backend": "TRITON_MLA_SPARSE_FP8_DS_MLA", "tp": 1, "dcp": 1, "graphs": False}
    exact = {"all_exact": False, "prompts": {"a": {"exact": True}, "b": {"exact": False}}}
    dist = {
        "kind": verdict.DISTANCE_KIND,
        "name": "p-glmn-tp1-nvfp4-vs-fp8-0.34.0",
        "runs": {"reference": {}, "candidate": cand},
        "backend": {
            "reference_kv_cache_dtype": "fp8_ds_mla",
            "candidate_kv_cache_dtype": "nvfp4_ds_mla",
        },
        "prompts": {},
        "max_abs_logprob_diff": 0.25,
        "max_first_step_abs_logprob_diff": 0.1,
        "tokens_exact": exact,
        "note": verdict.DISTANCE_NOTE,
        "scale": {"ratio_to_tolerance": 1.5, "ratio_to_noise_floor": 12.0},
        "machine": {"gpus": ["NVIDIA H100 80GB HBM3"]},
        "timing_label": "one-GPU emulation (socket transport)",
    }
    assert verdict.validate_distance(dist) == []
    line = d("dcp-distance-p-glmn-tp1-nvfp4-vs-fp8-0.34.0.json", json.loads(json.dumps(dist)))
    assert "not a gate: the nvfp4_ds_mla run against the fp8_ds_mla one" in line
    assert "TP 1 DCP 1 eager" in line and "difference 0.25, 1.50x the tolerance" in line
    assert "12.00x the noise floor" in line and "exact in 1/2 prompts" in line
    assert results_tables.where_ran(dist) == "H100 80GB HBM3, one-GPU emulation"


def test_the_upstream_checks_run_record_is_not_listed(tmp_path, monkeypatch):
    """The record every `make test` writes into results/ (upstream-tests-<version>.json) is a
    run output, not a committed measurement: the README neither lists nor needs it."""
    (tmp_path / "upstream-tests-0.34.0.json").write_text('{"kind": "upstream-tests"}')
    (tmp_path / "x.json").write_text("{}")
    monkeypatch.setattr(results_tables, "RESULTS", tmp_path)
    assert [p.name for p in results_tables.results_files()] == ["x.json"]


def test_a_shown_command_names_no_folder_of_the_machine_it_ran_on():
    """The tables show a recorded command with the interpreter by name, repository and vLLM-tree
    files from their top folder and other absolute paths as placeholders; the record keeps it."""
    shown = results_tables.shown_command
    assert (
        shown(
            "/root/lab/.venv/bin/python3 /root/lab/evidence/bench.py --kernel-path "
            "/root/lab/tree/vllm/v1/ops/k.py --vllm-tree /root/lab/tree "
            "--out /root/lab/session/kb.json --work=/root/lab/w2326 --budget-s 110 --dir /root/lab"
        )
        == "python3 evidence/bench.py --kernel-path <tree>/vllm/v1/ops/k.py --vllm-tree <tree> "
        "--out <out>/kb.json --work=<work> --budget-s 110 --dir <path>"
    )
    assert shown("python evidence/x.py --out results/a.json --note 'two words'") == (
        "python evidence/x.py --out results/a.json --note 'two words'"
    )
    assert shown("/root/lab/.venv/bin/python x.py --tree /root/lab/t/vllm/tests/a.py") == (
        "python x.py --tree <tree>/vllm/tests/a.py"
    )


def test_no_rendered_command_names_a_machine_path():
    """design/results.md shows every committed record's command through shown_command."""
    text = results_tables.OUT.read_text()
    commands = re.findall(r"command `([^`]*)`", text)
    assert commands
    for command in commands:
        assert not re.search(r"(?<![\w.<>-])/(work|root|home|opt|mnt|tmp)/", command), command


def test_a_ledger_line_states_each_entrys_memory_outside_torch():
    """A ledger whose entries read memory outside torch states the largest rank's reading per
    entry in MiB, skipping a rank NVML could not read; one without readings says nothing of
    memory."""
    d = results_tables.describe
    ledger = {
        "kind": "dcp_comm_ledger",
        "prompts": ["a", "b"],
        "entries": {
            "b12x": {"non_torch_bytes": {"0": 1874853888, "1": 1872756736}},
            "a2a": {"non_torch_bytes": {"0": 1835008000, "1": 1835008000}},
        },
    }
    line = d("dcp-ledger-x.json", ledger)
    assert line.endswith("; MiB outside torch per rank: b12x 1,788, a2a 1,750")
    ledger["entries"]["b12x"]["non_torch_bytes"]["0"] = None  # NVML could not read rank 0
    assert d("dcp-ledger-x.json", ledger).endswith("b12x 1,786, a2a 1,750")
    ledger["entries"] = {"b12x": {}, "a2a": {"non_torch_bytes": {"0": None}}}
    assert "outside torch" not in d("dcp-ledger-x.json", ledger)
