#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The scenarios run as "scenario_$VARIANT", which shellcheck cannot follow: it would report
# every function they call as unreachable.
# shellcheck disable=SC2317
# Real-kernel test of gpunode.tuning: the playbooks, driven from this host with ansible-playbook
# over SSH, against a QEMU guest running Debian's kernel (real sysfs, real PCIe config space,
# real modprobe, real reboots).
#
#   tests/vm/run.sh [stock] [patched]      default: both, stock first
#
# stock   Debian's QEMU: the MRRS field of Device Control is read-only, so every MRRS write is
#         silently ignored. Proves that setpci_mrrs reports each such device as failed and that
#         neither tune.yml nor verify.yml claims success.
# patched QEMU from Debian's source package with the MRRS field writable (build-qemu.sh): the
#         whole flow, verify (drift) -> tune --tags runtime -> verify (applied) -> tune --tags
#         persistent -> verify (kernel_cmdline pending_reboot) -> the guard's timer fires twice and its
#         metrics hold verify's states -> ansible.builtin.reboot -> verify (applied, MRRS and
#         C-states re-applied by the boot unit) -> the guard again -> rollback -> originals back,
#         none of our files left, the guard timer gone.
#
# Output: tests/output/vm/ (GPUNODE_VM_OUTPUT): per variant the playbook logs, the verify
# reports of every step, guest snapshots, console logs, and timings.txt with each step's time.
# Exit status 0 only when every expectation of every requested variant held.
# GPUNODE_VM_ANSIBLE_ARGS: extra arguments for every ansible-playbook run (e.g. -vv).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT=${GPUNODE_VM_OUTPUT:-$REPO_DIR/tests/output/vm}
VENV_BIN=$REPO_DIR/.venv/bin
TIMINGS=$OUT/timings.txt

# Skip (and pass) where this stage cannot run: it needs root (apt, debootstrap) and QEMU.
if ((EUID != 0)); then
    echo "test-vm: skipped: needs root (debootstrap, apt-get); see docs/dev/vm.md"
    exit 0
fi
if ! command -v qemu-system-x86_64 >/dev/null && ! apt-cache show qemu-system-x86 >/dev/null 2>&1; then
    echo "test-vm: skipped: qemu-system-x86 is neither installed nor installable here; see docs/dev/vm.md"
    exit 0
fi
[[ -x $VENV_BIN/ansible-playbook ]] || vm_die "no $VENV_BIN/ansible-playbook: run make setup first"

export ANSIBLE_CONFIG=$REPO_DIR/ansible.cfg
export ANSIBLE_COLLECTIONS_PATH=$REPO_DIR/.collections
export ANSIBLE_PIPELINING=1 ANSIBLE_HOST_KEY_CHECKING=0 ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o ControlPersist=300s"
# Per-task times in every playbook log (the profile_tasks summary at the end).
export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks
export PATH=$VENV_BIN:$PATH

mkdir -p "$OUT"
STEP_NO=0
VARIANT=
VDIR=

# step LABEL CMD...: run CMD, record its time; the result is CMD's exit status.
step() {
    local label=$1 start rc=0
    shift
    STEP_NO=$((STEP_NO + 1))
    vm_log "[$VARIANT] step $STEP_NO: $label"
    start=$(date +%s)
    "$@" || rc=$?
    printf '%-8s %2d %-58s %4d s  rc=%d\n' "$VARIANT" "$STEP_NO" "$label" "$(($(date +%s) - start))" "$rc" |
        tee -a "$TIMINGS" >&2
    return "$rc"
}

fail() {
    vm_log "[$VARIANT] FAILED: $*"
    return 1
}

# An expectation that did not hold, but the scenario can go on and tell more (e.g. rollback
# after a drift found after the reboot). The variant fails at the end.
SOFT_FAILURES=()
soft() {
    SOFT_FAILURES+=("step $STEP_NO")
    return 0
}

gssh() { "$VM_DIR/vm.sh" ssh "vm-$VARIANT" "$@"; }

