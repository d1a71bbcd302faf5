# dcp-series: every target runs the tool from the repository venv .venv (`make setup`).
#
#   make wheel                 fetch the pins, apply + verify the series on build/vllm, build
#                              both overlay wheels: dist/vllm-<base>+dcp.<digest>-...x86_64.whl
#                              (<base>: the vLLM release pins.toml pins; dist/receipt.json) and
#                              ...-manylinux_2_28_aarch64.whl for DGX Spark, GB10
#                              (dist/receipt-aarch64.json); PLATFORM=x86_64 or PLATFORM=aarch64
#                              builds that one only
#   make test                  lock check, a fresh test venv with the overlay wheel (pip), then
#                              two suites at a time: tool tests, proofs, vLLM-tree tests,
#                              upstream tests, the evidence lab's CPU tests; each one timed
#   make apply|verify VLLM=<path>   apply / verify the series on another vLLM tree
#   make upstream-tests        the base's own tests of the touched modules vs the stock baseline
#                              (also in make test); make upstream-baseline regenerates it
#   make ci-local              CI as CI runs it, on a fresh clone of the committed main
#   make evidence-tests        the evidence lab's CPU tests (also in make test)
#   make lease-tests           the lab's GPU-lease plumbing tests (not in make test; CI runs them)
#   make proofs | lint | bench-tool | setup | clean

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PATCHSET := $(PY) -m patchset
VLLM ?= build/vllm
TESTENV ?= build/testenv
TESTPY := $(TESTENV)/bin/python
# Set REUSE_TESTENV=1 to keep a test venv that already has the same wheel installed.
REUSE_TESTENV ?=
# Set FETCH_FROM=<dir> to seed the download cache from local copies (still hash-checked).
FETCH_FROM ?=
PYTEST_ARGS ?=

STAMP := $(VENV)/.dcp-setup

.PHONY: setup fetch apply verify wheel lock-check tool-tests testenv proofs tree-tests test \
	lint bench-tool clean

setup: $(STAMP)

# The oldest Python the tool has run on (Debian 12's python3); .ci/run and README say the same.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11, 2) and \
	  "$(PYTHON) is Python " + sys.version.split()[0] + "; python3 >= 3.11.2 is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[test]'
	touch $@

fetch: setup
	$(PATCHSET) fetch $(if $(FETCH_FROM),--from $(FETCH_FROM))

# --if-needed: exit 0 when the series is already applied and verifies (a drifted or
# half-written tree exits 1; exit 2 would also be an argparse usage error).
apply: fetch
	$(PATCHSET) apply --if-needed --tree $(VLLM)

verify: setup
	$(PATCHSET) verify --tree $(VLLM)

# Both overlay wheels by default (x86_64 first: the test venv installs it), side by side in
# dist/ with their receipts; PLATFORM=x86_64 or PLATFORM=aarch64 builds that one only.
PLATFORM ?=
WHEEL_PLATFORMS = $(if $(PLATFORM),$(PLATFORM),x86_64 aarch64)
wheel: apply verify
	for arch in $(WHEEL_PLATFORMS); do \
	  $(PATCHSET) wheel --tree $(VLLM) --platform $$arch || exit 1; done

lock-check: setup
	$(PATCHSET) lock --check

RUN_TOOL_TESTS = PATCHSET_TEST_VENV=$(abspath $(TESTENV)) PATCHSET_TEST_TREE=$(abspath $(VLLM)) \
	$(PY) -m pytest -v -rfEs -p no:cacheprovider --continue-on-collection-errors tests $(PYTEST_ARGS)
RUN_PROOFS = DCP_VLLM_TREE=$(abspath $(VLLM)) TRITON_INTERPRET=1 \
	$(TESTPY) -m pytest -v -rfEs -p no:cacheprovider --continue-on-collection-errors --timeout=900 proofs $(PYTEST_ARGS)
