# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The knob families whose task failed, one line each, for the summary that ends a role flow.

Each flow runs every family in its own block; a rescue records the failed task's result under the
family's name, and the flow fails the host once at its end with these lines. Documented in
family_failures.yml next to this file.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# Keys that name what a loop item is about, in the order tried (dict2items, modules, files).
_ITEM_NAME_KEYS = ("key", "name", "path")


def family_failures(results):
    """``FAMILY: MESSAGE`` for every failed task result in ``results`` (family name -> task result)."""
    if not isinstance(results, Mapping):
        raise AnsibleFilterError("gpunode.tuning.family_failures: expects a mapping of knob family to task result, "
                                 "got %s" % type(results).__name__)
    return ["%s: %s" % (family, failure_message(result))
            for family, result in results.items()
            if isinstance(result, Mapping) and result.get("failed")]


def failure_message(result):
    """The task's message; for a loop, each failed item's message named by its item."""
    items = [item for item in result.get("results") or [] if isinstance(item, Mapping) and item.get("failed")]
    if not items:
        return _message(result)
    return ", ".join("%s: %s" % (_item_name(item.get("item")), _message(item)) for item in items)


def _message(result):
    return " ".join(str(result.get("msg") or "failed without a message").split())


def _item_name(item):
    if isinstance(item, Mapping):
        for key in _ITEM_NAME_KEYS:
            if item.get(key):
                return str(item[key])
        return "an item"
    return str(item)


class FilterModule:
    """gpunode.tuning knob-family filters."""

    def filters(self):
        return {"family_failures": family_failures}
