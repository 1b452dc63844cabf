#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Build the guest image for the real-kernel test: Debian (debootstrap) with the Debian kernel
# and initrd, systemd, udev, kmod, pciutils, python3, openssh-server and grub's configuration
# tools, plus the test stand-in for nvidia_peermem (nvidia_peermem/, built here against the
# guest kernel's linux-headers package).
#
# Prints the image directory on stdout. It holds:
#   disk.raw        ext4 root file system (no partition table; the guest sees it as /dev/vda)
#   vmlinuz, initrd.img, kernel-version   the guest's kernel, for the first boot
#   id_ed25519      the SSH key root in the guest accepts
# Cached under $GPUNODE_VM_CACHE/image/<key>, key = hash of every input below (package list,
# suite, mirror, this script, the module source); GPUNODE_VM_REBUILD=1 rebuilds anyway.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

GUEST_PACKAGES=linux-image-amd64,initramfs-tools,zstd,systemd-sysv,udev,dbus,kmod,procps,iproute2,pciutils,python3,openssh-server,grub2-common
DISK_SIZE=${GPUNODE_VM_DISK_SIZE:-4G}
MODULE_SRC=$VM_DIR/nvidia_peermem

vm_require_packages "${GPUNODE_APT_VM_HOST[@]}"
key=$(vm_hash "${BASH_SOURCE[0]}" "$MODULE_SRC/nvidia_peermem.c" "$MODULE_SRC/Kbuild" \
    "$GUEST_PACKAGES" "$DEBIAN_SUITE" "$DEBIAN_MIRROR" "$DISK_SIZE")
out=$GPUNODE_VM_CACHE/image/$key
# One build of a key at a time: two suites on one machine would remove each other's files (a second build's
# `rm -rf` once left an image of only `ok`). A cached image counts only when it holds every file it must.
mkdir -p "$GPUNODE_VM_CACHE/image"
exec 9>"$out.lock"
flock -w 1800 9 || vm_die "waited 1800 s for another build of $out"
image_complete() {
    local name
    for name in ok disk.raw vmlinuz initrd.img kernel-version id_ed25519 first-boot-cmdline; do
        [[ -f $out/$name ]] || return 1
    done
}
if image_complete && [[ -z ${GPUNODE_VM_REBUILD:-} ]]; then
    echo "$out"
    exit 0
fi

work=$out.build
rm -rf "$work" "$out"
mkdir -p "$work"
root=$work/root

vm_log "debootstrap $DEBIAN_SUITE into $root"
vm_timed "debootstrap" nice debootstrap --variant=minbase --include="$GUEST_PACKAGES" \
    "$DEBIAN_SUITE" "$root" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    vm_die "debootstrap failed (log: $work/debootstrap.log)"
}

kver=$(basename "$(ls -d "$root"/lib/modules/*)")
[[ -e $root/boot/vmlinuz-$kver && -e $root/boot/initrd.img-$kver ]] ||
    vm_die "the guest has no kernel/initrd for $kver in /boot"

# --- The test module, built against exactly the guest's kernel.
vm_require_packages "linux-headers-$kver"
mkdir -p "$work/module"
cp "$MODULE_SRC/nvidia_peermem.c" "$MODULE_SRC/Kbuild" "$work/module/"
vm_timed "build nvidia_peermem stand-in" \
    make -s -C "/usr/src/linux-headers-$kver" M="$work/module" modules >"$work/module.log" 2>&1 || {
    cat "$work/module.log" >&2
    vm_die "building the test module failed"
}
install -D -m 0644 "$work/module/nvidia_peermem.ko" "$root/lib/modules/$kver/updates/nvidia_peermem.ko"
depmod -b "$root" "$kver"

# --- Guest configuration.
ssh-keygen -q -t ed25519 -N '' -C gpunode-vm-test -f "$work/id_ed25519"
install -d -m 0700 "$root/root/.ssh"
install -m 0600 "$work/id_ed25519.pub" "$root/root/.ssh/authorized_keys"

echo gpunode-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 gpunode-vm\n' >"$root/etc/hosts"
echo 'LABEL=gpunode-root / ext4 defaults,errors=remount-ro 0 1' >"$root/etc/fstab"
echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"

# Management network: DHCP from QEMU's user network on the virtio NIC only; the e1000e is a
# tuning target, not a network.
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nDriver=virtio_net\n\n[Network]\nDHCP=ipv4\n' >"$root/etc/systemd/network/10-mgmt.network"
ln -sf /lib/systemd/system/systemd-networkd.service \
    "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
# Nothing in the guest needs to wait for the network, and under TCG every second counts.
for unit in systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_reap.service e2scrub_all.timer fstrim.timer; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
done

# Boot configuration as on any Debian machine with grub: /etc/default/grub (+ grub.d drop-ins)
# -> update-grub -> /boot/grub/grub.cfg. The VM is started with -kernel/-initrd, so vm.sh
# reads the kernel, initrd and arguments of the default entry from grub.cfg before each boot
# (see docs/dev/vm.md). FIRST_BOOT_CMDLINE is what grub.cfg will say after the first update-grub.
cat >"$root/etc/default/grub" <<'EOF'
# gpunode.tuning VM test guest. The VM boots with -kernel; tests/vm/vm.sh reads the default
# entry of /boot/grub/grub.cfg (written by update-grub) before every boot, like a bootloader.
GRUB_DEFAULT=0
GRUB_TIMEOUT=0
GRUB_DISTRIBUTOR=Debian
GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0"
GRUB_CMDLINE_LINUX=""
GRUB_DISABLE_LINUX_UUID=true
GRUB_DISABLE_RECOVERY=true
GRUB_DISABLE_OS_PROBER=true
GRUB_TERMINAL=console
EOF
mkdir -p "$root/boot/grub" "$root/etc/default/grub.d"
# On the first boot, write grub.cfg from that configuration (update-grub needs the real root
# device, which the build chroot does not have).
cat >"$root/etc/systemd/system/gpunode-vm-first-boot.service" <<'EOF'
[Unit]
Description=gpunode VM test: write /boot/grub/grub.cfg on the first boot
ConditionPathExists=!/boot/grub/grub.cfg

[Service]
Type=oneshot
ExecStart=/usr/sbin/update-grub

[Install]
WantedBy=multi-user.target
EOF
ln -sf ../gpunode-vm-first-boot.service \
    "$root/etc/systemd/system/multi-user.target.wants/gpunode-vm-first-boot.service"
echo "root=/dev/vda ro console=ttyS0" >"$work/first-boot-cmdline"

rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
cp "$root/boot/vmlinuz-$kver" "$work/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$work/initrd.img"
echo "$kver" >"$work/kernel-version"

vm_timed "mkfs.ext4 -d" mkfs.ext4 -q -F -L gpunode-root -d "$root" "$work/disk.raw" "$DISK_SIZE"
rm -rf "$root"
{
    echo "suite $DEBIAN_SUITE"
    echo "kernel $kver"
    echo "built $(date -u +%FT%TZ)"
} >"$work/ok"
mv "$work" "$out"
echo "$out"
