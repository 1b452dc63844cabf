# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the GPUs need of the driver and the kernel (issue 43, "fit before tuned"): judgements over platform.py's facts.

``gpu_generation`` (a table by PCI device id; an unknown id says so), ``driver_fitness`` (the GPUs' needs against
the running driver and the user's floors), ``kernel_below``, ``floors_problems`` (the role's
``gpunode_tuning_floors``), the fleet summary's ``versions`` and ``eol_warnings``. The role's
``gpunode_tuning_floors`` is laid over platform.FLOORS per GPU (``_need``): its ``nvidia_flavor`` replaces the
table's (``any`` lifts it), of two driver minimums the higher applies. Verification and the precheck load this
file; a run that tunes does not (it is apart from platform.py for that). Plain Python (3.8+), no Ansible import.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core.platform import FLOORS, parse_release

# NVIDIA GPU generations by PCI device id (pci.ids, https://pci-ids.ucw.cz/read/PC/10de, and NVIDIA's
# driver README, Appendix A "Supported NVIDIA GPU Products"). Only listed ids are known; any other
# reads "unknown" and is never guessed from a neighbouring id.
GPU_GENERATIONS = {
    "blackwell": ("0x2901", "0x2941", "0x29bc", "0x2b85", "0x2bb1", "0x2bb5", "0x2c02"),
    "hopper": ("0x2321", "0x2330", "0x2331", "0x2335", "0x2342"),
    "ada": ("0x26b5", "0x26b9", "0x27b8"),
    "ampere": ("0x20b0", "0x20b2", "0x20b5", "0x20b7", "0x20f1", "0x2236"),
    "turing": ("0x1eb8",),
    "volta": ("0x1db1", "0x1db4"),
}


GPU_GENERATION_SOURCE = "https://pci-ids.ucw.cz/read/PC/10de"


_GENERATION_OF = {dev: gen for gen, devs in GPU_GENERATIONS.items() for dev in devs}


FLOOR_KEYS = ("nvidia_driver", "nvidia_flavor", "kernel")


FLAVORS = ("open", "proprietary", "any")


def versions(platform: dict | None) -> dict:
    """The fleet summary's versions of one host: kernel release, NVIDIA and AMD driver versions and flavour."""
    platform = platform or {}
    nvidia = platform.get("nvidia_driver") or {}
    return {"kernel": (platform.get("kernel") or {}).get("release"), "nvidia_driver": nvidia.get("version"),
            "nvidia_flavor": nvidia.get("flavor"), "amd_driver": (platform.get("amd_driver") or {}).get("version")}


def eol_warnings(platform: dict | None) -> list:
    """The loaded NVIDIA driver's branch past its end of life: a warning, never a failure."""
    return driver_fitness([], (platform or {}).get("nvidia_driver") or {})["warnings"]


def version_tuple(text: Any) -> tuple | None:
    """``580.65.06`` -> (580, 65, 6); None for anything else."""
    parts = str(text or "").strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def floors_problems(floors: Any) -> list:
    """``(key, message)`` for each bad entry of ``gpunode_tuning_floors`` (the precheck and the module)."""
    if floors is None:
        return []
    if not isinstance(floors, dict):
        return [("", "gpunode_tuning_floors must be a mapping with the keys %s, got %r"
                 % (", ".join(FLOOR_KEYS), floors))]
    out = [(str(k), "gpunode_tuning_floors: unknown key %r; allowed: %s" % (k, ", ".join(FLOOR_KEYS)))
           for k in sorted(set(floors) - set(FLOOR_KEYS), key=str)]
    driver = floors.get("nvidia_driver")
    if driver is not None and version_tuple(driver) is None:
        out.append(("nvidia_driver", "gpunode_tuning_floors.nvidia_driver must be a version such as "
                                     "\"580.65.06\", got %r" % (driver,)))
    flavor = floors.get("nvidia_flavor")
    if flavor is not None and flavor not in FLAVORS:
        out.append(("nvidia_flavor", "gpunode_tuning_floors.nvidia_flavor must be one of %s, got %r"
                    % (", ".join(FLAVORS), flavor)))
    kernel = floors.get("kernel")
    if kernel is not None and (not isinstance(kernel, str) or parse_release(kernel) is None):
        out.append(("kernel", "gpunode_tuning_floors.kernel must be a release such as \"6.8\", got %r" % (kernel,)))
    return out


