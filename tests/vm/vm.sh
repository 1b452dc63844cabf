#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Start, reach and stop the test VM.
#
#   vm.sh start NAME [stock|patched]   boot a VM from the cached image (build-image.sh) with
#                                      Debian's QEMU (stock) or the writable-MRRS build
#                                      (patched, build-qemu.sh); waits until SSH answers
#   vm.sh ssh NAME [COMMAND...]        run a command in the guest as root
#   vm.sh inventory NAME               print an Ansible inventory line for the guest
#   vm.sh stop NAME                    power the VM off and delete its run directory
#                                      (GPUNODE_VM_KEEP=1 keeps disk and logs)
#
# Machine: q35, 4 vCPUs in 2 sockets, 2 NUMA nodes (1 GiB each), ACPI SSDT with C-states and
# P-states (ssdt-cpu-pm.asl), and PCIe endpoints behind root ports: e1000e (8086:10d3, class
# 0200) and nvme (use-intel-id=on: 8086:5845, class 0108) on NUMA node 0, a second nvme behind a pxb-pcie host
# bridge on NUMA node 1. The management NIC is virtio-net with SSH forwarded from
# 127.0.0.1:PORT only. KVM is used only where /dev/kvm is writable and the CPU has vmx/svm;
# everything else runs under TCG.
#
# Rebooting: the VM boots with -kernel/-initrd, so grub never runs in the guest. QEMU runs with
# -no-reboot under a small supervisor (this script, `supervise`). When the guest reboots, QEMU
# exits; the supervisor then plays the bootloader: it reads /boot/grub/grub.cfg from the guest
# disk (written by the guest's own update-grub from /etc/default/grub and grub.d drop-ins),
# takes the kernel, initrd and arguments of its default entry, and starts QEMU again on the same
# SSH port. A reboot is therefore a cold boot with exactly the command line grub would pass.
# Each boot's command line is logged to RUN/boot-N.cmdline. See docs/dev/vm.md.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SSH_WAIT=${GPUNODE_VM_SSH_WAIT:-600}

