#!/usr/bin/env bash
# Static checks: ruff (Python), antsibull-changelog (fragments), ansible-lint (production
# profile, offline). Runs every check and fails if any of them failed.
set -uo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1
VENV=$PWD/.venv
export PATH=$VENV/bin:$PATH
# ansible-lint runs offline, so it cannot install this collection: find it via the symlink
# .collections/ansible_collections/gpunode/tuning -> checkout (made by scripts/setup.sh).
export ANSIBLE_COLLECTIONS_PATH=$PWD/.collections
# Escape codes only for a terminal, not for CI logs.
[[ -t 1 ]] || export NO_COLOR=1

failed=()
run() {
    printf '==> %s\n' "$*"
    "$@" || failed+=("$1")
}

run ruff check .
run antsibull-changelog lint
run ansible-lint

if ((${#failed[@]})); then
    printf 'lint: FAILED: %s\n' "${failed[*]}" >&2
    exit 1
fi