def gpu_generation(device: Any) -> str:
    """The NVIDIA generation of a PCI device id (``0x2bb5``), or ``unknown``."""
    try:
        key = "0x%04x" % (int(device, 16) if isinstance(device, str) else int(device))
    except (TypeError, ValueError):
        return "unknown"
    return _GENERATION_OF.get(key, "unknown")


def _need(device: str, floors: dict) -> list:
    """What one GPU needs: ``[(what, wanted, source)]`` with what ``flavor`` or ``driver``."""
    gen = gpu_generation(device)
    table = FLOORS["gpu"].get(gen) or {}
    out = []
    flavor = floors.get("nvidia_flavor") or table.get("flavor")
    if flavor and flavor != "any":
        src = "gpunode_tuning_floors" if floors.get("nvidia_flavor") else table.get("source")
        out.append(("flavor", flavor, src))
    own = FLOORS["gpu_devices"].get("0x%04x" % int(device, 16)) if gen != "unknown" else None
    minimum, src = floors.get("nvidia_driver"), "gpunode_tuning_floors"
    shipped = (own or {}).get("nvidia_driver") or table.get("nvidia_driver")
    if shipped and (minimum is None or version_tuple(shipped) > version_tuple(minimum)):
        minimum, src = shipped, (own or table).get("source")
    if minimum:
        out.append(("driver", minimum, src))
    return out


def driver_fitness(gpus: list, driver: dict, floors: dict | None = None) -> dict:
    """The NVIDIA GPUs' needs against the running driver: ``{failures, warnings, generations}``.

    ``gpus``: ``[{bdf, device}]``; ``driver``: ``nvidia_driver()``'s answer; ``floors``: the role's
    ``gpunode_tuning_floors``. A failure names the GPU, its generation, the driver and the floor with
    its source; a driver whose version or flavour is unknown is judged only where it is known.
    """
    floors = floors or {}
    failures, generations = [], {}
    version, flavor = driver.get("version"), driver.get("flavor")
    for g in gpus:
        gen = gpu_generation(g.get("device"))
        generations[g["bdf"]] = gen
        for what, wanted, source in _need(str(g.get("device")), floors):
            if what == "flavor" and flavor and flavor != wanted:
                failures.append("GPU %s (%s, %s) needs the %s kernel modules; the driver %s runs the %s ones "
                                "(floor: %s)" % (g["bdf"], g.get("device"), gen, wanted, version, flavor, source))
            if what == "driver" and version_tuple(version) and version_tuple(version) < version_tuple(wanted):
                failures.append("GPU %s (%s, %s) needs NVIDIA driver %s or newer; the node runs %s (floor: %s)"
                                % (g["bdf"], g.get("device"), gen, wanted, version, source))
    warnings = []
    branch = version_tuple(version)
    if branch and branch[0] <= FLOORS["nvidia_eol_branch_max"]:
        warnings.append("NVIDIA driver %s: branch R%d is past its end of life (%s)"
                        % (version, branch[0], FLOORS["nvidia_eol_source"]))
    return {"failures": failures, "warnings": warnings, "generations": generations}


def kernel_below(platform: dict | None, floors: dict | None) -> str | None:
    """Why the running kernel is below ``floors["kernel"]``, or None."""
    want = parse_release((floors or {}).get("kernel"))
    have = tuple(((platform or {}).get("kernel") or {}).get("version") or ())
    if not want or not have or have >= want:
        return None
    return "the kernel %s is below the floor %s (gpunode_tuning_floors.kernel)" % (
        (platform.get("kernel") or {}).get("release"), floors["kernel"])
