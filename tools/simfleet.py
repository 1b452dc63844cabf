#!/usr/bin/env python
"""Generate a simulated fleet: N simulated nodes (tools/simnode) and an inventory for them.

Every host uses the local connection and its own node root (``gpunode_tuning_root``), so
``playbooks/rollout.yml`` (or any playbook of the collection) runs against the fleet unchanged.
One node per distinct shape is built with simnode; the others are copies of it, which keeps a
1,000-host fleet to seconds.

Usage::

    tools/simfleet.py DIR --hosts 20                      # 20 nodes, 4 CPUs, 1 GPU: the default mix
    tools/simfleet.py DIR --hosts 20 --preset epyc-pstate-epp   # 20 x one preset
    tools/simfleet.py DIR --hosts 20 --node 1=locked-bus-perf   # the first host (the canary) is a lockdown node
    tools/simfleet.py DIR --hosts 20 --unreachable 1      # plus one host nobody can reach

DIR receives ``hosts.yml`` (group ``gpunodes``, hosts ``sim-0001``...) and ``nodes/HOST/``.
The default mix alternates the audited node (``audited-epyc-8gpu``, on acpi-cpufreq: hosts 1, 3,
5, ...) and ``epyc-pstate-epp`` (already on amd-pstate: hosts 2, 4, ...). Both pass the runtime
rollout's gate after runtime tuning; the audited ones still need the persistent flow and a
reboot for the cpufreq driver, which the rollout summary lists. ``locked-bus-perf`` refuses the
MRRS write (kernel lockdown), so it fails tuning and verification.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simnode  # noqa: E402  (this directory is put on sys.path above)

# The default fleet: host N gets DEFAULT_MIX[(N - 1) % len(DEFAULT_MIX)]. Fleets like the audited
# one run acpi-cpufreq, which only the persistent flow and a reboot switch: tests and benchmarks
# of the runtime rollout must meet such nodes, next to nodes that already run amd-pstate.
DEFAULT_MIX = ("audited-epyc-8gpu", "epyc-pstate-epp")
DEFAULT_SHAPE = {"cpus": 4, "gpus": 1, "kmsg_records": 0}
# An address that refuses connections at once: SSH to the discard port of the loopback address.
UNREACHABLE_VARS = {
    "ansible_connection": "ssh",
    "ansible_host": "127.0.0.1",
    "ansible_port": 9,
    "ansible_ssh_common_args": "-o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=no "
                               "-o UserKnownHostsFile=/dev/null",
}


def host_name(index):
    """Inventory name of the fleet's host number ``index`` (1-based)."""
    return "sim-%04d" % index


def parse_node_overrides(specs):
    """Turn ``["1=locked-bus-perf", ...]`` into ``{1: "locked-bus-perf"}`` (1-based host numbers)."""
    overrides = {}
    for spec in specs or []:
        number, sep, preset = spec.partition("=")
        if not sep or not number.isdigit() or int(number) < 1:
            raise ValueError("--node wants NUMBER=PRESET with NUMBER >= 1, got %r" % spec)
        if preset not in simnode.PRESETS:
            raise ValueError("unknown preset %r; available: %s" % (preset, ", ".join(sorted(simnode.PRESETS))))
        overrides[int(number)] = preset
    return overrides


def node_preset(number, preset=None, overrides=None):
    """The preset of host ``number`` (1-based): its override, else ``preset``, else the default mix."""
    if number in (overrides or {}):
        return overrides[number]
    return preset or DEFAULT_MIX[(number - 1) % len(DEFAULT_MIX)]