# playbook NAME EXPECTED_RC ARGS...: run a playbook, log to VDIR/NN-NAME.log, check its rc.
playbook() {
    local name=$1 want=$2 log rc=0
    shift 2
    log=$VDIR/$(printf '%02d' "$STEP_NO")-$name.log
    # shellcheck disable=SC2086  # GPUNODE_VM_ANSIBLE_ARGS: extra words for every playbook run
    (cd "$REPO_DIR" && ansible-playbook -i "$VDIR/inventory" ${GPUNODE_VM_ANSIBLE_ARGS:-} "$@") >"$log" 2>&1 || rc=$?
    grep -A3 '^PLAY RECAP' "$log" | sed 's/^/    /' >&2 || true
    if [[ $want == fail && $rc -eq 0 ]]; then
        fail "$name: expected a failing run, got rc 0 (log: $log)"
    elif [[ $want == ok && $rc -ne 0 ]]; then
        grep -E 'fatal:|FAILED!|failed:|msg' "$log" | tail -15 >&2 || true
        fail "$name: rc $rc (log: $log)"
    fi
}

# verify TAG EXPECTED_RC: verify.yml with its reports in VDIR/reports-TAG.
verify() {
    local tag=$1 want=$2
    playbook "verify-$tag" "$want" playbooks/verify.yml -e "gpunode_tuning_report_dir=$VDIR/reports-$tag"
}

# report TAG: the host's verify report (JSON) of step TAG.
report() { echo "$VDIR/reports-$1/vm-$VARIANT.json"; }