RUN_TREE_TESTS = $(PY) tests/vllm_tree_tests.py run --tree $(VLLM) --venv $(TESTENV)

# Tool tests; the end-to-end ones that need the test venv skip (with the reason) without it.
tool-tests: setup
	$(RUN_TOOL_TESTS)

# The GPU evidence lab's own tests (gate verdicts, plans, renderer), on CPU.
RUN_EVIDENCE_TESTS = PATCHSET_TEST_VENV=$(abspath $(TESTENV)) \
	$(PY) -m pytest -v -rfEs -p no:cacheprovider evidence/tests $(PYTEST_ARGS)
evidence-tests: setup
	$(RUN_EVIDENCE_TESTS)

# The lab's GPU-lease plumbing (evidence/dev: the lease and session scripts dry-run with stub
# commands, the CUDA-test bundle, the interpreter rewrite of CUDA tests), on CPU. The project's
# own device service, not the product nor the gates: not in `make test`; .ci/run runs it after.
lease-tests: setup
	PATCHSET_TEST_VENV=$(abspath $(TESTENV)) \
	  $(PY) -m pytest -v -rfEs -p no:cacheprovider evidence/dev/tests $(PYTEST_ARGS)
.PHONY: evidence-tests lease-tests

TESTENV_CMD = $(PY) tests/vllm_tree_tests.py venv --venv $(TESTENV)

# `make test` makes a fresh test venv (REUSE_TESTENV=1 keeps one); proofs and tree-tests on their
# own reuse an existing one (reinstalling only the wheel when it changed).
testenv: wheel
	$(TESTENV_CMD) $(if $(REUSE_TESTENV),--reuse)

proofs: wheel
	$(TESTENV_CMD) --reuse
	$(RUN_PROOFS)

tree-tests: wheel
	$(TESTENV_CMD) --reuse
	$(RUN_TREE_TESTS)

# vLLM's own tests of every module the series touches (tests/upstream_tests.py,
# design/upstream-tests.md): the pinned base's test files, unedited, against the overlay wheel,
# compared per test id with the committed stock baseline results/upstream-baseline-<version>.json;
# a stock pass that does not pass on patched fails. `make upstream-baseline` regenerates the
# baseline (new pin or touched set) in STOCKENV, a venv with the OFFICIAL pinned wheel, or with
# STOCK_PYTHON=<python that has it>.
STOCKENV ?= build/stockenv
STOCK_PYTHON ?=
# The baseline's time budget (s): files run strongest rule first; those not finished in time are
# recorded as over the budget and not run on patched either (bounds CI's time).
UPSTREAM_BUDGET ?= 900
RUN_UPSTREAM = $(PY) tests/upstream_tests.py check --venv $(TESTENV)

upstream-tests: wheel
	$(TESTENV_CMD) --reuse
	$(RUN_UPSTREAM)

upstream-baseline: fetch
	$(PY) tests/upstream_tests.py baseline --limit $(UPSTREAM_BUDGET) \
	  $(if $(STOCK_PYTHON),--python $(STOCK_PYTHON),--stock-venv $(STOCKENV))

.PHONY: upstream-tests upstream-baseline

# All suites run even if one fails; PATCHSET_E2E=require turns any end-to-end skip into a failure.
# tests/run_suites.py runs them JOBS at a time (default: both cores of a CI machine), longest
# first, and prints each suite's log whole when it ends, with its wall time, then a table of all.
JOBS ?=
test: lock-check testenv
	$(PY) tests/run_suites.py $(if $(JOBS),--jobs $(JOBS)) \
	  'upstream=$(RUN_UPSTREAM)' \
	  'tree=$(RUN_TREE_TESTS)' \
	  'proofs=$(RUN_PROOFS)' \
	  'evidence=$(RUN_EVIDENCE_TESTS)' \
	  'tool=PATCHSET_E2E=require $(RUN_TOOL_TESTS)'