def build_fleet(directory, hosts, preset=None, shape=None, overrides=None, unreachable=0,
                python=None, group="gpunodes", extra_vars=None):
    """Write ``hosts`` simulated nodes and ``hosts.yml`` under ``directory``; return the inventory path.

    ``preset``: every node's preset (None: the default mix, DEFAULT_MIX). ``shape`` holds
    simnode.build's ``cpus``, ``gpus`` and ``kmsg_records``; ``overrides`` maps a 1-based host
    number to another preset; ``unreachable`` hosts are appended after the others. Each host has
    its preset in the inventory variable ``simfleet_preset``.
    """
    shape = dict(DEFAULT_SHAPE, **(shape or {}))
    overrides = overrides or {}
    bad = sorted(n for n in overrides if n > hosts)
    if bad:
        raise ValueError("--node numbers beyond --hosts %d: %s" % (hosts, bad))
    directory = os.path.abspath(directory)
    nodes = os.path.join(directory, "nodes")
    templates = os.path.join(directory, ".templates")
    os.makedirs(nodes, exist_ok=True)
    built = {}
    inventory_hosts = {}
    for number in range(1, hosts + 1):
        name = node_preset(number, preset, overrides)
        if name not in built:
            # Every preset keeps the fleet's shape except where it cannot take it.
            node_shape = dict(shape)
            if simnode.PRESETS[name]["topology"] == "none":
                node_shape["gpus"] = None
            built[name] = os.path.join(templates, name)
            simnode.build(built[name], name, **node_shape)
        root = os.path.join(nodes, host_name(number))
        shutil.copytree(built[name], root, symlinks=True)
        inventory_hosts[host_name(number)] = {"gpunode_tuning_root": root, "simfleet_preset": name}
    shutil.rmtree(templates, ignore_errors=True)
    for number in range(hosts + 1, hosts + unreachable + 1):
        inventory_hosts[host_name(number)] = dict(UNREACHABLE_VARS, gpunode_tuning_root="/nonexistent")
    group_vars = {
        "ansible_connection": "local",
        "ansible_python_interpreter": python or sys.executable,
    }
    group_vars.update(extra_vars or {})
    inventory = {"all": {"children": {group: {"hosts": inventory_hosts, "vars": group_vars}}}}
    path = os.path.join(directory, "hosts.yml")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("# Simulated fleet written by tools/simfleet.py: %d node(s), %d unreachable host(s).\n"
                     % (hosts, unreachable))
        yaml.safe_dump(inventory, handle, default_flow_style=False, sort_keys=False)
    return path


def main(argv=None):
    """Command line: build a fleet, print the inventory path."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="output directory (hosts.yml and nodes/); must not hold a fleet yet")
    parser.add_argument("--hosts", type=int, required=True, help="number of simulated nodes")
    parser.add_argument("--preset", choices=sorted(simnode.PRESETS),
                        help="every node's preset (default: alternate %s)" % " and ".join(DEFAULT_MIX))
    parser.add_argument("--cpus", type=int, default=DEFAULT_SHAPE["cpus"])
    parser.add_argument("--gpus", type=int, default=DEFAULT_SHAPE["gpus"])
    parser.add_argument("--kmsg-records", type=int, default=0, help="extra kernel log records per node")
    parser.add_argument("--node", action="append", metavar="NUMBER=PRESET",
                        help="give host NUMBER (1-based; 1 is the first canary) another preset; repeatable")
    parser.add_argument("--unreachable", type=int, default=0, help="extra hosts that refuse connections")
    parser.add_argument("--python", help="ansible_python_interpreter of the hosts (default: this Python)")
    parser.add_argument("--group", default="gpunodes")
    args = parser.parse_args(argv)
    if args.hosts < 0 or args.unreachable < 0:
        parser.error("--hosts and --unreachable must be >= 0")
    if os.path.exists(os.path.join(args.dir, "hosts.yml")):
        parser.error("%s already holds a fleet" % args.dir)
    try:
        path = build_fleet(args.dir, args.hosts, preset=args.preset,
                           shape={"cpus": args.cpus, "gpus": args.gpus, "kmsg_records": args.kmsg_records},
                           overrides=parse_node_overrides(args.node), unreachable=args.unreachable,
                           python=args.python, group=args.group)
    except ValueError as exc:
        print("simfleet: %s" % exc, file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
