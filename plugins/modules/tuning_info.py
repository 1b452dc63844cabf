# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_info
short_description: Read the tuning state of a GPU node and, given a desired state, verify it
version_added: 1.0.0
description:
  - Reads, in one call and without writing anything, what the verification of a tuned GPU node needs,
    namely the kernel release and command line, kernel lockdown, CPU identity and NUMA layout, C-states, cpufreq,
    NUMA balancing and transparent hugepages, selected sysctls, the PCI Express settings of selected devices,
    kernel modules, the NVIDIA persistence daemon, the OS release and the classified kernel log.
  - Every value is read directly from sysfs, procfs and C(/dev/kmsg) below O(root); without O(desired) no command
    runs.
  - With O(desired) the module also verifies the node against that desired state, in the same call and still
    read-only (also outside check mode). It reads the tuning journal and the boot id (from when the kernel log
    counts), the kernel arguments configured for the next boot (this collection's GRUB drop-in, or
    C(grubby --info=DEFAULT) on a live node that uses grubby), the sysctl drop-in, the boot unit link and the
    C(modules-load.d) files of this collection, and on a live node the GPUs through C(nvidia-smi); it returns
    RV(verification), every setting's state (applied, pending_reboot, drifted, not_applicable, unsupported) with
    the reason, the counts, the verdict and its JUnit classification. The O(verify) option gives the paths and
    verdict switches.
  - It returns no C(ansible_facts); its data is RV(tuning_facts).
  - Per-CPU values are aggregated (counts, cpulists, most common value and the number of CPUs that differ),
    so the result does not grow with the number of CPUs unless O(detail=true).
  - The kernel log is read without blocking from C(/dev/kmsg), filtered by level (O(kmsg_levels)) and time
    (O(kmsg_since)), and classified into C(aer), C(xid), C(fallen_off_bus), C(lockdown), C(module_failure),
    C(noise) and C(other). When C(/dev/kmsg) cannot be read (a container, C(kernel.dmesg_restrict) without
    C(CAP_SYSLOG)) the section says so with RV(tuning_facts.kernel_log.available=false) and a reason instead of
    failing.
  - The verification runs C(grubby) and C(nvidia-smi) only on the running system (O(root=/)); a simulated node's
    GPU section is not applicable and its grubby configuration unknown.
author:
  - gpunode.tuning contributors (@gpunode)
requirements:
  - C(netaddr) on the managed node, only when an O(kmsg_ignore) rule has a O(kmsg_ignore[].cidr).
