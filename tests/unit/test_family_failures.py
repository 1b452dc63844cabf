"""The family_failures filter (plugins/filter/family_failures.py): the lines of a flow's summary."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.gpunode.tuning.plugins.filter.family_failures import FilterModule

FILTER_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "filter")
family_failures = FilterModule().filters()["family_failures"]


def test_is_exported_and_documented():
    assert set(FilterModule().filters()) == {"family_failures"}
    with open(os.path.join(FILTER_DIR, "family_failures.yml"), encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert doc["DOCUMENTATION"]["name"] == "family_failures"
    assert doc["DOCUMENTATION"]["options"]["_input"]["type"] == "dict"
    assert doc["EXAMPLES"] and doc["RETURN"]["_value"]["elements"] == "str"


def test_names_only_the_failed_families_in_order_with_their_message():
    results = {
        "mrrs": {"failed": True, "msg": "kernel lockdown is in integrity mode:\n  nothing was written", "devices": []},
        "cstate": {"changed": True, "failed": False, "states": {}},
        "cpufreq": {"skipped": True, "skip_reason": "Conditional result was False"},
        "tunables": {"failed": True},
        "kmod": None,
    }
    assert family_failures(results) == [
        "mrrs: kernel lockdown is in integrity mode: nothing was written",
        "tunables: failed without a message",
    ]
    assert family_failures({}) == []


def test_a_failed_loop_names_each_failed_item():
    loop = {
        "failed": True,
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "item": {"key": "vm.swappiness", "value": 10}},
            {"failed": True, "msg": "Not a directory", "item": {"key": "net.core.somaxconn", "value": 65535}},
            {"failed": True, "msg": "Permission denied", "item": "/etc/udev/rules.d/70-gpunode-tuning.rules"},
            {"failed": True, "msg": "gone", "item": {"path": "/etc/modprobe.d/gpunode-tuning-x.conf"}},
            {"failed": True, "msg": "odd", "item": {"other": 1}},
        ],
    }
    assert family_failures({"persistent files": loop}) == [
        "persistent files: net.core.somaxconn: Not a directory, /etc/udev/rules.d/70-gpunode-tuning.rules: "
        "Permission denied, /etc/modprobe.d/gpunode-tuning-x.conf: gone, an item: odd"
    ]


def test_anything_but_a_mapping_is_a_clear_error():
    with pytest.raises(AnsibleFilterError, match="expects a mapping of knob family to task result, got list"):
        family_failures([{"failed": True}])
