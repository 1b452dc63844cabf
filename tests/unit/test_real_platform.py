# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""core/platform.py's readers on real output other people posted (tests/data/real, issue 43)."""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import fitness, platform


@pytest.mark.parametrize("name, version, flavor, arch", [
    ("nvidia-version-open-565.57.01-nixgl-186.txt", "565.57.01", "open", "x86_64"),
    ("nvidia-version-open-525.60.11-nixgl-121.txt", "525.60.11", "open", "x86_64"),
    ("nvidia-version-open-aarch64-jetson-35.3.1-nixgl-139.txt", "35.3.1", "open", "aarch64"),
    ("nvidia-version-proprietary-535.183.06-bottlerocket-core-kit-118.txt", "535.183.06", "proprietary", "x86_64"),
])
def test_proc_driver_nvidia_version_gives_version_and_flavour(real, name, version, flavor, arch):
    assert platform.parse_nvidia_version(real(name).text) == {"version": version, "flavor": flavor, "arch": arch}


def test_the_readme_example_of_an_elided_banner(real):
    lines = real("nvidia-modinfo-license-both-flavors-readme-open-gpu-kernel-modules-171.txt").text.splitlines()
    # NVIDIA's elided banner: the flavour is known, the version is not guessed.
    assert platform.parse_nvidia_version(lines[1]) == {"version": None, "flavor": None, "arch": None}


def test_the_rtx_pro_6000_of_a_posted_lspci_is_blackwell(real):
    ids = [line.split("[10de:")[1][:4] for line in real("nvidia-modinfo-license-open-rtx-pro-6000-cubecos-312.txt")
           .text.splitlines() if "[10de:" in line]
    assert ids == ["2bb5", "2bb5"] and {fitness.gpu_generation("0x" + i) for i in ids} == {"blackwell"}
    assert fitness.gpu_generation("0x2bb6") == "unknown"  # a neighbouring id is never guessed


@pytest.mark.parametrize("name, family, model, cppc", [
    ("cpuinfo-epyc-9754-bergamo-vm-no-cppc-ollama.txt", 25, 160, False),
    ("cpuinfo-epyc-7351p-naples-no-cppc-needrestart-150.txt", 23, 1, False),
    ("cpuinfo-epyc-9654p-genoa-ansible-82244.txt", 25, 17, False),  # cut before cppc: not claimed
    ("lscpu-epyc-74f3-milan-core-to-core-latency-33.txt", 25, 1, None),
    ("lscpu-epyc-9645-turin-family-26-cpufetch-365.txt", 26, 17, None),
    ("lscpu-epyc-9655-turin-cppc-archspec-json-145.txt", None, 2, True),
])
def test_cpuinfo_and_lscpu_give_family_model_and_the_cppc_flag(real, name, family, model, cppc):
    got = platform.parse_cpuinfo(real(name).text)
    assert (got["family"], got["model"]) == (family, model)
    assert (None if got["flags"] is None else "cppc" in got["flags"]) is cppc
    assert got["model_name"].startswith("AMD EPYC")
    if "cpuinfo" in name or "cpufetch" in name or "core-to-core" in name:
        assert got["vendor"] == "AuthenticAMD"


def test_a_turin_family_is_the_amd_pstate_default_family(real):
    cpu = platform.parse_cpuinfo(real("lscpu-epyc-9645-turin-family-26-cpufetch-365.txt").text)
    facts = {"kernel": {"release": "6.14.0-29-generic", "version": [6, 14, 0]}, "cpu": cpu}
    assert cpu["family"] == platform.FLOORS["amd_pstate"]["default_family"] and platform.amd_pstate_default(facts)
    milan = platform.parse_cpuinfo(real("lscpu-epyc-74f3-milan-core-to-core-latency-33.txt").text)
    assert not platform.amd_pstate_default({"kernel": facts["kernel"], "cpu": milan})


@pytest.mark.parametrize("name, want", [
    ("kconfig-amd-pstate-not-set-siderolabs-pkgs-980.txt", {"CONFIG_X86_AMD_PSTATE": "n",
                                                            "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE": None}),
    ("kconfig-amd-pstate-y-default-mode-3-siderolabs-pkgs-980.txt", {"CONFIG_X86_AMD_PSTATE": "y",
                                                                     "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE": "3"}),
    ("kconfig-grep-amd-p-tkg-5.19-chaotic-aur-1918.txt", {"CONFIG_X86_AMD_PSTATE": "y",
                                                          "CONFIG_X86_AMD_PSTATE_DEFAULT_MODE": None}),
])
def test_kernel_config_options(real, name, want):
    assert platform.parse_kernel_config(real(name).text) == want


def test_a_config_without_amd_pstate_refuses_whatever_the_release(real):
    config = platform.parse_kernel_config(real("kconfig-amd-pstate-not-set-siderolabs-pkgs-980.txt").text)
    facts = {"kernel": {"release": "6.6.32-talos", "version": [6, 6, 32], "config": config,
                        "config_source": "/proc/config.gz"}, "cpu": {"family": 25}, "acpi_cppc": True}
    got = platform.amd_pstate_feasibility(facts, "active")
    assert not got["ok"] and "CONFIG_X86_AMD_PSTATE not set" in got["reason"] and "/proc/config.gz" in got["reason"]