options:
  pci_selector:
    description:
      - Which PCI functions to report in RV(tuning_facts.pci.devices). Every given key must match.
      - Without it (or with no key set) the NVIDIA and AMD GPUs are selected, vendor V(10de) or V(1002) with class
        V(0300), V(0302), V(0380) or V(1200), not their HDMI-audio functions or NVSwitch bridges.
    type: dict
    suboptions:
      vendor:
        description: Vendor ids in hex, for example V([10de]) or V([0x15b3]); a device of any of them matches.
        type: list
        elements: str
      device:
        description: Device id in hex, for example V(2bb5).
        type: str
      class_prefixes:
        description:
          - Class code prefixes of 2, 4 or 6 hex digits (base class, with subclass, with programming interface),
            for example V(0302). Quote them in YAML.
        type: list
        elements: str
      bdfs:
        description:
          - PCI addresses C(DDDD:BB:DD.F) or C(BB:DD.F). Addresses that the node does not have are listed in
            RV(tuning_facts.pci.missing_bdfs).
        type: list
        elements: str
  sysctls:
    description:
      - Dotted sysctl keys to report in RV(tuning_facts.tunables.sysctl), for example V(vm.swappiness).
      - A C(/) in a key stands for a dot inside one name, as with C(sysctl) (V(net.ipv4.conf.eth0/100.rp_filter)).
    type: list
    elements: str
    default: []
  kmsg_since:
    description:
      - Only kernel log records logged at or after this time, in seconds since boot as the kernel log counts
        them. Take it before a change from RV(tuning_facts.kernel_log.last_time) (plus V(0.000001)) or
        RV(tuning_facts.kernel.uptime) of an earlier call to see only what the change caused.
    type: float
    default: 0
  kmsg_levels:
    description:
      - Kernel log levels to report.
      - V(err) selects levels 0 to 3 (emerg, alert, crit and err), so that the rare more severe records are never
        missed; every other name selects exactly its own level.
    type: list
    elements: str
    choices: [emerg, alert, crit, err, warn, notice, info, debug]
    default: [err, warn]
  kmsg_ignore:
    description:
      - Known-noise rules. A selected kernel log record that matches a rule is counted as C(noise), not as trouble.
        Rules are checked before the trouble classes.
      - "When not set, one built-in rule ignores C(vxlan: non-ECT from <address> with TOS=...) from any address.
        A given list replaces it; V([]) ignores nothing."
    type: list
    elements: dict
    suboptions:
      pattern:
        description: Python regular expression searched in the message.
        type: str
        required: true
      cidr:
        description:
          - Network in CIDR notation, IPv4 or IPv6 (V(10.224.0.0/16)). With it the rule matches only when the
            address in the message is inside the network. The address is the named group C(address) of
            O(kmsg_ignore[].pattern) when it has one, otherwise the first IP address in the message.
        type: str
  modules:
    description:
      - Kernel module names to report in RV(tuning_facts.kmod.by_name), with their parameters.
        C(-) and C(_) are equivalent.
    type: list
    elements: str
    default: []
  detail:
    description:
      - Add per-CPU entries (C(per_cpu)) to the cpuidle states and to cpufreq. Off by default because they grow
        with the number of CPUs.
    type: bool
    default: false
  desired:
    description:
      - The desired state to verify the node against; without it the module only reads.
      - "Keys, each optional (absent or null: not part of the desired state): C(pcie_mrrs) (C({mrrs})),
        C(cpuidle) (C({disable, max_latency_us, cpus})), C(cpufreq) (C({driver, amd_pstate_mode, intel_pstate_status,
        governor, epp, boost})), C(numa_balancing) (int), C(thp) (C({enabled, defrag})), C(sysctl) (key -> value),
        C(kmod) (C({modules: [{name, params, required, state}]})), C(cmdline) (list of kernel arguments)."
      - The kernel arguments a desired cpufreq driver needs are worked out from C(cpufreq.driver) as
        M(gpunode.tuning.cpu_freq) plans them; C(cmdline) lists only the other arguments.
      - With it O(kmsg_since) is not used; see O(verify.kmsg_since).
    type: dict
  verify:
    description:
      - Where the files of this collection are on the node and how the verdict is reached; used with O(desired).
      - Paths are on the node, below O(root).
    type: dict
    suboptions:
      bootloader:
        description:
          - How the kernel arguments for the next boot are configured. V(auto) decides from C(/etc/os-release)
            (C(ID) and C(ID_LIKE)) as M(gpunode.tuning.kernel_cmdline) does, V(grub) when that does not tell.
        type: str
        choices: [auto, grub, grubby]
        default: auto
      cmdline_dropin:
        description: The GRUB drop-in that holds this collection's kernel arguments.
        type: str
        default: /etc/default/grub.d/60-gpunode-tuning.cfg
      sysctl_file:
        description: The sysctl drop-in of this collection; its values are reported as persisted.
        type: str
        default: /etc/sysctl.d/90-gpunode-tuning.conf
      journal:
        description:
          - The tuning journal. Its C(last_applied) marker, when written in the current boot (C(boot_id)), is
            from when the kernel log counts; a missing journal counts from boot.
        type: str
        default: /var/lib/gpunode-tuning/journal.json
      kmsg_since:
        description: Count the kernel log from this many seconds after boot instead (the journal is not read).
        type: float
      boot_unit_link:
        description:
          - The link that enables the boot unit; when it exists, the runtime settings it re-applies are persisted.
        type: str
        default: /etc/systemd/system/multi-user.target.wants/gpunode-tuning-boot.service
      modules_load_dir:
        description: Where this collection's C(modules-load.d) files are.
        type: str
        default: /etc/modules-load.d
      file_prefix:
        description: The name prefix of this collection's files in O(verify.modules_load_dir).
        type: str
        default: gpunode-tuning-
      gpu:
        description: Probe the GPUs with C(nvidia-smi) (on a live node where it is installed).
        type: bool
        default: true
      fail_on_pending:
        description: Settings pending a reboot fail the verification too.
        type: bool
        default: false
      fail_classes:
        description:
          - Kernel-log classes whose new records fail the verification.
          - V(xid) is not among the defaults because the C(gpu_health) family judges Xids itself (serious codes fail,
            the others are reported).
        type: list
        elements: str
        choices: [aer, xid, fallen_off_bus, lockdown, module_failure, noise, other]
        default: [aer, fallen_off_bus]
      gate:
        description:
          - The verdict of RV(verification.gate). V(full) is the host's own; V(runtime) judges what runtime tuning can
            apply (settings only the persistent flow and a reboot bring do not fail it).
        type: str
        choices: [full, runtime]
        default: full
      host:
        description: The host name the result carries (reports, JUnit class names).
        type: str
      verified_at:
        description: The time the result carries, for example V(2026-01-31T12:00:00Z).
        type: str
extends_documentation_fragment:
  - gpunode.tuning.node
  - gpunode.tuning.node.command_timeouts
  - gpunode.tuning.node.attributes_read_only
notes:
  - The module fails, naming the root, when O(root) is empty, does not exist, is not a directory or has no
    C(sys/), and when no CPU can be read below it, so that a verification never passes a node it could not read.
  - PCI values come from each device's C(config) file in sysfs; reading more than its first 64 bytes needs root.
    Without it C(mps), C(mrrs) and the link values are null and C(error) says why.
  - GPUs lower their link speed when idle, so C(link_speed) below C(link_speed_capable) is expected on an idle GPU.
seealso:
  - module: gpunode.tuning.cpu_freq
  - module: gpunode.tuning.kernel_cmdline
  - module: gpunode.tuning.setpci_mrrs
  - module: gpunode.tuning.cpu_cstate
"""

EXAMPLES = r"""
- name: Gather tuning facts
  gpunode.tuning.tuning_info:
    sysctls: [kernel.numa_balancing, vm.swappiness, net.core.somaxconn]
    modules: [nvidia, nvidia_peermem]
  register: facts