# check_report TAG PYTHON-EXPRESSIONS...: assert expressions over the report `r`, print a summary.
check_report() {
    local tag=$1
    shift
    python3 - "$(report "$tag")" "$@" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
by_id = {s["id"]: s for s in r["settings"]}
def state(prefix):
    return sorted({s["state"] for s in r["settings"] if s["id"].startswith(prefix)})
print("    status=%s counts=%s" % (r["status"], r["counts"]), file=sys.stderr)
for fam, c in r["families"].items():
    print("    %-15s %s" % (fam, {k: v for k, v in c.items() if v}), file=sys.stderr)
kl = r["kernel_log"]
print("    kernel log since %s (%s): %s" % (kl["since"], kl["since_source"],
      {k: v for k, v in kl["counts"].items() if v}), file=sys.stderr)
bad = [e for e in sys.argv[2:] if not eval(e)]
for e in bad:
    print("    EXPECTATION FAILED: %s" % e, file=sys.stderr)
for s in r["settings"]:
    if s["state"] in ("drifted", "unsupported"):
        print("      %s: %s (desired %r, running %r) %s" % (s["id"], s["state"], s["desired"], s["running"], s["reason"]), file=sys.stderr)
if bad:
    for cls, recs in kl.get("samples", {}).items():
        for rec in recs[:5]:
            print("      kmsg %s: %s" % (cls, rec), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

# A ground-truth snapshot of the guest, read with plain tools (not the collection's facts).
snapshot() {
    gssh sh -s >"$VDIR/snapshot-$1.txt" <<'EOF'
for d in /sys/bus/pci/devices/*; do
    read -r v < "$d/vendor"; read -r c < "$d/class"
    case "$v:$c" in 0x8086:0x0200*|0x8086:0x0108*) ;; *) continue ;; esac
    b=${d##*/}
    echo "mrrs $b $(lspci -s "$b" -vvv | sed -n 's/.*MaxReadReq \([0-9]*\) bytes.*/\1/p' | head -1) numa_node=$(cat "$d/numa_node")"
done
for s in /sys/devices/system/cpu/cpu[0-9]*/cpuidle/state*; do
    c=${s%/cpuidle/*}; echo "cstate ${c##*/} $(cat "$s/name") disable=$(cat "$s/disable")"
done
for p in /sys/devices/system/cpu/cpufreq/policy*; do
    echo "cpufreq ${p##*/} $(cat "$p/scaling_driver") $(cat "$p/scaling_governor")"
done
echo "sysctl kernel.numa_balancing=$(cat /proc/sys/kernel/numa_balancing)"
for k in vm.swappiness net.core.rmem_max net.core.wmem_max net.core.somaxconn; do
    echo "sysctl $k=$(cat /proc/sys/$(echo "$k" | tr . /))"
done
echo "thp enabled=$(cat /sys/kernel/mm/transparent_hugepage/enabled)"
echo "thp defrag=$(cat /sys/kernel/mm/transparent_hugepage/defrag)"
echo "module nvidia_peermem loaded=$([ -e /sys/module/nvidia_peermem ] && echo yes || echo no)"
EOF
    sed 's/^/    /' "$VDIR/snapshot-$1.txt" >&2
}

# Files of ours on the guest (everything named gpunode-tuning outside /proc, /sys, /run).
our_files() {
    gssh 'find / -xdev \( -path /proc -o -path /sys -o -path /run \) -prune -o -name "*gpunode-tuning*" -print; grep -l gpunode /etc/default/grub.d/* 2>/dev/null; true'
}

# guard_last_run: when the guard's last run ended (the status file's run.timestamp), 0 before any.
guard_last_run() {
    gssh 'python3 -c "import json; print(json.load(open(\"/var/lib/gpunode-tuning/guard-status.json\"))[\"run\"][\"timestamp\"])" 2>/dev/null || echo 0'
}

# wait_guard_run AFTER: wait (bounded) for a guard run that ended after AFTER; print its time.
wait_guard_run() {
    local after=$1 deadline=$((SECONDS + 240)) last
    while ((SECONDS < deadline)); do
        last=$(guard_last_run)
        if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$last" "$after"; then
            echo "$last"
            return 0
        fi
        sleep 5
    done
    fail "no guard run after $after within 240 s"
}

# check_guard TAG: the timer runs the guard under the guest's systemd (twice: OnUnitActiveSec), and
# the metrics and the status hold the guest's real values: the states verify.yml reported at TAG.
check_guard() {
    local tag=$1 first second
    gssh 'systemctl is-enabled gpunode-tuning-guard.timer && systemctl is-active gpunode-tuning-guard.timer' >&2 ||
        fail "the guard timer is not enabled and active" || return 1
    first=$(wait_guard_run 0) || return 1
    second=$(wait_guard_run "$first") || return 1
    vm_log "[$VARIANT] guard runs ended at $first and $second (the timer fired again)"
    gssh cat /var/lib/prometheus/node-exporter/gpunode-tuning.prom >"$VDIR/guard-$tag.prom" || return 1
    gssh cat /var/lib/gpunode-tuning/guard-status.json >"$VDIR/guard-$tag.json" || return 1
    gssh 'journalctl -o cat -u gpunode-tuning-guard.service' >"$VDIR/guard-$tag.log" 2>&1 || true
    grep -q '^gpunode-tuning-guard: pass in ' "$VDIR/guard-$tag.log" ||
        fail "the guard unit logged no passing run ($VDIR/guard-$tag.log)" || return 1
    python3 - "$VDIR/guard-$tag.json" "$VDIR/guard-$tag.prom" "$(report "$tag")" <<'PY' ||
import json, re, sys
status, prom, report = json.load(open(sys.argv[1])), open(sys.argv[2]).read(), json.load(open(sys.argv[3]))
guard = {s["id"]: s["state"] for s in status["settings"]}
verify = {s["id"]: s["state"] for s in report["settings"]}
assert guard == verify, {k: (guard.get(k), verify.get(k)) for k in set(guard) | set(verify) if guard.get(k) != verify.get(k)}
assert status["verdict"] == report["status"], (status["verdict"], report["status"])
for s in report["settings"]:
    line = 'gpunode_tuning_setting_state{family="%s",setting="%s",state="%s"} 1' % (s["family"], s["name"], s["state"])
    assert line in prom.splitlines(), line
assert re.search(r"^gpunode_tuning_boot_unit_failed 0$", prom, re.M), "the boot unit's state is not reported"
print("    guard: %s, %d settings as verify.yml reported them, boot unit not failed" % (status["verdict"], len(guard)),
      file=sys.stderr)
PY
        fail "the guard's values differ from verify.yml's"
}

start_vm() {
    GPUNODE_VM_KEEP=1 "$VM_DIR/vm.sh" stop "vm-$VARIANT" 2>/dev/null || true
    rm -rf "$GPUNODE_VM_CACHE/runs/vm-$VARIANT"
    "$VM_DIR/vm.sh" start "vm-$VARIANT" "$VARIANT" || return 1
    mkdir -p "$VDIR/inventory"
    ln -sfn "$VM_DIR/inventory/group_vars" "$VDIR/inventory/group_vars"
    { echo "[gpunodes]"; "$VM_DIR/vm.sh" inventory "vm-$VARIANT"; } >"$VDIR/inventory/hosts"
}

stop_vm() {
    local run=$GPUNODE_VM_CACHE/runs/vm-$VARIANT
    cp "$run"/console.log "$run"/boot-*.cmdline "$run"/supervisor.log "$VDIR/" 2>/dev/null || true
    "$VM_DIR/vm.sh" stop "vm-$VARIANT"
}

# What every variant checks first: the guest is the machine this test needs.
check_guest() {
    local out
    "$VENV_BIN/ansible" -i "$VDIR/inventory" gpunodes -m ansible.builtin.ping >"$VDIR/ping.log" 2>&1 ||
        fail "ansible -m ping: $(cat "$VDIR/ping.log")" || return 1
    out=$(gssh 'uname -r; cat /sys/devices/system/cpu/cpuidle/current_driver;
        cat /sys/devices/system/cpu/cpu0/cpuidle/state*/name | tr "\n" " "; echo;
        cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_driver;
        cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors;
        ls -d /sys/devices/system/node/node* | wc -l;
        lspci -nn -d 8086: | grep -E "Ethernet|Non-Volatile"') || return 1
    echo "$out" >"$VDIR/guest.txt"
    sed 's/^/    /' "$VDIR/guest.txt" >&2
    grep -qx acpi_idle <<<"$out" || fail "cpuidle driver is not acpi_idle" || return 1
    grep -q 'POLL C1 C2' <<<"$out" || fail "cpuidle states are not POLL C1 C2" || return 1
    grep -qx acpi-cpufreq <<<"$out" || fail "cpufreq driver is not acpi-cpufreq" || return 1
    [[ $(grep -c 'Ethernet\|Non-Volatile' <<<"$out") -eq 3 ]] || fail "expected 3 selected PCIe endpoints" || return 1
    # The stand-in for nvidia_peermem fails exactly like the real one on a node without MOFED.
    out=$(gssh 'modprobe nvidia_peermem 2>&1; echo "rc=$?"') || true
    echo "    $out" >&2
    grep -q "could not insert 'nvidia_peermem': Invalid argument" <<<"$out" ||
        fail "modprobe nvidia_peermem did not fail with Invalid argument" || return 1
}

scenario_stock() {
    local bdf before after
    step "boot VM, wait for SSH (stock QEMU)" start_vm || return 1
    step "ansible ping, guest devices, cpuidle/cpufreq, modprobe" check_guest || return 1
    step "snapshot (original values)" snapshot original || return 1
    # Raw config space: the write "succeeds" and the device keeps its value.
    bdf=$(awk '$1 == "mrrs" {print $2; exit}' "$VDIR/snapshot-original.txt")
    before=$(gssh setpci -s "$bdf" CAP_EXP+08.w)
    gssh setpci -s "$bdf" CAP_EXP+08.w=5000:7000 || fail "setpci write exited non-zero" || return 1
    after=$(gssh setpci -s "$bdf" CAP_EXP+08.w)
    vm_log "[stock] setpci $bdf DevCtl before 0x$before, after writing MRRS 4096: 0x$after"
    [[ $before == "$after" ]] || fail "stock QEMU took the MRRS write ($before -> $after)" || return 1
    step "verify.yml: drift expected" verify drift fail || return 1
    check_report drift 'r["status"] == "fail"' 'state("pcie_mrrs.") == ["drifted"]' || return 1
    step "tune.yml --tags runtime: must fail at setpci_mrrs" \
        playbook tune-runtime fail playbooks/tune.yml --tags runtime || return 1
    python3 - "$VDIR/$(printf '%02d' "$STEP_NO")-tune-runtime.log" "$VDIR/snapshot-original.txt" <<'EOF' ||
import json, re, sys
# One failure, at the end of the flow: the runtime flow ran every family in one module run (the
# others were applied), then the host failed naming only pcie_mrrs, every selected device "did not take".
log, snapshot = open(sys.argv[1]).read(), open(sys.argv[2]).read()
fatal = re.findall(r"^fatal: \[vm-stock\]: FAILED! => (\{.*\})$", log, re.M)
assert len(fatal) == 1, "expected the end-of-flow failure only, found %d failures" % len(fatal)
task = log[:log.index(fatal[0])].rsplit("TASK [", 1)[1].split("]", 1)[0]
assert "knob families that failed" in task, "the failing task is %r" % task
summary = json.loads(fatal[0])["msg"]
assert "pcie_mrrs:" in summary and not re.search(r"\b(cpuidle|cpufreq|tunables|kmod|pcie_acs):", summary), summary
bdfs = re.findall(r"^mrrs (\S+) ", snapshot, re.M)
for bdf in bdfs:
    assert re.search(re.escape(bdf) + r": wrote MRRS 4096 but Device Control reads back [^;]*did not take", summary), bdf
    print("    %s: did not take" % bdf, file=sys.stderr)
assert "0 other device(s) were set" in summary, summary
EOF
        fail "setpci_mrrs did not report every ignored write as failed" || return 1
    step "verify.yml after the failed run: still drifted" verify after-failed-runtime fail || return 1
    check_report after-failed-runtime 'r["status"] == "fail"' 'state("pcie_mrrs.") == ["drifted"]' || return 1
    step "snapshot: MRRS unchanged (lspci)" snapshot after-failed-runtime || return 1
    diff <(grep '^mrrs' "$VDIR/snapshot-original.txt") <(grep '^mrrs' "$VDIR/snapshot-after-failed-runtime.txt") >&2 ||
        fail "MRRS changed on stock QEMU" || return 1
}

scenario_patched() {
    step "boot VM, wait for SSH (patched QEMU)" start_vm || return 1
    step "ansible ping, guest devices, cpuidle/cpufreq, modprobe" check_guest || return 1
    step "snapshot (original values)" snapshot original || return 1
    step "verify.yml: drift expected" verify drift fail || return 1
    check_report drift 'r["status"] == "fail"' 'state("pcie_mrrs.") == ["drifted"]' \
        'state("kernel_cmdline.") == ["drifted"]' || return 1

    step "tune.yml --tags runtime" playbook tune-runtime ok playbooks/tune.yml --tags runtime || return 1
    grep -q "nvidia_peermem.*Invalid argument" "$VDIR/$(printf '%02d' "$STEP_NO")-tune-runtime.log" ||
        fail "the runtime report does not show nvidia_peermem: Invalid argument" || return 1
    step "snapshot after runtime (lspci MaxReadReq)" snapshot runtime || return 1
    [[ $(grep -c '^mrrs .* 4096 ' "$VDIR/snapshot-runtime.txt") -eq 3 ]] ||
        fail "lspci -vvv does not show MaxReadReq 4096 on the 3 devices" || return 1
    # kmod_optional itself, ad hoc: the failure is classified, not just passed through.
    "$VENV_BIN/ansible" -i "$VDIR/inventory" gpunodes -m gpunode.tuning.kmod_optional \
        -a name=nvidia_peermem >"$VDIR/kmod-optional.log" 2>&1 || true
    grep -q '"reason_class": "invalid_argument"' "$VDIR/kmod-optional.log" ||
        fail "kmod_optional did not classify nvidia_peermem as invalid_argument ($VDIR/kmod-optional.log)" || return 1
    # Every runtime knob applied, and nothing new in the kernel log since the change but known
    # noise. The kernel arguments are persistent-only: verify reports them as not configured yet,
    # and that is its only complaint.
    step "verify.yml after runtime: applied, no new kernel errors" verify runtime fail || return 1
    check_report runtime \
        'all(s["state"] in ("applied", "not_applicable") for s in r["settings"] if not s["id"].startswith("kernel_cmdline."))' \
        'by_id["kmod.nvidia_peermem"]["state"] == "not_applicable"' \
        'state("kernel_cmdline.") == ["drifted"]' \
        'len(r["failures"]) == 1 and r["failures"][0].startswith("2 drifted: kernel_cmdline ")' \
        'r["kernel_log"]["since_source"] == "journal"' \
        'all(n == 0 for c, n in r["kernel_log"]["counts"].items() if c != "noise")' || return 1

    # node_exporter's textfile directory, as its package creates it (the guard never does).
    gssh mkdir -p /var/lib/prometheus/node-exporter || return 1
    step "tune.yml --tags persistent" playbook tune-persistent ok playbooks/tune.yml --tags persistent || return 1
    step "verify.yml after persistent: kernel_cmdline pending_reboot" verify persistent ok || return 1
    check_report persistent 'r["status"] == "pass"' 'state("kernel_cmdline.") == ["pending_reboot"]' \
        'r["reboot_required"]' || return 1
    step "guard: the timer fires under systemd, the metrics hold the guest's values" check_guard persistent || soft

    # The collection's reboot sequence (docs/rebooting.md) on a real kernel: the persistent flow again (its files
    # unchanged) leaves the kernel arguments pending, so the host is rebooted (no scheduler: drain none), waited
    # for with a new boot id and the boot unit settled, verified with the full gate and returned.
    step "reboot through the sequence (tune.yml --tags persistent, drain none)" playbook reboot ok \
        playbooks/tune.yml --tags persistent -e gpunode_tuning_reboot_ok=true -e gpunode_tuning_drain=none \
        -e "gpunode_tuning_report_dir=$VDIR/reports-reboot-sequence" || return 1
    grep -q "rebooted without a drain, passed its gate and is back in service" \
        "$VDIR/$(printf '%02d' "$STEP_NO")-reboot.log" ||
        fail "the reboot sequence did not report the host back in service after its gate" || return 1
    gssh cat /proc/cmdline | sed 's/^/    guest \/proc\/cmdline: /' >&2
    gssh 'grep -q "transparent_hugepage=madvise" /proc/cmdline && grep -q "numa_balancing=disable" /proc/cmdline' ||
        fail "the kernel arguments did not reach the next boot" || return 1
    step "snapshot after reboot" snapshot reboot || soft
    [[ $(grep -c '^mrrs .* 4096 ' "$VDIR/snapshot-reboot.txt") -eq 3 ]] ||
        fail "MRRS not re-applied at boot" || soft
    gssh systemctl is-active gpunode-tuning-boot.service >&2 || fail "boot unit not active" || soft
    # The unit ran the collection's Python runner (module_utils/flows/boot.py) with the guest's python3:
    # one journald line per family, none failed, and the C-states are back as the runtime set them.
    gssh 'journalctl -b -o cat -u gpunode-tuning-boot.service' >"$VDIR/boot-unit.log" 2>&1 || true
    sed 's/^/    boot unit: /' "$VDIR/boot-unit.log" >&2
    for family in pcie_mrrs cpuidle cpufreq thp; do
        grep -q "^gpunode-tuning-boot: $family: " "$VDIR/boot-unit.log" ||
            fail "the boot unit logged no line for $family" || soft
    done
    ! grep -q '^gpunode-tuning-boot: .*FAILED' "$VDIR/boot-unit.log" || fail "a family failed at boot" || soft
    gssh 'grep -q "^ExecStart=/usr/bin/python3 -I -B " /etc/systemd/system/gpunode-tuning-boot.service' ||
        fail "the boot unit does not run python3" || soft
    diff <(grep '^cstate' "$VDIR/snapshot-runtime.txt") <(grep '^cstate' "$VDIR/snapshot-reboot.txt") >&2 ||
        fail "C-states not re-applied at boot" || soft
    step "verify.yml after reboot: applied" verify reboot ok || soft
    check_report reboot 'r["status"] == "pass"' \
        'all(s["state"] in ("applied", "not_applicable") for s in r["settings"])' \
        'state("kernel_cmdline.") == ["applied"]' || soft
    step "guard after the reboot: runs from the timer, as verify.yml" check_guard reboot || soft

    step "rollback.yml" playbook rollback ok playbooks/rollback.yml || return 1
    step "snapshot after rollback" snapshot rollback || return 1
    # numa_balancing=disable stays on the running kernel's command line until the next boot;
    # the sysctl itself is back to its original value (the journal restored it).
    diff "$VDIR/snapshot-original.txt" "$VDIR/snapshot-rollback.txt" >&2 ||
        fail "rollback did not restore the original values" || soft
    step "verify.yml after rollback: original values (drift)" verify rollback fail || return 1
    check_report rollback 'r["status"] == "fail"' 'state("pcie_mrrs.") == ["drifted"]' || soft
    if gssh systemctl is-enabled gpunode-tuning-guard.timer >/dev/null 2>&1; then
        fail "the guard timer is still enabled after rollback" || soft
    fi
    our_files >"$VDIR/files-after-rollback.txt" || return 1
    if [[ -s $VDIR/files-after-rollback.txt ]]; then
        sed 's/^/    left behind: /' "$VDIR/files-after-rollback.txt" >&2
        fail "files of ours remain after rollback" || soft
    fi
    if gssh 'grep -q "transparent_hugepage=madvise\|numa_balancing=disable" /boot/grub/grub.cfg'; then
        fail "grub.cfg still has our arguments" || soft
    fi
    ((${#SOFT_FAILURES[@]} == 0)) || fail "expectations failed in: ${SOFT_FAILURES[*]}"
}

overall=0
variants=("$@")
((${#variants[@]})) || variants=(stock patched)
: >"$TIMINGS"
VARIANT=build
total_start=$(date +%s)
# The two builds are independent: on a cold cache they run side by side (QEMU in the background).
qemu_pid=
if [[ " ${variants[*]} " == *" patched "* ]]; then
    STEP_NO=0
    step "QEMU with writable MRRS (build-qemu.sh, cached)" "$VM_DIR/build-qemu.sh" >/dev/null &
    qemu_pid=$!
fi
STEP_NO=1
step "guest image (build-image.sh, cached)" "$VM_DIR/build-image.sh" >/dev/null || exit 1
if [[ -n $qemu_pid ]]; then
    wait "$qemu_pid" || exit 1
fi
for VARIANT in "${variants[@]}"; do
    VDIR=$OUT/$VARIANT
    rm -rf "$VDIR"
    mkdir -p "$VDIR"
    STEP_NO=0
    SOFT_FAILURES=()
    export ANSIBLE_LOG_PATH=$VDIR/ansible.log  # timestamped, every playbook and ad-hoc run
    start=$(date +%s)
    rc=0
    "scenario_$VARIANT" || rc=$?
    stop_vm || true
    printf '%-8s    %-58s %4d s  %s\n' "$VARIANT" "total" "$(($(date +%s) - start))" \
        "$([[ $rc -eq 0 ]] && echo PASSED || echo FAILED)" | tee -a "$TIMINGS" >&2
    ((rc == 0)) || overall=1
done
printf '%-8s    %-58s %4d s\n' all total "$(($(date +%s) - total_start))" | tee -a "$TIMINGS" >&2
exit "$overall"
