# shellcheck shell=bash
# Variables here are used by the scripts that source this file.
# shellcheck disable=SC2034
# Shared settings and helpers of the tests/vm scripts; sourced, not run.
#
# Cache layout (outside the repository, stable across checkouts and sessions):
#   $GPUNODE_VM_CACHE/image/<key>/   guest disk, kernel, initrd, SSH key, SSDT (build-image.sh)
#   $GPUNODE_VM_CACHE/qemu/<key>/    QEMU with a writable MRRS field (build-qemu.sh)
#   $GPUNODE_VM_CACHE/runs/<name>/   one running VM: overlay disk, console log, pid files (vm.sh)
# <key> is a hash of every input of that build; an entry is complete once its `ok` file exists.

GPUNODE_VM_CACHE=${GPUNODE_VM_CACHE:-/var/cache/gpunode-tuning/vm}
VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$VM_DIR/../.." && pwd)
DEBIAN_SUITE=${GPUNODE_VM_SUITE:-bookworm}
DEBIAN_MIRROR=${GPUNODE_VM_MIRROR:-http://deb.debian.org/debian}
# C.UTF-8: stable tool output, and Ansible refuses a non-UTF-8 locale.
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8

# Logs go to the stderr the script started with, also from commands whose output is redirected.
exec {VM_LOG_FD}>&2
vm_log() { printf '%s vm: %s\n' "$(date +%H:%M:%S)" "$*" >&"$VM_LOG_FD"; }
vm_die() {
    vm_log "ERROR: $*"
    exit 1
}

# shellcheck source=scripts/apt.sh
source "$REPO_DIR/scripts/apt.sh"

# apt-get under the project's apt lock (scripts/apt.sh): the two builds of run.sh run side by
# side, and `make setup --tests` has normally installed everything before either starts.
vm_apt_get() {
    gpunode_apt_get "$@"
}

# Install Debian packages that are missing on the host (no-op when all are installed).
vm_require_packages() {
    local missing
    mapfile -t missing < <(gpunode_apt_missing "$@")
    ((${#missing[@]} == 0)) && return 0
    ((EUID == 0)) || vm_die "missing host packages ${missing[*]}; run as root or install them"
    vm_log "installing host packages: ${missing[*]}"
    gpunode_apt_install "${missing[@]}" || vm_die "installing ${missing[*]} failed"
}

# Print a short hash of the given strings and files (files by content, strings as given).
# Comment lines of shell scripts do not count: editing a comment must not rebuild an image.
vm_hash() {
    local item
    for item in "$@"; do
        if [[ -f $item ]]; then
            printf 'file %s\n' "${item##*/}"
            if [[ $item == *.sh ]]; then
                grep -v '^[[:space:]]*#' "$item" || true
            else
                cat "$item"
            fi
        else
            printf 'value %s\n' "$item"
        fi
    done | sha256sum | cut -c1-16
}

# Run a command, then log how long it took: "<label>: <seconds> s".
vm_timed() {
    local label=$1 start rc=0
    shift
    start=$(date +%s)
    "$@" || rc=$?
    vm_log "$label: $(($(date +%s) - start)) s (rc $rc)"
    return "$rc"
}