- name: Assert that the GPUs read requests of 4096 bytes
  ansible.builtin.assert:
    that: facts.tuning_facts.pci.devices | map(attribute='mrrs') | unique == [4096]

- name: Gather the kernel log since a change, ignoring VXLAN noise from the overlay network only
  gpunode.tuning.tuning_info:
    kmsg_since: "{{ change_uptime }}"
    kmsg_levels: [err, warn]
    kmsg_ignore:
      - pattern: '^vxlan: non-ECT from'
        cidr: 10.224.0.0/16
  register: after

- name: Fail on new kernel trouble
  ansible.builtin.assert:
    that: after.tuning_facts.kernel_log.trouble == 0
    fail_msg: "{{ after.tuning_facts.kernel_log.records }}"

- name: Verify the node against a desired state, one call
  gpunode.tuning.tuning_info:
    sysctls: [vm.swappiness]
    desired:
      pcie_mrrs: {mrrs: 4096}
      cpufreq: {driver: native, amd_pstate_mode: active, governor: performance}
      sysctl: {vm.swappiness: 10}
    verify:
      host: "{{ inventory_hostname }}"
  register: info

- name: Fail when a setting drifted
  ansible.builtin.assert:
    that: info.verification.ok
    fail_msg: "{{ info.verification.failures | join('; ') }}"

- name: Gather facts of a simulated node
  gpunode.tuning.tuning_info:
    root: /tmp/simnode
    pci_selector:
      vendor: "15b3"
