"""Build simulated GPU nodes: a directory tree laid out like a Linux node's sysfs/procfs.

The tree is what the collection's modules see through their ``root`` option, so unit tests,
Molecule scenarios, benchmarks and the demo exercise the real code paths (including the real
``lspci``/``setpci`` binaries through ``-O sysfs.path=``) without hardware and without root.

Usage::

    python tools/simnode build --preset audited-epyc-8gpu DIR [--cpus N] [--gpus N] [--kmsg-records N]
    python tools/simnode build --preset audited-epyc-8gpu DIR --smi-driver r470 --smi-mode hang --smi-ansi \
        --gpu-fault dead=2 --benchmark hang      # the real quirks: an older driver, a wedged GPU, ...
    python tools/simnode list
    python tools/simnode reboot DIR   # a boot with what the tuning left: kernel arguments, drop-ins, boot unit

Presets are x86_64 (AMD EPYC, Intel Xeon, a VM) or arm64 (``grace-arm64-4gpu``: psci_idle,
cppc_cpufreq, an arm64 /proc/cpuinfo without vendor_id, one PCI segment per root port).

The file is standard-library only so it can be copied into a container and run there. The simulated
reboot's reset of journaled values runs the collection's own tuning_apply module, so it needs the
collection and ansible-core importable by the Python that runs it (this checkout's .venv).
"""

from __future__ import annotations

from .amd import (
    AMD_BAD_PAGE_THRESHOLD,
    AMD_ECC_BLOCKS,
    AMD_FAULTS,
    AMD_SMI_MODES,
    AMD_SMI_REFUSALS,
    AMD_SMI_SCRIPT,
    AMD_SMI_STATE,
    AMD_SMI_VERSION,
    amd_metric_entry,
    amd_smi_answers,
    amd_static_entry,
    apply_amd_faults,
    write_amd_smi,
)
from .boot import (
    ACS_CAP_ID,
    ACS_REDIRECT,
    BOOT_RECORD,
    BOOT_UNIT,
    BOOT_UNIT_WANTS,
    COLLECTIONS,
    GRUB_DROPIN,
    JOURNAL,
    MODULES_LOAD_DIRS,
    REBOOT_COMMAND,
    REBOOT_COMMAND_TIMEOUT,
    REBOOT_NEVER_RETURNS,
    REBOOT_SCRIPT,
    RESTORE_OPTIONS,
    SYSCTL_DIRS,
    acs_redirect_bdfs,
    add_kernel_args,
    apply_sysctl_files,
    cpufreq_after_boot,
    grub_dropin_args,
    iommu_after_boot,
    load_boot_modules,
    reboot,
    reset_journaled,
    run_boot_unit,
    running_cpufreq,
    write_reboot_command,
)
from .boot_faults import BOOT_FAULT_KINDS, BOOT_FAULTS, apply_boot_faults, write_boot_faults
from .cli import main
from .cpu import ARM64_FEATURES, CPU_BASE, CPUFREQ_LAYOUT, NO_EPP_DRIVERS, cpufreq_family, set_cpufreq_driver
from .kernel import (
    AMD_PSTATE_SINCE,
    MODPROBE_SCRIPT,
    NVIDIA_FLAVORS,
    kernel_runs_amd_pstate,
    write_kmsg,
    write_modprobe,
)
from .locality import IOMMU_TYPES, IRQBALANCE_PID, MSI_IRQ_BASE, check_iommu_vfio, write_iommu_vfio, write_locality
from .machine import (
    ACPI_GOVERNORS,
    AMD_MI300X_BUSES,
    DEFAULT_SYSCTLS,
    EPP_CHOICES,
    GPU_BUSES,
    IDLE_ACPI_EPYC,
    IDLE_INTEL_XEON,
    IDLE_PSCI_GRACE,
    PSTATE_GOVERNORS,
    SIM_GPU_CLASSES,
    SIM_GPU_VENDORS,
    IdleState,
    PciFunction,
    Preset,
    is_gpu,
)
from .node import build
from .nvidia import (
    GPU_FAULTS,
    NVIDIA_SMI_SCRIPT,
    SMI_DRIVERS,
    SMI_IDLE_CLOCK,
    SMI_MODES,
    SMI_STATE,
    apply_gpu_faults,
    gpu_table_entry,
    write_nvidia_smi,
)
from .pci import (
    AER_FILES,
    AER_SEVERITY_FILES,
    IORESOURCE_MEM_32,
    IORESOURCE_MEM_64_PREF,
    MIB,
    PCIE_PORT_TYPE,
    PCIE_SPEEDS,
    SIM_GPU_MEMORY_GIB,
    aer_text,
    config_space,
    gpu_bars,
    pack_rebar,
    resource_text,
    set_aer,
    set_gpu_bar,
)
from .presets import PRESETS
from .services import (
    BENCH_SCRIPT,
    BENCHMARK_BIN,
    BENCHMARK_KINDS,
    CLOUD_SYSCTL,
    CLOUD_SYSCTL_FILE,
    NODE_EXPORTER_TEXTFILE_DIR,
    SYSTEMCTL_SCRIPT,
    UNIT_STATE,
    write_benchmark,
    write_node_exporter_dir,
    write_sysctl_file,
    write_unit_state,
)
from .topology import CX6DX_ETH, CX7_IB, NVME_DRIVE, SPR_ROOT_PORT, SWITCH_IDS, build_pci_topology