lint: setup
	$(PY) -m ruff check tools tests evidence proofs
	$(PY) -m ruff format --check tools tests evidence proofs
	$(PY) -m mypy
	$(PATCHSET) lock --check
	$(PY) evidence/results_tables.py --check

bench-tool: setup fetch
	$(PY) evidence/bench_tool.py
	$(PY) evidence/results_tables.py

clean:
	rm -rf build/vllm build/base build/testenv dist

# CI rehearsed as CI runs it: a fresh clone of the committed `main`, `bash .ci/run` there with
# CI=true, no standard input, `env -i` (plain PATH, empty HOME, cold caches); each step's and
# suite's time and the verdict; the clone is removed afterwards (.ci/local says more).
ci-local:
	bash .ci/local
.PHONY: ci-local

# ----------------------------------------------------------------------------------------------
# Upstream export, per-patch lint and the rebase report (patchset export / lint / rebase);
# see design/upstreaming.md.
#   make export          dist/export/<target>/NNNN-*.mbox + .pr.md, then the standalone check
#                        table (git am onto the pinned base + Depends-on only) with each patch's
#                        own tests run by EXPORT_PYTHON (vLLM + its test deps; default: the test
#                        venv, whose series-patched files are overlaid per patch)
#   make lint            also lints every patch: ruff with the base tree's config on the files it
#                        touches (RUFF=<ruff>; the pinned base's pre-commit pins ruff by
#                        commit), SPDX, stray prints
#   make rebase-report   dry-run rebase onto vllm==$(REBASE_ONTO) -> results/rebase-$(REBASE_ONTO).json
EXPORT_PYTHON ?= $(abspath $(TESTPY))
EXPORT_ARGS ?=
RUFF ?=
REBASE_ONTO ?=

.PHONY: export lint-patches rebase-report

export: fetch
	$(PATCHSET) export --check --test-python $(EXPORT_PYTHON) $(EXPORT_ARGS)

lint-patches: fetch
	$(PATCHSET) lint $(if $(RUFF),--ruff $(RUFF))

lint: lint-patches lint-docs

# vLLM renders docs/design/attention_backends.md from the backend registry at docs-build time;
# run that generator on the patched tree: every backend gets a row, and the page matches the
# committed rendering (regenerate it with `make lint-docs DOCS_UPDATE=--update`).
DOCS_UPDATE ?=
lint-docs: apply
	$(PY) tools/check_attention_backend_docs.py $(VLLM) --snapshot design/attention_backends.rendered.md $(DOCS_UPDATE)
.PHONY: lint-docs

rebase-report: fetch
	@test -n "$(REBASE_ONTO)" || { echo "make rebase-report REBASE_ONTO=<vLLM release to try>" >&2; exit 2; }
	tools/rebase_report.sh $(REBASE_ONTO)

# The patch-authoring repository (CONTRIBUTING.md): the pinned vLLM sdist, unpacked and committed
# as one commit on branch `base` of build/vllm-git, so each patch is one commit of a worktree.
DEV_REPO := build/vllm-git
BASE_VERSION = $(shell sed -n 's/^requirement = "vllm==\(.*\)"/\1/p' pins.toml | head -n 1)
dev-repo: fetch
	@if [ -d $(DEV_REPO)/.git ]; then echo "$(DEV_REPO) exists"; else \
	  PYTHONPATH=tools $(PY) -c 'import sys; from pathlib import Path; from patchset.fetch import unpack_sdist; unpack_sdist("vllm", Path(sys.argv[1]))' $(DEV_REPO) && \
	  git -C $(DEV_REPO) init -q -b base && git -C $(DEV_REPO) add -f -A && \
	  git -C $(DEV_REPO) -c user.name=dcp-series -c user.email=dcp-series@example.invalid \
	    commit -q -m "vLLM $(BASE_VERSION) sdist (pristine, all files)" && \
	  echo "$(DEV_REPO): branch base at $$(git -C $(DEV_REPO) rev-parse --short HEAD)"; fi
.PHONY: dev-repo
