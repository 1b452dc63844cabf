#!/usr/bin/env bash
# Run `ansible-test sanity` on the files git would commit (tracked plus untracked-not-ignored).
# ansible-test must run from inside .../ansible_collections/NAMESPACE/NAME and refuses a path
# reached through a symlink, so the files are copied into a temporary tree of that shape.
# Extra arguments go to ansible-test, e.g. `scripts/sanity.sh --test validate-modules`.
# The results (tests/output) are copied to reports/sanity/ for inspection.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$PWD
VENV=$REPO/.venv
[[ -x $VENV/bin/ansible-test ]] || {
    echo "sanity: $VENV/bin/ansible-test missing; run scripts/setup.sh" >&2
    exit 1
}
export PATH=$VENV/bin:$PATH

# Test the venv's Python only: without --python ansible-test tries every pyenv shim.
PY_VERSION=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

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

rm -rf reports/sanity
if [[ -d $COLLECTION/tests/output ]]; then
    mkdir -p reports
    cp -r "$COLLECTION/tests/output" reports/sanity
fi
exit "$rc"