"""

RETURN = r"""
tuning_facts:
  description:
    - The facts, one section per concern. Keys are always present; values are null when unknown.
    - The node's own sections (C(os), C(kernel), C(cpu), C(pci), C(kernel_log)) and one section per knob family
      that reads facts, under the family's name (its C(read)).
  returned: always
  type: dict
  contains:
    os:
      description: The OS release, from C(/etc/os-release).
      returned: always
      type: dict
      contains:
        id:
          description: C(ID).
          type: str
          returned: always
          sample: debian
        version_id:
          description: C(VERSION_ID).
          type: str
          returned: always
          sample: "12"
        pretty_name:
          description: C(PRETTY_NAME).
          type: str
          returned: always
          sample: Debian GNU/Linux 12 (bookworm)
    kernel:
      description: The running kernel.
      returned: always
      type: dict
      contains:
        release:
          description: Kernel release (C(uname -r)).
          type: str
          returned: always
          sample: 6.1.0-28-amd64
        version:
          description: Content of C(/proc/version).
          type: str
          returned: always
          sample: Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) ...
        uptime:
          description:
            - Seconds since boot, the first field of C(/proc/uptime); null when absent. It is close to the clock
              of the kernel log timestamps (which stops during suspend).
          type: float
          returned: always
          sample: 5321.4
        cmdline:
          description: The running kernel command line, C(/proc/cmdline).
          type: str
          returned: always
          sample: BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=3f1c ro quiet
        cmdline_args:
          description: The command line split into arguments.
          type: list
          elements: str
          returned: always
          sample: [BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64, root=UUID=3f1c, ro, quiet]
        lockdown:
          description:
            - Kernel lockdown mode, V(none), V(integrity) or V(confidentiality); null when the kernel has no
              lockdown support. In V(integrity) and V(confidentiality) PCI config-space writes are refused.
          type: str
          returned: always
          sample: none
    cpu:
      description: CPU identity, from C(/proc/cpuinfo) and the CPU topology in sysfs, and NUMA layout.
      returned: always
      type: dict
      contains:
        vendor:
          description:
            - C(vendor_id) of the first CPU; on arm64, which has none, V(arm64) with the C(CPU implementer),
              for example V(arm64 (CPU implementer 0x41)). Null when cpuinfo has neither.
            - The same value M(gpunode.tuning.cpu_freq) decides the driver by.
          type: str
          returned: always
          sample: AuthenticAMD
        model:
          description: C(model name) of the first CPU.
          type: str
          returned: always
          sample: AMD EPYC 9354 32-Core Processor
        family:
          description: C(cpu family), decimal.
          type: int
          returned: always
          sample: 25
        sockets:
          description:
            - Number of distinct C(topology/physical_package_id) values of the online CPUs; without those files,
              of C(physical id) values in C(/proc/cpuinfo); 1 when neither is there.
          type: int
          returned: always
          sample: 2
        online_count:
          description: Number of online CPUs.
          type: int
          returned: always
          sample: 128
        online:
          description: Online CPUs as a cpulist.
          type: str
          returned: always
          sample: 0-127
        numa_nodes:
          description: Number of online NUMA nodes.
          type: int
          returned: always
          sample: 2
        numa:
          description: Per online NUMA node, its CPUs.
          type: list
          elements: dict
          returned: always
          contains:
            node:
              description: NUMA node number.
              type: int
              returned: always
              sample: 0
            cpus:
              description: The node's CPUs as a cpulist.
              type: str
              returned: always
              sample: 0-63
    pci:
      description: The PCI functions selected by O(pci_selector) and their PCI Express settings.
      returned: always
      type: dict
      contains:
        selector:
          description: The selection in words.
          type: str
          returned: always
          sample: NVIDIA and AMD GPUs (vendor 0x10de/0x1002, class 0x0300/0x0302/0x0380/0x1200)
        pcie_bus_perf:
          description: True when the kernel was booted with C(pci=pcie_bus_perf), which clamps MRRS to MPS.
          type: bool
          returned: always
          sample: false
        count:
          description: Number of selected devices.
          type: int
          returned: always
          sample: 8
        missing_bdfs:
          description: Addresses of O(pci_selector.bdfs) that the node does not have.
          type: list
          elements: str
          returned: always
          sample: []
        nvidia_gpus:
          description:
            - Every NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302) on the PCI bus, selected or not; GPU health
              compares it with the GPUs nvidia-smi lists.
          type: list
          elements: str
          returned: always
          sample: ["0000:41:00.0", "0000:61:00.0"]
        gpu_vendors:
          description:
            - Every GPU on the PCI bus, selected or not, by address - C(nvidia) (vendor 0x10de, class 0x0300/0x0302)
              or C(amd) (vendor 0x1002, class 0x0300/0x0302/0x0380/0x1200).
          type: dict
          returned: always
          sample: {"0000:05:00.0": "amd", "0000:26:00.0": "amd"}
        devices:
          description: The selected devices, sorted by address.
          type: list
          elements: dict
          returned: always
          contains:
            bdf:
              description: Domain-qualified address.
              type: str
              returned: always
              sample: "0000:41:00.0"
            vendor:
              description: Vendor id as sysfs spells it.
              type: str
              returned: always
              sample: "0x10de"
            device:
              description: Device id.
              type: str
              returned: always
              sample: "0x2bb5"
            class:
              description: 24-bit class code.
              type: str
              returned: always
              sample: "0x030200"
            numa_node:
              description: NUMA node of the device; -1 when the platform does not say.
              type: int
              returned: always
              sample: 0
            pcie:
              description: True when the config space has a PCI Express capability.
              type: bool
              returned: always
              sample: true
            port_type:
              description: PCI Express device/port type (V(endpoint), V(root_port), ...); null without PCIe.
              type: str
              returned: always
              sample: endpoint
            mps:
              description: Max Payload Size set in Device Control, bytes; null when unknown.
              type: int
              returned: always
              sample: 256
            mps_supported:
              description: Largest Max Payload Size the device supports (Device Capabilities), bytes.
              type: int
              returned: always
              sample: 512
            mrrs:
              description: Max Read Request Size set in Device Control, bytes; null when unknown.
              type: int
              returned: always
              sample: 4096
            link_speed:
              description: Current link speed (Link Status).
              type: str
              returned: always
              sample: 32.0 GT/s
            link_width:
              description: Current link width, lanes (Link Status).
              type: int
              returned: always
              sample: 16
            link_speed_capable:
              description: Maximum link speed (Link Capabilities).
              type: str
              returned: always
              sample: 32.0 GT/s
            link_width_capable:
              description: Maximum link width, lanes (Link Capabilities).
              type: int
              returned: always
              sample: 16
            error:
              description:
                - >-
                  Why the PCIe values are unknown (config space unreadable or truncated, or C(not responding -
                  config space reads 0xff)); null otherwise.
              type: str
              returned: always
              sample: null
            responding:
              description:
                - >-
                  False when the device's config space reads all 0xff (or vendor id ffff), that is when it fell off
                  the bus (lspci shows C(rev ff)); GPU health fails such a GPU.
              type: bool
              returned: always
              sample: true
    kernel_log:
      description:
        - The kernel log, filtered by O(kmsg_levels) and O(kmsg_since), classified.
        - Each record is a dict with C(level) (name), C(time) (seconds since boot), C(seq) (kernel sequence
          number) and C(message); C(xid) records add C(code) (int) and C(device) (C(DDDD:BB:DD) as NVRM
          prints it); C(aer) and C(fallen_off_bus) records add C(device) when the message names one and
          C(aer) records C(severity); C(lockdown) records add C(program) and C(what); C(module_failure)
          records add C(module); C(noise) records add C(rule) (index in the rules) and C(address) when the rule
          has a cidr.
      returned: always
      type: dict
      contains:
        available:
          description: False when the kernel log could not be read; the other counts are then zero.
          type: bool
          returned: always
          sample: true
        reason:
          description: Why the kernel log is unavailable; null when available.
          type: str
          returned: always
          sample: null
        source:
          description: The path read.
          type: str
          returned: always
          sample: /dev/kmsg
        levels:
          description: The level names used, normalized.
          type: list
          elements: str
          returned: always
          sample: [err, warn]
        since:
          description: O(kmsg_since) as used.
          type: float
          returned: always
          sample: 0.0
        last_time:
          description:
            - Timestamp (seconds since boot) of the newest record in the log at any level; null when the log is
              empty or unavailable. Pass it plus V(0.000001) as O(kmsg_since) to a later call to see only newer
              records.
          type: float
          returned: always
          sample: 5321.402113
        records_total:
          description: Well-formed records in the log.
          type: int
          returned: always
          sample: 1890
        records_selected:
          description: Records at a selected level and time.
          type: int
          returned: always
          sample: 12
        malformed:
          description: Lines that are not records; skipped.
          type: int
          returned: always
          sample: 0
        trouble:
          description: Number of selected records in the classes aer, xid, fallen_off_bus, lockdown, module_failure.
          type: int
          returned: always
          sample: 0
        counts:
          description: Number of selected records per class.
          type: dict
          returned: always
          contains:
            aer:
              description: PCIe Advanced Error Reporting records.
              type: int
              returned: always
              sample: 0
            xid:
              description: NVIDIA Xid records.
              type: int
              returned: always
              sample: 0
            fallen_off_bus:
              description: C(GPU has fallen off the bus) records.
              type: int
              returned: always
              sample: 0
            lockdown:
              description: Lockdown refusals.
              type: int
              returned: always
              sample: 0
            module_failure:
              description: Module load failures (symbol version mismatch, unknown symbol, nvidia-peermem error,
                signature verification).
              type: int
              returned: always
              sample: 0
            noise:
              description: Records matched by an ignore rule.
              type: int
              returned: always
              sample: 2
            other:
              description: Everything else.
              type: int
              returned: always
              sample: 1
        records:
          description: Per class (the keys of RV(tuning_facts.kernel_log.counts)), the first 5 records of that class.
          type: dict
          returned: always
          sample:
            xid:
              - {level: err, time: 5321.402113, seq: 1822, code: 79, device: "0000:41:00",
                 message: "NVRM: Xid (PCI:0000:41:00): 79, pid=2231, GPU has fallen off the bus."}
            noise:
              - {level: warn, time: 0.959, seq: 6, rule: 0, message: "vxlan: non-ECT from 10.224.3.17 with TOS=0x2"}
        xid_codes:
          description: Xid code (string) -> number of records.
          type: dict
          returned: always
          sample: {"79": 1}
        amdgpu:
          description:
            - >-
              The amdgpu driver's records of a sick GPU in the same window, at every level (the driver logs resets,
              VRAM loss and RAS counts at info level) - C(counts) per class, C(trouble), C(by_device) (address ->
              class -> n), C(ras_blocks) and the first C(records) per class. Only when the log has amdgpu records.
          type: dict
          returned: when the kernel log holds amdgpu records
          sample: {"counts": {"gpu_reset": 1, "vram_lost": 1}, "trouble": 2,
                   "by_device": {"0000:65:00.0": {"gpu_reset": 1, "vram_lost": 1}}}
        aer_severities:
          description:
            - >-
              AER severity -> number of records, as newer kernels spell it (C(Corrected) of older kernels counts as
              C(Correctable), C(Uncorrected) as C(Uncorrectable)).
          type: dict
          returned: always
          sample: {Correctable: 3}
    platform:
      description:
        - >-
          What the node can take (module_utils/core/platform.py), read from files only: C(kernel) (C(release),
          C(version) the release's numbers, C(config) the options a setting needs from C(/boot/config-<release>)
          or C(/proc/config.gz) (C(y), C(m), a value, C(n) for "is not set", null when absent; null as a whole
          when neither file exists), C(config_source), C(amd_pstate_driver) C(builtin), C(module) or C(absent)
          from C(modules.builtin) and the module tree, null when unknown); C(cpu) (C(vendor), C(family),
          C(model), C(model_name), C(cppc_flag)); C(acpi_cppc) (the firmware exposes ACPI CPPC:
          C(/sys/devices/system/cpu/cpu0/acpi_cppc/) exists); C(nvidia_driver) without nvidia-smi (C(version)
          from C(/sys/module/nvidia/version), else C(/proc/driver/nvidia/version); C(flavor) C(open) for
          "NVIDIA UNIX Open Kernel Module", C(proprietary) for "NVIDIA UNIX x86_64 Kernel Module", null when
          unknown; C(source) the file read); C(amd_driver) (C(version) from C(/sys/module/amdgpu/version), set
          by ROCm's amdgpu-dkms; null for the in-tree driver).
      type: dict
      returned: always
      sample: {"kernel": {"release": "5.15.0-91-generic", "version": [5, 15, 0], "config": null,
               "config_source": null, "amd_pstate_driver": null},
               "cpu": {"vendor": "AuthenticAMD", "family": 25, "model": 17, "model_name": "AMD EPYC 9654",
                       "cppc_flag": true}, "acpi_cppc": false,
               "nvidia_driver": {"version": "580.65.06", "flavor": "open", "source": "/sys/module/nvidia/version"},
               "amd_driver": {"version": null, "source": null}}
    # tools/generate.py writes the families' sections (Family.facts_doc): BEGIN GENERATED tuning_info.facts
    pcie_acs:
      description:
        - The P2P path of the selected GPUs (module_utils/families/pcie_acs.py, the C(pcie_acs) family's read), C(gpus)
          each GPU's chain of bridges up to its root port, C(bridges) per bridge the ACS capability (ACSCap and ACSCtl
          decoded as SrcValid, TransBlk, ReqRedir, CmpltRedir, UpstreamFwd, EgressCtrl, DirectTrans) or no ACS
          capability, and the devices bound to vfio-pci below it, each GPU's IOMMU group and its default domain type,
          C(kernel_args) the ACS arguments of the running kernel (C(pci=disable_acs_redir=)), C(lockdown) the kernel
          lockdown mode.
      returned: always
      type: dict
    iommu:
      description:
        - The IOMMU that translates the selected GPUs' DMA, from sysfs and the running command line.
      returned: always
      type: dict
      contains:
        active:
          description: True when an IOMMU is active (C(/sys/class/iommu) lists a unit).
          type: bool
          returned: always
          sample: true
        units:
          description: The IOMMU units of C(/sys/class/iommu).
          type: list
          elements: str
          returned: always
          sample: [ivhd0]
        kernel_args:
          description: The IOMMU arguments of the running kernel (C(iommu=), C(iommu.), C(amd_iommu=), C(intel_iommu=)).
          type: list
          elements: str
          returned: always
          sample: [iommu=pt]
        gpus:
          description:
            - Per selected GPU its C(bdf), C(iommu_group) (null without one) and C(iommu_group_type), the group's
              default domain type (V(identity) is passthrough, V(DMA) and V(DMA-FQ) translated).
          type: list
          elements: dict
          returned: always
          sample: [{bdf: "0000:41:00.0", iommu_group: "32", iommu_group_type: identity}]
    cpuidle:
      description: CPU idle states (C-states) of the online CPUs.
      returned: always
      type: dict
      contains:
        supported:
          description: True when a cpuidle driver is active and has states.
          type: bool
          returned: always
          sample: true
        driver:
          description: The cpuidle driver (C(acpi_idle), C(intel_idle), C(haltpoll)); null when none.
          type: str
          returned: always
          sample: acpi_idle
        governor:
          description: The cpuidle governor; null when none.
          type: str
          returned: always
          sample: menu
        states:
          description:
            - Per state name (C(POLL), C(C1), C(C2), ...), as the first online CPU lists them.
            - Each value has C(index), C(latency) (exit latency, microseconds), C(residency) (microseconds),
              C(disabled_cpus) (on how many online CPUs the state is disabled), C(disabled_cpulist),
              C(enabled_cpus), C(missing_cpus) (online CPUs without the state), and with O(detail=true)
              C(per_cpu), a dict by CPU number (string) of C(disabled) (bool), C(usage) and C(time) (int).
          type: dict
          returned: always
          sample:
            C2: {index: 2, latency: 400, residency: 800, disabled_cpus: 128, disabled_cpulist: 0-127,
                 enabled_cpus: 0, missing_cpus: 0}
    cpufreq:
      description:
        - CPU frequency scaling. Per-CPU settings are aggregated as a dict with C(value) (the most common value
          over the online CPUs, null when the attribute is absent), C(cpus_differing) (how many online CPUs
          have another value) and C(cpulists) (each value present -> the cpulist that has it).
      returned: always
      type: dict
      contains:
        supported:
          description: True when a cpufreq driver serves the CPUs.
          type: bool
          returned: always
          sample: true
        driver:
          description: The cpufreq driver (C(acpi-cpufreq), C(amd-pstate), C(amd-pstate-epp), C(intel_pstate), ...).
          type: str
          returned: always
          sample: acpi-cpufreq
        cpus_with_policy:
          description: Number of online CPUs that have a cpufreq policy.
          type: int
          returned: always
          sample: 128
        governor:
          description: The scaling governor, aggregated.
          type: dict
          returned: always
          sample: {value: performance, cpus_differing: 0, cpulists: {performance: 0-127}}
          contains:
            value:
              description: The most common governor.
              type: str
              returned: always
              sample: performance
            cpus_differing:
              description: Number of online CPUs with another governor (or none).
              type: int
              returned: always
              sample: 0
            cpulists:
              description: Governor -> cpulist of the CPUs that use it.
              type: dict
              returned: always
              sample: {performance: 0-127}
        epp:
          description: The energy performance preference, aggregated like RV(tuning_facts.cpufreq.governor).
          type: dict
          returned: always
          sample: {value: performance, cpus_differing: 0, cpulists: {performance: 0-127}}
          contains:
            value:
              description: The most common EPP; null when the driver has no EPP.
              type: str
              returned: always
              sample: performance
            cpus_differing:
              description: Number of online CPUs with another EPP.
              type: int
              returned: always
              sample: 0
            cpulists:
              description: EPP -> cpulist.
              type: dict
              returned: always
              sample: {performance: 0-127}
        boost:
          description: C(/sys/devices/system/cpu/cpufreq/boost); null when absent (see C(intel_pstate.no_turbo)).
          type: bool
          returned: always
          sample: true
        available_governors:
          description: Governors the driver offers.
          type: list
          elements: str
          returned: always
          sample: [performance, powersave]
        available_epp:
          description: EPP values the driver offers; empty without EPP.
          type: list
          elements: str
          returned: always
          sample: [default, performance, balance_performance, balance_power, power]
        amd_pstate:
          description: The amd-pstate driver's status file (it exists only when amd-pstate registered).
          type: dict
          returned: always
          contains:
            present:
              description: True when C(amd_pstate/status) exists.
              type: bool
              returned: always
              sample: true
            status:
              description: V(active), V(passive), V(guided) or V(disable); null when absent.
              type: str
              returned: always
              sample: active
        intel_pstate:
          description: The intel_pstate driver's state.
          type: dict
          returned: always
          contains:
            present:
              description: True when C(intel_pstate/status) exists.
              type: bool
              returned: always
              sample: false
            status:
              description: V(active), V(passive) or V(off); null when absent.
              type: str
              returned: always
              sample: active
            no_turbo:
              description: C(intel_pstate/no_turbo) as a bool; null when absent.
              type: bool
              returned: always
              sample: false
        per_cpu:
          description: Per CPU number (string), its C(governor) and C(epp).
          type: dict
          returned: when O(detail=true)
          sample: {"0": {governor: performance, epp: performance}}
    tunables:
      description:
        - The kernel tunables of the family, NUMA balancing, zone reclaim, transparent hugepages and the sysctls of
          O(sysctls).
      returned: always
      type: dict
      contains:
        numa_balancing:
          description: C(kernel.numa_balancing) (0 off, 1 on, 2 tiering); null when absent.
          type: int
          returned: always
          sample: 0
        zone_reclaim_mode:
          description: C(vm.zone_reclaim_mode); null when absent.
          type: int
          returned: always
          sample: 0
        thp:
          description: Transparent hugepages, the selected value of each setting.
          type: dict
          returned: always
          contains:
            enabled:
              description: Selected value of C(transparent_hugepage/enabled); null when absent.
              type: str
              returned: always
              sample: madvise
            defrag:
              description: Selected value of C(transparent_hugepage/defrag); null when absent.
              type: str
              returned: always
              sample: defer+madvise
        sysctl:
          description:
            - Each key of O(sysctls) -> its value, whitespace runs made single spaces (C(4096 131072 6291456));
              null when the key does not exist.
          returned: always
          type: dict
          sample: {vm.swappiness: "10", net.ipv4.tcp_rmem: 4096 131072 6291456}
    kmod:
      description: Kernel modules.
      returned: always
      type: dict
      contains:
        loaded:
          description: Names of the loaded (loadable) modules, from C(/proc/modules), sorted.
          type: list
          elements: str
          returned: always
          sample: [mlx5_core, nvidia, nvidia_modeset, nvidia_uvm, nvme]
        boot_id:
          description: The running boot's id (C(/proc/sys/kernel/random/boot_id)), null when unreadable.
          type: str
          returned: always
          sample: 5f0c7a1e-3b2d-4c8e-9a61-0d2b7e4f9c13
        by_name:
          description:
            - Each name of O(modules) -> C(loaded) (bool, C(/sys/module/NAME) exists), C(builtin) (bool, built
              into the kernel), C(parameters) (dict, parameter name -> current value from
              C(/sys/module/NAME/parameters), null when unreadable) and C(options) (the modprobe.d file of this
              collection for the module, with C(params), parameter name -> value, C(boot_id), the boot it was written
              in, and C(overridden), parameter name -> C(value) and C(source) of what a boot sets after it, another
              modprobe.d file or the kernel command line; null without such a file).
          type: dict
          returned: always
          sample: {nvidia_peermem: {loaded: false, builtin: false, parameters: {}, options: null},
                   nvidia_uvm: {loaded: true, builtin: false, parameters: {uvm_disable_hmm: "N"},
                                options: {params: {uvm_disable_hmm: "1"}, boot_id: 5f0c7a1e-3b2d-4c8e}}}
    gpu_health:
      description: NVIDIA driver user-space state.
      returned: always
      type: dict
      contains:
        persistenced:
          description: The NVIDIA persistence daemon, found by a scan of C(/proc/*/comm).
          type: dict
          returned: always
          contains:
            running:
              description: True when a C(nvidia-persistenced) process exists.
              type: bool
              returned: always
              sample: true
            pids:
              description: Its process ids.
              type: list
              elements: int
              returned: always
              sample: [2187]
        driver_version:
          description: C(/sys/module/nvidia/version); null when the driver is not loaded.
          type: str
          returned: always
          sample: 570.124.06
        aer:
          description:
            - The AER error counters (core/aer.py) of each selected GPU and each bridge above it, from
              C(aer_dev_correctable), C(aer_dev_nonfatal) and C(aer_dev_fatal) (error name to count since boot, the
              C(TOTAL_ERR_*) line as C(TOTAL)); C(gpu) names the GPU below each device, C(missing) the devices without
              the files, C(previous) the guard's last reading of this boot (null when none); C(time) is seconds since
              boot. Null without a selected GPU.
          type: dict
          returned: always
          sample: {"boot_id": "5c1d...", "time": 1765000000.0, "devices": {"0000:41:00.0": {"fatal": {"TOTAL": 0}}},
                   "gpu": {"0000:41:00.0": "0000:41:00.0"}, "missing": [], "previous": null}
    gpu_p2p:
      description:
        - What stops peer-to-peer traffic of the selected GPUs that config space shows.
      returned: always
      type: dict
      contains:
        redirect:
          description:
            - Per selected GPU with one, the bridges above it (the root port first) whose ACS control has P2P Request
              Redirect or Completion Redirect on, which sends its peer traffic up to the root complex.
          type: dict
          returned: always
          sample: {"0000:01:00.0": ["0000:00:01.1"]}
        bars:
          description:
            - Per selected GPU (core/pci_bar.py) its vendor, PCI device id, the size of each assigned memory BAR from
              sysfs C(resource) (index to bytes), the Resizable BAR capability of config space (index to C(current)
              and C(supported) sizes in bytes; null without one) and its memory in bytes (null when not known).
          type: dict
          returned: always
          sample: {"0000:41:00.0": {"vendor": "nvidia", "device": "0x2bb5", "bars": {"0": 67108864, "1": 268435456},
                   "rebar": {"1": {"current": 268435456, "supported": [268435456, 137438953472]}},
                   "memory": 103079215104}}
    gpu_locality:
      description:
        - Where each GPU sits (module_utils/families/gpu_locality.py, the C(gpu_locality) family's read;
          docs/gpu-locality.md), from sysfs alone. C(gpus) per selected GPU its C(numa_node) (null when unknown;
          C(numa_source) says whether the device or its nearest bridge published it, C(numa_node_published) the raw
          value), C(cpus) (its local CPUs that are online), C(host_bridge), C(root_port), C(switches), C(irqs), C(nics)
          and C(nvme) (every NIC and NVMe drive with its C(relation) in the legend of C(nvidia-smi topo -m), one of PIX,
          PXB, PHB, NODE, SYS, nearest first) and C(nearest_nic) (RDMA-capable NICs first) and C(nearest_nvme).
        - C(nics) (classes 0x0200 and 0x0207, physical functions) and C(nvme) (0x010802) with the same placement fields
          and their names (C(netdevs), C(rdma), C(names)); C(irqs) of GPUs and NICs counts the MSI/MSI-X IRQs and
          those served only on another NUMA node (C(remote), C(remote_cpus)). C(irqbalance) says whether it runs;
          C(numa_nodes), C(multi_node), C(online_cpus), C(host_bridges) (host bridge -> NUMA node) and C(hostname).
      returned: always
      type: dict
    # END GENERATED tuning_info.facts
verification:
  description:
    - The node against O(desired), as C(roles/tuning) writes its JSON, JUnit and Markdown reports from it; see
      C(docs/verify.md) for every key.
  returned: when O(desired) is given
  type: dict
  contains:
    status:
      description: V(pass) or V(fail).
      type: str
      returned: always
      sample: fail
    ok:
      description:
        - True when nothing fails the host (no drifted setting, no new kernel error, no pending one with
          O(verify.fail_on_pending=true)).
      type: bool
      returned: always
      sample: false
    failures:
      description: Why the host fails, one line per reason.
      type: list
      elements: str
      returned: always
      sample: ["1 drifted: cpufreq driver"]
    gate:
      description: The verdict of O(verify.gate), C({name, status, ok, failures}).
      type: dict
      returned: always
      sample: {name: full, status: fail, ok: false, failures: ["1 drifted: cpufreq driver"]}
    settings:
      description:
        - One entry per setting, C({id, family, name, desired, running, persisted, state, reason, runtime}); C(state)
          is V(applied), V(pending_reboot), V(drifted), V(not_applicable) or V(unsupported).
        - C(cause) where the node tells why a setting is or will be drifted, C({kind, ...}), one of
          V(sysctl_override) with C(file) and C(value) (a sysctl file applied after this collection's drop-in sets
          the key otherwise at boot), V(boot_unit_failed) with C(unit) and C(result) (the boot unit failed at this
          boot).
      type: list
      elements: dict
      returned: always
    counts:
      description: Number of settings per state.
      type: dict
      returned: always
      sample: {applied: 20, pending_reboot: 1, drifted: 0, not_applicable: 3, unsupported: 0}
    pending:
      description: Ids of the settings pending a reboot.
      type: list
      elements: str
      returned: always
      sample: [cpufreq.driver]
    exports:
      description:
        - The knob families' documents for programs, file name -> JSON document (the C(gpu_locality) family's
          C(topology.json)); the role writes each beside the host's reports as C(<host>.<file name>).
      type: dict
      returned: always
    sections:
      description:
        - The knob families' own sections of the Markdown report, C({family, title, markdown}) each.
      type: list
      elements: dict
      returned: always
    junit:
      description:
        - The JUnit classification, C({cases, tests, failures, errors, skipped}); each case is C({classname, name,
          kind, type, message, detail}), kind V(pass), V(failure), V(skipped) or V(error).
      type: dict
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

# core._zipload first, for its side effect: module_utils is compiled once per run, not twice.
# pylint: disable-next=unused-import
from ansible_collections.gpunode.tuning.plugins.module_utils.core import _zipload, command, kernel_log  # noqa: F401
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import NodeError
from ansible_collections.gpunode.tuning.plugins.module_utils.flows import verify as verify_node
from ansible_collections.gpunode.tuning.plugins.module_utils.flows.verification import VerificationError

ARGUMENT_SPEC = verify_node.ARGUMENT_SPEC


def build_module():
    return AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def main():
    module = build_module()
    if kernel_log.needs_netaddr(module.params["kmsg_ignore"]):
        module.fail_json(msg=missing_required_lib("netaddr", reason="for kmsg_ignore rules with a cidr"))
    try:
        module.exit_json(changed=False, **verify_node.run(module))
    except (FactsError, NodeError, VerificationError, command.TimeoutsError) as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
