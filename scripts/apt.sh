# shellcheck shell=bash
# The package lists are used by the scripts that source this file.
# shellcheck disable=SC2034
# Debian packages for the project's own scripts; sourced by scripts/setup.sh and tests/vm/lib.sh.
#
# Every apt-get of the project goes through gpunode_apt_get, which holds one lock file for the
# whole call. Two apt processes at once fail on a fresh machine even with DPkg::Lock::Timeout:
# that option waits for the dpkg lock, not for /var/lib/apt/lists/lock that `apt-get update`
# takes. The flock below serialises both, across our scripts and background jobs.
#
# `apt-get update` runs at most once per hour of runs (stamp file): a run that installs in
# several steps (setup, then a guest-kernel header package in the VM stage) refreshes the lists
# once. An install that fails on lists older than this run's start is retried after one update.

# /var/lock is root's; a non-root user (apt through sudo) locks in /tmp instead.
if ((EUID == 0)); then
    GPUNODE_APT_LOCK=${GPUNODE_APT_LOCK:-/var/lock/gpunode-tuning-apt.lock}
else
    GPUNODE_APT_LOCK=${GPUNODE_APT_LOCK:-${TMPDIR:-/tmp}/gpunode-tuning-apt.lock}
fi
GPUNODE_APT_STAMP=${GPUNODE_APT_STAMP:-/var/cache/gpunode-tuning/apt-lists-updated}
GPUNODE_APT_LOCK_WAIT=${GPUNODE_APT_LOCK_WAIT:-1800}

# What each use needs. The lists are the one source: setup.sh installs them up front, the VM
# scripts name them again only as a no-op safety net for running a script on its own.
# Demo and playbooks on simulated nodes: real lspci/setpci, modprobe.
GPUNODE_APT_BASE=(pciutils kmod make git)
# Test stages: sanity (shellcheck), Molecule (podman with runc, debootstrap images).
GPUNODE_APT_TESTS=(shellcheck podman runc uidmap fuse-overlayfs slirp4netns debootstrap)
# test-vm host side: the guest image (build-image.sh) and running it (vm.sh).
GPUNODE_APT_VM_HOST=(debootstrap e2fsprogs qemu-system-x86 qemu-utils acpica-tools openssh-client gcc make)
# test-vm: QEMU with a writable MRRS field, built from Debian's source (build-qemu.sh).
GPUNODE_APT_QEMU_BUILD=(qemu-system-x86 dpkg-dev gcc make ninja-build meson pkg-config python3 patch
    libglib2.0-dev libpixman-1-dev libslirp-dev zlib1g-dev libfdt-dev)
# integration (tests/integration/test_guard_prometheus.py): the real node_exporter textfile
# collector and a Prometheus server with promtool, started by the test itself on loopback.
# Installed with service starts blocked (gpunode_apt_install_no_start).
GPUNODE_APT_PROMETHEUS=(prometheus prometheus-node-exporter)
# integration (tests/support/slurm.py): Debian's Slurm 22.05 and MUNGE, a controller and one slurmd
# per simulated host started by the tests themselves on loopback ports, with their own key and
# directories. Installed with service starts blocked: the packages' own daemons must not run.
GPUNODE_APT_SLURM=(slurmctld slurmd slurm-client munge)
# benchmarks/bench_ssh_fleet.py only (not a test stage): its own sshd on loopback addresses.
GPUNODE_APT_BENCH=(openssh-server openssh-client)

# apt-get itself, for callers that hold the lock.
_gpunode_apt_raw() {
    local sudo=()
    ((EUID == 0)) || sudo=(sudo -n)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 -qq "$@" </dev/null
}

# _gpunode_locked CMD...: run CMD (a function of this file) holding the project's apt lock.
_gpunode_locked() {
    (
        flock -w "$GPUNODE_APT_LOCK_WAIT" 9 || {
            echo "apt: waited ${GPUNODE_APT_LOCK_WAIT} s for $GPUNODE_APT_LOCK; giving up" >&2
            exit 1
        }
        "$@"
    ) 9>>"$GPUNODE_APT_LOCK"
}

# gpunode_apt_get ARGS...: apt-get under the project's lock (e.g. a private-lists `update`).
gpunode_apt_get() {
    _gpunode_locked _gpunode_apt_raw "$@"
}

