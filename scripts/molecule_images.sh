#!/usr/bin/env bash
# Build the Debian images of the Molecule scenarios locally (no registry is reachable here) and
# import them into podman:
#   localhost/gpunode-tuning-molecule:<release>        what molecule/base.yml runs
#   localhost/gpunode-tuning-molecule:<release>-<key>  the same image, named by its cache key
# A root filesystem comes from `debootstrap --variant=minbase` (~50 s per release) and is kept
# as <cache>/<release>-<key>.tar, where <key> hashes the release, the package list and the build
# steps. A rerun with the image already in podman takes well under a second; a machine with the
# tarball but a fresh podman store only imports it (~5 s); anything else rebuilds.
# Environment: GPUNODE_IMAGE_CACHE (default /var/cache/gpunode-tuning/images),
#              MOLECULE_RELEASES (default "bookworm trixie"), DEBIAN_MIRROR.
set -euo pipefail

CACHE_DIR=${GPUNODE_IMAGE_CACHE:-/var/cache/gpunode-tuning/images}
read -r -a RELEASES <<<"${MOLECULE_RELEASES:-bookworm trixie}"
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
IMAGE=localhost/gpunode-tuning-molecule
# What the scenarios need inside the container:
#   python3          Ansible's podman connection and the modules;
#   pciutils         the real lspci/setpci, run against the simulated node's sysfs;
#   kmod             the real modinfo/modprobe binaries the kmod module looks up;
#   procps           sysctl, which ansible.posix.sysctl requires even to write the drop-in only;
#   systemd          `systemctl --root` to check the boot unit's enabled state offline;
#   grub2-common     Debian's update-grub/grub-mkconfig and /etc/default/grub, for the
#                    kernel command-line drop-in (grub-common comes with it).
PACKAGES=(python3 pciutils kmod procps systemd grub2-common)

log() { printf 'molecule-images: %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# What decides an image's content: the release, the packages and the build steps. The build
# function's text (as bash prints it: no comments) stands for the script, so editing messages or
# comments elsewhere does not force a rebuild.
cache_key() {
    {
        printf '%s\n' "$1" "${PACKAGES[@]}"
        declare -f build_rootfs_tar
    } | sha256sum | cut -c1-12
}

build_rootfs_tar() {
    local release=$1 tarball=$2 rootfs
    command -v debootstrap >/dev/null || die "debootstrap is missing (make setup installs it)"
    rootfs=$(mktemp -d "$CACHE_DIR/.rootfs-$release.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the path is fixed for this build
    trap "rm -rf '$rootfs' '$tarball.tmp'" EXIT
    log "debootstrap $release (${PACKAGES[*]}) from $MIRROR"
    local packages
    packages=$(
        IFS=,
        echo "${PACKAGES[*]}"
    )
    debootstrap --variant=minbase --include="$packages" \
        --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$release" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 ||
        die "debootstrap $release failed; log: $rootfs.log"
    rm -f "$rootfs.log"
    # Only the package index is worth dropping: the containers never install anything.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    tar --numeric-owner --xattrs -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    trap - EXIT
}

ensure_image() {
    local release=$1 key tarball keyed
    key=$(cache_key "$release")
    tarball=$CACHE_DIR/$release-$key.tar
    keyed=$IMAGE:$release-$key
    if ! podman image exists "$keyed"; then
        if [[ ! -s $tarball ]]; then
            local start=$SECONDS
            build_rootfs_tar "$release" "$tarball"
            log "built $tarball in $((SECONDS - start)) s"
        fi
        log "importing $tarball as $keyed"
        podman import --quiet --change 'CMD ["/bin/sh"]' "$tarball" "$keyed" >/dev/null
    fi
    podman tag "$keyed" "$IMAGE:$release"
    # Older tarballs and images of this release are stale once the key changed.
    find "$CACHE_DIR" -maxdepth 1 -name "$release-*.tar" ! -name "$release-$key.tar" -delete
    local stale
    mapfile -t stale < <(podman images --format '{{.Repository}}:{{.Tag}}' "$IMAGE" |
        grep -E "^$IMAGE:$release-[0-9a-f]+\$" | grep -vx "$keyed")
    if ((${#stale[@]})); then
        podman rmi "${stale[@]}" >/dev/null || log "could not remove stale ${stale[*]} (in use?)"
    fi
    log "$IMAGE:$release is $keyed"
}

command -v podman >/dev/null || die "podman is missing (make setup installs it)"
mkdir -p "$CACHE_DIR"
# One builder at a time per cache (two CI jobs on one machine share it).
exec 9>"$CACHE_DIR/.lock"
flock 9
# The missing root filesystems are built side by side (debootstrap waits on the mirror and on dpkg, one release
# does not fill 2 CPUs: 74 s for both instead of 111 s on a fresh machine), then imported one by one.
builds=()
for release in "${RELEASES[@]}"; do
    key=$(cache_key "$release")
    tarball=$CACHE_DIR/$release-$key.tar
    if ! podman image exists "$IMAGE:$release-$key" && [[ ! -s $tarball ]]; then
        (
            start=$SECONDS
            build_rootfs_tar "$release" "$tarball"
            log "built $tarball in $((SECONDS - start)) s"
        ) &
        builds+=("$!:$release")
    fi
done
for build in "${builds[@]}"; do
    wait "${build%%:*}" || die "building the ${build#*:} root filesystem failed (see above)"
done
for release in "${RELEASES[@]}"; do
    ensure_image "$release"
done
