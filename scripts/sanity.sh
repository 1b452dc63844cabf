#!/usr/bin/env bash
# Run `ansible-test sanity` on the files git would commit (tracked plus untracked-not-ignored).
# ansible-test must run from inside .../ansible_collections/NAMESPACE/NAME and refuses a path
# reached through a symlink, so the files are copied into a temporary tree of that shape.
# Extra arguments go to ansible-test, e.g. `scripts/sanity.sh --test validate-modules`.
# The results (tests/output) are copied to reports/sanity/ for inspection.
# GPUNODE_ANSIBLE_BIN: the bin directory of another ansible-core's environment, whose ansible-test
# runs instead of .venv's (`scripts/matrix.py bin 2.16`); results then go to reports/sanity-2.16.19/.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD
BIN=${GPUNODE_ANSIBLE_BIN:-$REPO/.venv/bin}
[[ -x $BIN/ansible-test ]] || {
    echo "sanity: $BIN/ansible-test missing; run scripts/setup.sh (or scripts/matrix.py setup)" >&2
    exit 1
}
export PATH=$BIN:$PATH
RESULTS=reports/sanity
if [[ -n ${GPUNODE_ANSIBLE_BIN:-} ]]; then
    RESULTS=reports/sanity-$("$BIN/python" -c 'from ansible.release import __version__; print(__version__)')
fi

# Test the venv's Python only: without --python ansible-test tries every pyenv shim.
PY_VERSION=$("$BIN/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpunode-sanity.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
COLLECTION=$WORK/ansible_collections/gpunode/tuning
mkdir -p "$COLLECTION"

# --deleted files are still listed by -c until staged; copy only what exists.
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' path; do
        if [[ -e $path || -L $path ]]; then printf '%s\0' "$path"; fi
    done |
    tar --null --files-from=- -cf - | tar -xf - -C "$COLLECTION"

rc=0
(cd "$COLLECTION" && ansible-test sanity --python "$PY_VERSION" --color no "$@") || rc=$?

rm -rf "$RESULTS"
if [[ -d $COLLECTION/tests/output ]]; then
    mkdir -p reports
    cp -r "$COLLECTION/tests/output" "$RESULTS"
fi
exit "$rc"