run_dir() { echo "$GPUNODE_VM_CACHE/runs/$1"; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ssh_opts() {
    local run=$1
    echo "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR" \
        "-o IdentitiesOnly=yes -o ConnectTimeout=10 -o BatchMode=yes" \
        "-i $(cat "$run/image")/id_ed25519 -p $(cat "$run/port")"
}

vm_ssh() {
    local run
    run=$(run_dir "$1")
    shift
    # ssh_opts is a list of words on purpose; the command runs in the guest, as intended.
    # shellcheck disable=SC2046,SC2029
    ssh $(ssh_opts "$run") root@127.0.0.1 "$@"
}

accel_args() {
    if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
        echo "-accel kvm -cpu host"
    else
        # acpi-cpufreq refuses I/O-port P-states on what it takes for an AMD K8 (the default
        # TCG CPU): claim to be Intel. See ssdt-cpu-pm.asl.
        echo "-accel tcg -cpu max,vendor=GenuineIntel"
    fi
}

# Read the default entry of the guest's /boot/grub/grub.cfg from the (powered-off) disk and
# write RUN/next/{vmlinuz,initrd.img,cmdline}. Returns 1 when there is no grub.cfg yet.
read_boot_config() {
    local run=$1 raw=$1/next/disk.raw
    rm -rf "$run/next"
    mkdir -p "$run/next"
    qemu-img convert -O raw "$run/disk.qcow2" "$raw"
    if ! debugfs -R 'cat /boot/grub/grub.cfg' "$raw" >"$run/next/grub.cfg" 2>/dev/null ||
        ! [[ -s $run/next/grub.cfg ]]; then
        rm -f "$raw"
        return 1
    fi
    python3 - "$run/next" <<'EOF'
import pathlib, shlex, sys
# The first menuentry is the default (GRUB_DEFAULT=0): its `linux` and `initrd` lines.
nxt = pathlib.Path(sys.argv[1])
kernel = initrd = args = None
in_entry = False
for line in (nxt / "grub.cfg").read_text().splitlines():
    words = line.strip().split(None, 1)
    if not words:
        continue
    if words[0] == "menuentry":
        in_entry = True
    elif in_entry and words[0] == "linux":
        kernel, _, args = words[1].partition(" ")
    elif in_entry and words[0] == "initrd":
        initrd = words[1].split()[0]
    elif in_entry and words[0] == "}":
        break
if not (kernel and initrd):
    sys.exit("grub.cfg: no linux/initrd line in the first menuentry")
(nxt / "paths").write_text(f"{kernel}\n{initrd}\n")
(nxt / "cmdline").write_text(" ".join(shlex.split(args)) + "\n")
EOF
    local kernel initrd
    { read -r kernel && read -r initrd; } <"$run/next/paths"
    debugfs -R "dump -p $kernel $run/next/vmlinuz" "$raw" 2>/dev/null
    debugfs -R "dump -p $initrd $run/next/initrd.img" "$raw" 2>/dev/null
    rm -f "$raw"
    [[ -s $run/next/vmlinuz && -s $run/next/initrd.img ]] ||
        vm_die "cannot read $kernel / $initrd from the guest disk"
}

# The supervisor: boot, and boot again with the guest's grub configuration after each reboot.
cmd_supervise() {
    local name=$1 run qemu image boot=0 kernel initrd cmdline offset rc
    run=$(run_dir "$name")
    qemu=$(cat "$run/qemu")
    image=$(cat "$run/image")
    while :; do
        boot=$((boot + 1))
        if ((boot == 1)); then
            kernel=$image/vmlinuz initrd=$image/initrd.img
            cmdline=$(cat "$image/first-boot-cmdline")
        elif read_boot_config "$run"; then
            kernel=$run/next/vmlinuz initrd=$run/next/initrd.img
            cmdline=$(cat "$run/next/cmdline")
        else
            vm_log "no /boot/grub/grub.cfg in the guest: booting with the first-boot command line"
            kernel=$image/vmlinuz initrd=$image/initrd.img
            cmdline=$(cat "$image/first-boot-cmdline")
        fi
        echo "$cmdline" >"$run/boot-$boot.cmdline"
        vm_log "boot $boot: $cmdline"
        offset=$(stat -c %s "$run/console.log" 2>/dev/null || echo 0)
        rc=0
        # shellcheck disable=SC2046  # accel_args is a list of words on purpose
        "$qemu" -name "gpunode-vm-$name" -machine q35 $(accel_args) \
            -smp 4,sockets=2,cores=2,threads=1 -m 2G \
            -object memory-backend-ram,id=mem0,size=1G -object memory-backend-ram,id=mem1,size=1G \
            -numa node,nodeid=0,cpus=0-1,memdev=mem0 -numa node,nodeid=1,cpus=2-3,memdev=mem1 \
            -nodefaults -display none -vga none -no-reboot \
            -chardev "file,id=console,path=$run/console.log,append=on" -serial chardev:console \
            -acpitable "file=$run/ssdt-cpu-pm.aml" \
            -kernel "$kernel" -initrd "$initrd" -append "$cmdline" \
            -drive "if=none,id=root,file=$run/disk.qcow2,format=qcow2" \
            -device virtio-blk-pci,drive=root,bus=pcie.0 \
            -netdev "user,id=mgmt,hostfwd=tcp:127.0.0.1:$(cat "$run/port")-:22" \
            -device virtio-net-pci,netdev=mgmt,bus=pcie.0 \
            -netdev user,id=lan,restrict=on \
            -device pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=0 \
            -device e1000e,bus=rp0,netdev=lan,romfile= \
            -device pcie-root-port,id=rp1,bus=pcie.0,chassis=2,slot=1 \
            -device nvme,bus=rp1,serial=gpunode-nvme0,use-intel-id=on \
            -device pxb-pcie,id=pxb1,bus_nr=64,numa_node=1,bus=pcie.0 \
            -device pcie-root-port,id=rp2,bus=pxb1,chassis=3,slot=2 \
            -device nvme,bus=rp2,serial=gpunode-nvme1,use-intel-id=on \
            -pidfile "$run/qemu.pid" >>"$run/qemu.log" 2>&1 || rc=$?
        vm_log "boot $boot: QEMU exited with $rc"
        [[ -e $run/stop ]] && return 0
        if tail -c +"$((offset + 1))" "$run/console.log" | grep -q 'reboot: Restarting system'; then
            continue
        fi
        vm_log "the guest did not reboot (power-off or crash): supervisor ends"
        return 0
    done
}

cmd_start() {
    local name=$1 variant=${2:-stock} run image qemu start
    run=$(run_dir "$name")
    [[ -e $run ]] && vm_die "$run exists: stop that VM first (vm.sh stop $name)"
    image=$("$VM_DIR/build-image.sh")
    vm_require_packages "${GPUNODE_APT_VM_HOST[@]}"
    case $variant in
    stock)
        qemu=$(command -v qemu-system-x86_64)
        ;;
    patched) qemu=$("$VM_DIR/build-qemu.sh") ;;
    *) vm_die "unknown variant '$variant' (stock|patched)" ;;
    esac
    mkdir -p "$run"
    echo "$image" >"$run/image"
    echo "$qemu" >"$run/qemu"
    echo "$variant" >"$run/variant"
    free_port >"$run/port"
    iasl -p "$run/ssdt-cpu-pm" "$VM_DIR/ssdt-cpu-pm.asl" >"$run/iasl.log" 2>&1 ||
        vm_die "iasl failed: $(cat "$run/iasl.log")"
    qemu-img create -q -f qcow2 -b "$image/disk.raw" -F raw "$run/disk.qcow2"
    start=$(date +%s)
    setsid "$0" supervise "$name" >>"$run/supervisor.log" 2>&1 </dev/null {VM_LOG_FD}>&- &
    echo $! >"$run/supervisor.pid"
    vm_log "$name: $variant QEMU ($qemu), SSH on 127.0.0.1:$(cat "$run/port"), run dir $run"
    cmd_wait "$name"
    vm_log "$name: SSH up after $(($(date +%s) - start)) s"
}

