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

# ansible-lint exits 0 when a lower profile than the configured one passes (its last line then
# says "Profile 'production' was required, but 'safety' profile passed"), and warnings do not
# fail it: --strict makes warnings fail, and the profile line is checked here.
ansible_lint_production() {
    local out rc=0
    out=$(ansible-lint --strict 2>&1) || rc=$?
    printf '%s\n' "$out"
    if grep -q "was required, but" <<<"$out"; then
        echo "ansible-lint: the production profile is not met (see above)" >&2
        return 1
    fi
    return "$rc"
}

run ruff check .
run antsibull-changelog lint
run ansible_lint_production

if ((${#failed[@]})); then
    printf 'lint: FAILED: %s\n' "${failed[*]}" >&2
    exit 1
fi