# gpunode_apt_missing PKG...: print the packages that are not installed, one a line.
gpunode_apt_missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null | grep -qx installed || echo "$pkg"
    done
}

# True when the package lists were refreshed less than an hour ago.
_gpunode_apt_lists_fresh() {
    [[ -n $(find "$GPUNODE_APT_STAMP" -mmin -60 2>/dev/null) ]]
}

_gpunode_apt_update() {
    echo "apt: refreshing the package lists" >&2
    _gpunode_apt_raw update || return 1
    { mkdir -p "$(dirname "$GPUNODE_APT_STAMP")" && touch "$GPUNODE_APT_STAMP"; } 2>/dev/null || true
}

# Runs under the lock: what another process installed while we waited is not installed again,
# and the freshness of the lists is judged after that process's update.
_gpunode_apt_install_locked() {
    local missing updated=
    mapfile -t missing < <(gpunode_apt_missing "$@")
    ((${#missing[@]})) || return 0
    echo "apt: installing ${missing[*]}" >&2
    if ! _gpunode_apt_lists_fresh; then
        _gpunode_apt_update || return 1
        updated=1
    fi
    _gpunode_apt_raw install -y --no-install-recommends "${missing[@]}" && return 0
    [[ -z $updated ]] || return 1
    echo "apt: install failed on lists from an earlier run; refreshing them once" >&2
    _gpunode_apt_update && _gpunode_apt_raw install -y --no-install-recommends "${missing[@]}"
}

# gpunode_apt_install PKG...: install the missing ones (no lock and no apt when all are there).
gpunode_apt_install() {
    [[ -n $(gpunode_apt_missing "$@") ]] || return 0
    command -v apt-get >/dev/null || {
        echo "apt: missing packages $(gpunode_apt_missing "$@" | xargs) and no apt-get to install them" >&2
        return 1
    }
    ((EUID == 0)) || command -v sudo >/dev/null || {
        echo "apt: missing packages $(gpunode_apt_missing "$@" | xargs): run as root or install sudo" >&2
        return 1
    }
    _gpunode_locked _gpunode_apt_install_locked "$@"
}

# Runs under the lock: like _gpunode_apt_install_locked, with every service start of the
# packages' maintainer scripts refused (policy-rc.d exit 101) and, when PID 1 is systemd, their
# units disabled afterwards. The policy is needed without systemd too: invoke-rc.d runs a
# package's init script when no policy forbids it (munge's would start munged with the system key).
_gpunode_apt_install_no_start_locked() {
    local policy=/usr/sbin/policy-rc.d own_policy='' rc=0 units=() pkg unit
    [[ -n $(gpunode_apt_missing "$@") ]] || return 0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# gpunode.tuning setup: no service starts while test tools install\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        own_policy=1
    fi
    _gpunode_apt_install_locked "$@" || rc=$?
    [[ -z $own_policy ]] || rm -f "$policy"
    if ((rc == 0)) && [[ -d /run/systemd/system ]]; then
        for pkg in "$@"; do
            while read -r unit; do
                [[ $unit == *.service || $unit == *.timer ]] && units+=("${unit##*/}")
            done < <(dpkg -L "$pkg" 2>/dev/null | grep -E '^/(usr/)?lib/systemd/system/[^/]+$' || true)
        done
        ((${#units[@]} == 0)) || systemctl disable --now "${units[@]}" >/dev/null 2>&1 || true
    fi
    return "$rc"
}

# gpunode_apt_install_no_start PKG...: install the missing ones without starting their services
# (test tools that the tests start themselves, on loopback: prometheus, node_exporter, Slurm, MUNGE).
gpunode_apt_install_no_start() {
    [[ -n $(gpunode_apt_missing "$@") ]] || return 0
    command -v apt-get >/dev/null || {
        echo "apt: missing packages $(gpunode_apt_missing "$@" | xargs) and no apt-get to install them" >&2
        return 1
    }
    ((EUID == 0)) || {
        echo "apt: missing packages $(gpunode_apt_missing "$@" | xargs): installing them without service starts needs root" >&2
        return 1
    }
    _gpunode_locked _gpunode_apt_install_no_start_locked "$@"
}
