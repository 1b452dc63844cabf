"""``build``: a simulated node for a preset, part by part (the built-ins, then the plugged parts of ``parts``)."""

from __future__ import annotations

import os

from . import parts
from .amd import AMD_SMI_MODES, apply_amd_faults, write_amd_smi
from .boot import write_reboot_command
from .cpu import write_cpus, write_numa
from .kernel import (
    fit_platform,
    write_identity,
    write_kmsg,
    write_modprobe,
    write_modules,
    write_platform,
    write_processes,
    write_standard_dirs,
)
from .locality import check_iommu_vfio, write_iommu_vfio, write_locality
from .machine import Preset, is_gpu
from .nvidia import apply_gpu_faults, smi_driver_of, write_nvidia_smi
from .pci import write_pci
from .presets import PRESETS
from .services import BENCHMARK_KINDS, write_benchmark
from .topology import build_pci_topology
from .tree import Tree


def build(root: str, preset: str, cpus: int | None = None, gpus: int | None = None,  # noqa: PLR0913
          kmsg_records: int = 0, nvidia_smi: bool = False, gpu_faults: dict | None = None,
          iommu: str | None = None, vfio: list | None = None, benchmark: str | None = None,
          smi_driver: str = "current", smi_mode: str = "answer", smi_ansi: bool = False,
          amd_smi: bool = False, amd_faults: dict | None = None, amd_smi_mode: str = "answer",
          kernel: str | None = None, cppc: bool = True, nvidia_driver: str | None = None, **part_options) -> dict:
    """Write a simulated node for ``preset`` under ``root`` (which must be empty or absent).

    ``nvidia_smi``: ship a node-local nvidia-smi stand-in (``usr/bin``) answering from its own
    table; ``gpu_faults``: ``{kind: [GPU index, ...]}`` with the kinds of ``GPU_FAULTS`` (implies
    ``nvidia_smi``). ``iommu``: an active IOMMU whose groups have this default domain type
    (``identity``, ``DMA``, ``DMA-FQ``); ``vfio``: BDFs bound to vfio-pci (a ``driver`` link).
    ``benchmark``: ship the benchmark stand-in ``usr/bin/gpunode-sim-bench`` (``normal``: tuning
    raises its number; ``inverse``: tuning lowers it; ``hang``: it never answers), for the rollout's measure gate.
    ``smi_driver`` (``SMI_DRIVERS``: ``r470`` an older driver's field set), ``smi_mode`` (``SMI_MODES``: ``hang``,
    ``exit9``, ``garbled``) and ``smi_ansi`` (the ANSI-underlined topo header of drivers 590-610) shape the
    nvidia-smi stand-in and imply ``nvidia_smi``; a ``dead`` GPU fault reads all 0xff from config space.
    ``amd_smi``: ship a node-local amd-smi stand-in (AMD presets); ``amd_faults`` (``AMD_FAULTS``, GPU indices in
    bus order) and ``amd_smi_mode`` (``AMD_SMI_MODES``) shape it and imply ``amd_smi``.
    ``kernel``: the running kernel's release instead of the preset's (its config and modules.builtin have
    amd-pstate from 5.17 on); ``cppc``: False for a firmware with CPPC off (no ``cpuN/acpi_cppc/``); where the
    kernel cannot run the preset's amd-pstate (``kernel_runs_amd_pstate``) the node runs acpi-cpufreq.
    ``nvidia_driver``: ``FLAVOR:VERSION`` (``open:580.65.06``, ``proprietary:570.86.15``) writes
    ``proc/driver/nvidia/version`` and ``sys/module/nvidia/version`` as that driver does.
    ``part_options``: the keyword arguments of the plugged parts (``parts.PART_MODULES``, each ``Part.options``).
    Returns a short description: preset name, cpus, gpus, and the GPU BDFs.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; available: {', '.join(sorted(PRESETS))}")
    p = Preset(name=preset, **PRESETS[preset])
    if cpus is not None:
        p.cpus = cpus
    if gpus is not None:
        if p.topology == "none" and gpus:
            raise ValueError(f"preset {preset} has no PCIe devices; it cannot take gpus={gpus}")
        p.gpus = gpus
    if p.cpus < 1:
        raise ValueError("cpus must be >= 1")
    if os.path.exists(root) and os.listdir(root):
        raise ValueError(f"{root} is not empty")
    fit_platform(p, kernel, cppc, nvidia_driver)
    funcs = build_pci_topology(p)
    faults = {k: list(v) for k, v in (gpu_faults or {}).items()}
    missing = apply_gpu_faults(p, funcs, faults)  # before the first write: a bad fault writes nothing
    smi_driver_of(p, smi_driver, smi_mode, smi_ansi)  # likewise for a bad stand-in option
    amd_faults = {k: list(v) for k, v in (amd_faults or {}).items()}
    apply_amd_faults(p, funcs, amd_faults)
    if amd_smi_mode not in AMD_SMI_MODES:
        raise ValueError(f"amd_smi_mode {amd_smi_mode!r} is not one of {', '.join(AMD_SMI_MODES)}")
    check_iommu_vfio(funcs, iommu, vfio)
    if benchmark is not None and benchmark not in BENCHMARK_KINDS:
        raise ValueError(f"benchmark {benchmark!r} is not one of {', '.join(BENCHMARK_KINDS)}")
    plugged = parts.checked(part_options, p, funcs)  # a bad option of a plugged part writes nothing either
    t = Tree(root)
    write_identity(t, p)
    write_cpus(t, p)
    write_numa(t, p)
    write_pci(t, funcs)
    write_modules(t, p)
    write_processes(t, p)
    write_kmsg(t, p.kmsg, extra_records=kmsg_records)
    write_standard_dirs(t, p)
    write_reboot_command(t)
    write_modprobe(t, p)
    if nvidia_smi or faults or (smi_driver, smi_mode, smi_ansi) != ("current", "answer", False):
        write_nvidia_smi(t, p, funcs, faults, missing, smi_driver, smi_mode, smi_ansi)
    if amd_smi or amd_faults or amd_smi_mode != "answer":
        write_amd_smi(t, p, funcs, amd_faults, amd_smi_mode)
    write_iommu_vfio(t, p, funcs, iommu, vfio)
    write_locality(t, p, funcs)
    write_platform(t, p)
    if benchmark is not None:
        write_benchmark(root, benchmark)
    parts.write(plugged, t, p, funcs)
    gpu_bdfs = [f.bdf for f in funcs if is_gpu(f)]
    return {"preset": p.name, "cpus": p.cpus, "gpus": len(gpu_bdfs), "gpu_bdfs": gpu_bdfs, "root": t.root}