__all__ = [
    "ACPI_GOVERNORS", "ACS_CAP_ID", "ACS_REDIRECT", "AER_FILES", "AER_SEVERITY_FILES", "AMD_BAD_PAGE_THRESHOLD",
    "AMD_ECC_BLOCKS", "AMD_FAULTS", "AMD_MI300X_BUSES", "AMD_PSTATE_SINCE", "AMD_SMI_MODES", "AMD_SMI_REFUSALS",
    "AMD_SMI_SCRIPT", "AMD_SMI_STATE", "AMD_SMI_VERSION", "ARM64_FEATURES", "BENCHMARK_BIN", "BENCHMARK_KINDS",
    "BENCH_SCRIPT", "BOOT_FAULTS", "BOOT_FAULT_KINDS", "BOOT_RECORD", "BOOT_UNIT", "BOOT_UNIT_WANTS",
    "CLOUD_SYSCTL", "CLOUD_SYSCTL_FILE", "COLLECTIONS", "CPUFREQ_LAYOUT", "CPU_BASE", "CX6DX_ETH", "CX7_IB",
    "DEFAULT_SYSCTLS", "EPP_CHOICES", "GPU_BUSES", "GPU_FAULTS", "GRUB_DROPIN", "IDLE_ACPI_EPYC", "IDLE_INTEL_XEON",
    "IDLE_PSCI_GRACE", "IOMMU_TYPES", "IORESOURCE_MEM_32", "IORESOURCE_MEM_64_PREF", "IRQBALANCE_PID", "IdleState",
    "JOURNAL", "MIB", "MODPROBE_SCRIPT", "MODULES_LOAD_DIRS", "MSI_IRQ_BASE", "NODE_EXPORTER_TEXTFILE_DIR",
    "NO_EPP_DRIVERS", "NVIDIA_FLAVORS", "NVIDIA_SMI_SCRIPT", "NVME_DRIVE", "PCIE_PORT_TYPE", "PCIE_SPEEDS",
    "PRESETS", "PSTATE_GOVERNORS", "PciFunction", "Preset", "REBOOT_COMMAND", "REBOOT_COMMAND_TIMEOUT",
    "REBOOT_NEVER_RETURNS", "REBOOT_SCRIPT", "RESTORE_OPTIONS", "SIM_GPU_CLASSES", "SIM_GPU_MEMORY_GIB",
    "SIM_GPU_VENDORS", "SMI_DRIVERS", "SMI_IDLE_CLOCK", "SMI_MODES", "SMI_STATE", "SPR_ROOT_PORT", "SWITCH_IDS",
    "SYSCTL_DIRS", "SYSTEMCTL_SCRIPT", "UNIT_STATE", "acs_redirect_bdfs", "add_kernel_args", "aer_text",
    "amd_metric_entry", "amd_smi_answers", "amd_static_entry", "apply_amd_faults", "apply_boot_faults",
    "apply_gpu_faults", "apply_sysctl_files", "build", "build_pci_topology", "check_iommu_vfio", "config_space",
    "cpufreq_after_boot", "cpufreq_family", "gpu_bars", "gpu_table_entry", "grub_dropin_args", "iommu_after_boot",
    "is_gpu", "kernel_runs_amd_pstate", "load_boot_modules", "main", "pack_rebar", "reboot", "reset_journaled",
    "resource_text", "run_boot_unit", "running_cpufreq", "set_aer", "set_cpufreq_driver", "set_gpu_bar",
    "write_amd_smi", "write_benchmark", "write_boot_faults", "write_iommu_vfio", "write_kmsg", "write_locality",
    "write_modprobe", "write_node_exporter_dir", "write_nvidia_smi", "write_reboot_command", "write_sysctl_file",
    "write_unit_state",
]
