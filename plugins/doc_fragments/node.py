# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options and attributes shared by the modules that read or write a node."""

    DOCUMENTATION = r"""
options:
  root:
    description:
      - Root directory of the node. Every sysfs, procfs and C(/dev) path is resolved below it.
      - V(/) is the running system. Any other directory is a simulated node (see C(tools/simnode));
        then no system command acts on the controller's host, and C(lspci)/C(setpci) are pointed at
        the tree with C(-O sysfs.path=).
      - The root must be an existing directory that has a C(sys/) directory; otherwise the module fails, naming
        the root, before it reads or writes anything. An empty string is refused, never taken as V(/).
    type: path
    default: /
"""

    ATTRIBUTES = r"""
attributes:
  check_mode:
    support: full
    description: Nothing is written in check mode, not even a temporary file.
  diff_mode:
    support: full
    description: Before and after values are returned per item.
  platform:
    platforms: linux
    support: full
    description: Linux only; reads and writes sysfs and procfs.
"""

    ATTRIBUTES_READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: The module never writes; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  platform:
    platforms: linux
    support: full
    description: Linux only; reads sysfs and procfs.
"""

    # The modules that write a node (tuning_apply, tuning_persist): the node's one lock (flows/writers.py).
    WRITER = r"""
options:
  lock_timeout:
    description:
      - Seconds to wait for the node's lock (C(.lock) next to O(journal)), which every writing flow takes (runtime,
        persistent, rollback, the boot runner, the guard's re-apply). After that the module fails, before any write,
        naming the holder (flow, pid, host, start time). Check mode takes no lock.
    type: float
    default: 60
"""

    COMMAND_TIMEOUTS = r"""
options:
  command_timeouts:
    description:
      - Seconds each kind of external command the module runs may take before its process group is killed
        and the command is reported as not answering (for example C(nvidia-smi did not answer within 30 s),
        named as a wedged GPU or driver). A mapping of kinds to seconds; a kind not given keeps its default.
      - Kinds and defaults - C(nvidia_smi) 30, C(amd_smi) 30, C(dcgmi) 600, C(nvbandwidth) 600, C(rocm_bandwidth)
        (TransferBench, rocm-bandwidth-test) 600, C(nccl_tests) (all_reduce_perf) 600, C(pciutils) (setpci, lspci) 30,
        C(modprobe) 120, C(systemctl) 120, C(bootloader) (update-grub, grubby) 300, C(udevadm) 60, C(benchmark) 1800,
        C(other) 120.
      - An unknown kind or a value that is not a number > 0 fails the module before anything is run.
    type: dict
"""
