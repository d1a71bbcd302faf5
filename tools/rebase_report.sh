#!/usr/bin/env bash
# Regenerate results/rebase-<version>.json: `patchset rebase --onto vllm==<version> --dry-run`
# over the series, which reports per patch clean / offsets / merged / conflict / absorbed.
#
#   tools/rebase_report.sh VERSION [--all-patches]
#
# VERSION (required) is the release to try, newer than the pinned base. --all-patches runs on a
# temporary copy of the checkout whose series lists every patches/vllm/*.patch in number order
# (for use while `series` does not list them yet); patches whose Depends-on is missing from
# patches/ are left out and named.
# Needs network once for the sdist (pip; cached under .cache/patchset/rebase, pinned by sha256).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-}
if [ -z "$version" ]; then
    echo "usage: tools/rebase_report.sh VERSION [--all-patches] (the vLLM release to try)" >&2
    exit 2
fi
all=${2:-}
py=${PATCHSET_PYTHON:-.venv/bin/python}
out=results/rebase-${version}.json
repo=$PWD
if [ "$all" = "--all-patches" ]; then
    repo=$(mktemp -d "${TMPDIR:-/tmp}/rebase-report-XXXXXX")
    trap 'rm -rf "$repo"' EXIT
    cp pins.toml "$repo/"
    mkdir -p "$repo/patches/vllm"
    : > "$repo/series"
    listed=" "
    for p in patches/vllm/*.patch; do
        missing=""
        for dep in $(sed -n 's/^Depends-on: //p' "$p"); do
            case "$listed" in *" $dep "*) ;; *) missing="$missing $dep" ;; esac
        done
        if [ -n "$missing" ]; then
            echo "leaving out ${p#patches/}: Depends-on$missing not listed" >&2
            continue
        fi
        cp "$p" "$repo/patches/vllm/"
        echo "vllm/$(basename "$p")" >> "$repo/series"
        listed="$listed vllm/$(basename "$p") "
    done
    export PATCHSET_CACHE=${PATCHSET_CACHE:-$PWD/.cache/patchset}
fi
# REBASE_SDIST=<file> uses a local copy of the sdist instead of pip (it is pinned all the same).
PYTHONPATH=$PWD/tools${PYTHONPATH:+:$PYTHONPATH} "$py" -m patchset -C "$repo" \
    rebase --onto "vllm==${version}" --dry-run --json "$PWD/$out" \
    ${REBASE_SDIST:+--sdist "$REBASE_SDIST"}
