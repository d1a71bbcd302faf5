#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Run a patched vLLM tree's tests against the installed vLLM 0.33.0 wheel (the test venv of
# `make testenv`), every file of TREE/vllm that differs from the installed one shadowing it:
#     evidence/dev/tree_pytest.sh TREE tests/kernels/attention/test_triton_sparse_mla.py -q
# The shadow is a symlink farm of the installed package with the tree's differing .py files
# copied in, first on PYTHONPATH, so compiled extensions come from the wheel and Python from
# the tree; the tree's tests/ and pyproject.toml (its pytest markers) run from a scratch copy.
# TRITON_INTERPRET defaults to 1 (CPU); TESTPY picks another interpreter.
set -euo pipefail
TREE=$(realpath "${1:?usage: tree_pytest.sh TREE [pytest args...]}"); shift
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${TESTPY:-$HERE/build/testenv/bin/python}
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -d "$SITE/vllm" ] || { echo "no installed vllm under $SITE (make testenv)"; exit 1; }
W=$(mktemp -d "${TMPDIR:-/tmp}/tree-pytest-XXXX")
trap 'rm -rf "$W"' EXIT
cp -rs "$SITE/vllm" "$W/vllm"
(cd "$TREE" && find vllm -name '*.py') | while read -r f; do
  if [ ! -e "$W/$f" ] || ! cmp -s "$TREE/$f" "$W/$f"; then
    mkdir -p "$(dirname "$W/$f")"; rm -f "$W/$f"; cp "$TREE/$f" "$W/$f"
  fi
done
mkdir -p "$W/run"; cp -r "$TREE/tests" "$W/run/tests"; cp "$TREE/pyproject.toml" "$W/run/"
cd "$W/run"
PYTHONPATH="$W${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 TRITON_INTERPRET=${TRITON_INTERPRET:-1} \
  "$PY" -m pytest -p no:cacheprovider "$@"
