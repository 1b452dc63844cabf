#!/usr/bin/env bash
# Prepare this checkout for `make demo` and `make test` on Debian 12:
#   1. apt packages (installed only when missing; with --tests also those of every test stage),
#   2. .venv from requirements.txt (skipped while its stamp matches),
#   3. the .collections symlink that makes the checkout usable as gpunode.tuning,
#   4. the offline pip bootstrap script that ansible-test would otherwise download.
# Safe to rerun; a rerun with nothing to do takes well under a second.
#   scripts/setup.sh [--tests]
# --tests (make test and its stages): every package any test stage needs is installed here, once
# and serially, before any stage runs anything in parallel (scripts/apt.sh).
# Environment: PYTHON (default python3, must be >= 3.11).
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
# shellcheck source=scripts/apt.sh
source scripts/apt.sh

APT_PACKAGES=("${GPUNODE_APT_BASE[@]}")
# Packages whose services must not start when they install (the tests start their own).
NO_START_PACKAGES=()
case ${1:-} in
"") ;;
--tests)
    APT_PACKAGES+=("${GPUNODE_APT_TESTS[@]}" "${GPUNODE_APT_VM_HOST[@]}" "${GPUNODE_APT_QEMU_BUILD[@]}")
    NO_START_PACKAGES+=("${GPUNODE_APT_PROMETHEUS[@]}" "${GPUNODE_APT_SLURM[@]}")
    ;;
*)
    echo "usage: scripts/setup.sh [--tests]" >&2
    exit 2
    ;;
esac
PYTHON=${PYTHON:-python3}
VENV=.venv
COLLECTION_LINK=.collections/ansible_collections/gpunode/tuning

export DEBIAN_FRONTEND=noninteractive PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf 'setup: %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

install_apt_packages() {
    # De-duplicated; gpunode_apt_install is a no-op (dpkg-query only) when all are installed.
    mapfile -t APT_PACKAGES < <(printf '%s\n' "${APT_PACKAGES[@]}" | sort -u)
    gpunode_apt_install "${APT_PACKAGES[@]}" || die "installing apt packages failed"
    if ((${#NO_START_PACKAGES[@]})); then
        gpunode_apt_install_no_start "${NO_START_PACKAGES[@]}" || die "installing ${NO_START_PACKAGES[*]} failed"
    fi
}

python_is_supported() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

create_venv() {
    if [[ -x $VENV/bin/python ]] && python_is_supported "$VENV/bin/python"; then
        return
    fi
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found; Python >= 3.11 is required (set PYTHON=...)"
    python_is_supported "$PYTHON" ||
        die "$PYTHON is '$("$PYTHON" -V 2>&1 || true)'; Python >= 3.11 is required (pyenv: set PYTHON=python3.11)"
    # Resolve a pyenv shim to the real interpreter so the venv does not depend on the shim.
    local interpreter
    interpreter=$("$PYTHON" -c 'import sys; print(sys.executable)')
    if [[ -e $VENV ]]; then
        log "$VENV is broken or too old; recreating it"
        rm -rf "$VENV"
    fi
    log "creating $VENV with $interpreter ($("$interpreter" -V 2>&1))"
    "$interpreter" -m venv "$VENV"
}

install_requirements() {
    local digest stamp
    digest=$({
        cat requirements.txt
        "$VENV/bin/python" -VV
    } | sha256sum | cut -c1-16)
    stamp=$VENV/.requirements-$digest
    if [[ -e $stamp ]]; then
        return
    fi
    log "installing requirements.txt into $VENV"
    "$VENV/bin/python" -m pip install --quiet -r requirements.txt
    rm -f "$VENV"/.requirements-*
    touch "$stamp"
}

link_collection() {
    if [[ $(readlink "$COLLECTION_LINK" 2>/dev/null) == ../../.. ]]; then
        return
    fi
    if [[ -e $COLLECTION_LINK && ! -L $COLLECTION_LINK ]]; then
        die "$COLLECTION_LINK exists and is not a symlink; remove it"
    fi
    mkdir -p "$(dirname "$COLLECTION_LINK")"
    ln -sfn ../../.. "$COLLECTION_LINK"
}

install_offline_get_pip() {
    # ansible-test downloads get-pip.py from ci-files.testing.ansible.com (unreachable here)
    # unless ~/.ansible/test/cache/get_pip_<version>.py exists. The version is the pip that
    # ansible-test pins for its sanity venvs; ask ansible-test itself.
    local pip_version target
    pip_version=$("$VENV/bin/python" -c '
import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="%d.%d" % __import__("sys").version_info[:2]))["pip"])
') || die "cannot read the pip version from ansible-test; its internals changed, see scripts/offline_get_pip.py"
    target=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
    if ! cmp -s scripts/offline_get_pip.py "$target"; then
        log "placing offline pip bootstrap at $target"
        install -D -m 0644 scripts/offline_get_pip.py "$target"
    fi
}

install_apt_packages
create_venv
install_requirements
link_collection
install_offline_get_pip