cmd_wait() {
    local name=$1 run deadline
    run=$(run_dir "$name")
    deadline=$((SECONDS + SSH_WAIT))
    until vm_ssh "$name" true 2>/dev/null; do
        kill -0 "$(cat "$run/supervisor.pid")" 2>/dev/null ||
            vm_die "$name: the VM stopped before SSH answered; see $run/console.log and $run/qemu.log"
        ((SECONDS < deadline)) || vm_die "$name: no SSH after ${SSH_WAIT}s; see $run/console.log"
        sleep 3
    done
}

cmd_inventory() {
    local run
    run=$(run_dir "$1")
    printf '%s ansible_host=127.0.0.1 ansible_port=%s ansible_user=root ansible_ssh_private_key_file=%s ansible_python_interpreter=/usr/bin/python3 ansible_ssh_common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes"\n' \
        "$1" "$(cat "$run/port")" "$(cat "$run/image")/id_ed25519"
}

cmd_stop() {
    local name=$1 run pid
    run=$(run_dir "$name")
    [[ -d $run ]] || return 0
    touch "$run/stop"
    if [[ -s $run/qemu.pid ]] && pid=$(cat "$run/qemu.pid") && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
    fi
    if [[ -s $run/supervisor.pid ]]; then
        pid=$(cat "$run/supervisor.pid")
        for _ in $(seq 1 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
    fi
    if [[ -n ${GPUNODE_VM_KEEP:-} ]]; then
        vm_log "$name stopped; kept $run"
    else
        rm -rf "$run"
        vm_log "$name stopped"
    fi
}

[[ $# -ge 2 ]] || {
    sed -n '3,11p' "$0" >&2
    exit 2
}
command=$1
shift
case $command in
start) cmd_start "$@" ;;
stop) cmd_stop "$@" ;;
ssh) vm_ssh "$@" ;;
wait) cmd_wait "$@" ;;
inventory) cmd_inventory "$@" ;;
supervise) cmd_supervise "$@" ;;
*) vm_die "unknown command '$command'" ;;
esac
