#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build the "writable MRRS" QEMU variant: Debian's own qemu source package (the version of the
# installed qemu-system-x86, so both variants differ only by the patch), plus
# qemu-pcie-mrrs-writable.patch, x86_64 system emulator only.
#
# Stock QEMU keeps the Max_Read_Request_Size field of every PCIe function's Device Control
# register read-only: `setpci CAP_EXP+08.w=5000:7000` succeeds and the read-back still shows
# the old value. That is the "device ignored the write" case; this build is the success case.
#
# Prints the path of the built qemu-system-x86_64 on stdout. Cached under
# $GPUNODE_VM_CACHE/qemu/<key>, key = hash(patch, this script, source version).
# The binary uses the firmware of the installed qemu-system-data/seabios packages.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PATCH=$VM_DIR/qemu-pcie-mrrs-writable.patch
vm_require_packages "${GPUNODE_APT_QEMU_BUILD[@]}"
version=${GPUNODE_VM_QEMU_SOURCE_VERSION:-$(dpkg-query -W -f='${source:Version}' qemu-system-x86)}
key=$(vm_hash "$PATCH" "${BASH_SOURCE[0]}" "$version")
out=$GPUNODE_VM_CACHE/qemu/$key
if [[ -f $out/ok ]]; then
    echo "$out/qemu-system-x86_64"
    exit 0
fi

work=$out.build
rm -rf "$work" "$out"
mkdir -p "$work/apt/lists/partial" "$work/apt/parts" "$work/src"
# A private source list: `apt-get source` without touching the host's apt configuration.
printf 'deb-src %s %s main\n' "$DEBIAN_MIRROR" "$DEBIAN_SUITE" >"$work/apt/sources.list"
printf 'deb-src http://deb.debian.org/debian-security %s-security main\n' "$DEBIAN_SUITE" \
    >>"$work/apt/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o "Dir::Etc::SourceParts=$work/apt/parts"
    -o "Dir::State::Lists=$work/apt/lists")

vm_log "fetching Debian source qemu=$version"
vm_apt_get "${apt_opts[@]}" update
(cd "$work/src" && vm_apt_get "${apt_opts[@]}" source --download-only "qemu=$version")
dsc=$(ls "$work"/src/qemu_*.dsc)
# Applies Debian's patch series (debian/patches) while unpacking. apt-get has checked the files
# against the signed Release file; dpkg-source only warns that it has no keyring for the .dsc.
dpkg-source -x "$dsc" "$work/src/qemu" >"$work/dpkg-source.log" 2>&1 || {
    cat "$work/dpkg-source.log" >&2
    vm_die "dpkg-source -x $dsc failed"
}
patch -d "$work/src/qemu" -p1 --forward <"$PATCH"

vm_log "configuring and building qemu-system-x86_64 (nice; a few minutes on 2 cores)"
mkdir -p "$work/src/qemu/build"
(
    cd "$work/src/qemu/build"
    nice ../configure --target-list=x86_64-softmmu --without-default-features \
        --enable-tcg --enable-kvm --enable-slirp --disable-docs --disable-werror \
        --disable-install-blobs --firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu \
        --prefix="$out" >configure.log
    nice ninja qemu-system-x86_64 >ninja.log
)
install -D -m 0755 "$work/src/qemu/build/qemu-system-x86_64" "$out/qemu-system-x86_64"
printf 'source %s\npatch %s\n' "$version" "$(sha256sum <"$PATCH" | cut -c1-16)" >"$out/ok"
rm -rf "$work"
echo "$out/qemu-system-x86_64"
