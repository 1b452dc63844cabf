# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tunables family's verification half: its facts (``read``, ``FACTS_DOC``, the ``sysctls`` option) and the
rows of NUMA balancing, transparent hugepages and the sysctls.

Imported when verification or tuning_info first calls it (``family.later`` in families/tunables.py), never by a
run that only applies (docs/dev/adding-a-family.md).
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpunode.tuning.plugins.module_utils.core import family as contract
from ansible_collections.gpunode.tuning.plugins.module_utils.core.facts import FactsError, int_or_none
from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import same, setting
from ansible_collections.gpunode.tuning.plugins.module_utils.core.node import Node, read_small, selected_bracket
from ansible_collections.gpunode.tuning.plugins.module_utils.families.tunables import NAME, THP_DIR

# tuning_info's ``sysctls`` option: dotted names ("/" for a dot inside a name) that read() reads.
FACTS_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_/:@+-]+)+$")
FACTS_KEY_ALLOWED = "dotted names such as vm.swappiness (letters, digits, '_', '-'; '/' for a dot inside a name)"
# tuning_info's RETURN of tuning_facts.tunables (tools/generate.py writes it there).
FACTS_DOC = r"""
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
"""


# --- facts: what tuning_info reads of this family (facts["tunables"]) ---


def facts_path(key: str) -> str:
    """``proc/sys`` relative path of a dotted key of the ``sysctls`` option (``/`` stands for a dot in a name)."""
    return "proc/sys/" + key.replace(".", "\0").replace("/", ".").replace("\0", "/")


def facts_keys(keys: list[str] | None) -> list[str]:
    """tuning_info's ``sysctls``, unchanged after checking each is a dotted sysctl name; FactsError otherwise."""
    out = []
    for key in keys or []:
        # "/" stands for a dot inside a name: no component may become "." or ".." (path traversal).
        if (not isinstance(key, str) or not FACTS_KEY_RE.match(key)
                or any(c in ("", ".", "..") for c in facts_path(key).split("/")[2:])):
            raise FactsError("sysctls: %r is not a sysctl key; allowed: %s" % (key, FACTS_KEY_ALLOWED))
        out.append(key)
    return out


def read(node: Node, selector: Any = None, query: contract.FactsQuery | None = None) -> dict:
    """The family's facts (``facts["tunables"]``): NUMA balancing, zone reclaim, transparent hugepages, and
    each key of the ``sysctls`` option -> its value with whitespace runs made single spaces (None when absent)."""
    keys = ((query.options if query else None) or {}).get("sysctls") or []
    thp = THP_DIR + "/"
    sysctl = {}
    for key in keys:
        value = read_small(node.path(facts_path(key)))
        sysctl[key] = None if value is None else " ".join(value.split())
    return {
        "numa_balancing": int_or_none(read_small(node.path("proc/sys/kernel/numa_balancing"))),
        "zone_reclaim_mode": int_or_none(read_small(node.path("proc/sys/vm/zone_reclaim_mode"))),
        "thp": {
            "enabled": selected_bracket(read_small(node.path(thp + "enabled")) or ""),
            "defrag": selected_bracket(read_small(node.path(thp + "defrag")) or ""),
        },
        "sysctl": sysctl,
    }


def facts_options(desired: dict) -> dict:
    """The desired sysctls are the keys read() reads."""
    return {"sysctls": list(desired.get("sysctl") or {})}


def boot_sysctls(desired: dict) -> dict:
    """What the sysctl drop-in sets at boot for this family: the desired sysctls and NUMA balancing."""
    wanted = dict(desired.get("sysctl") or {})
    if desired.get("numa_balancing") is not None:
        wanted["kernel.numa_balancing"] = desired["numa_balancing"]
    return wanted


# --- verification: the rows of this family's settings ---


def _override_reason(key, want, running, over):
    """Why a key is or will be drifted because a later sysctl file sets it."""
    if same(running, want):
        return ("applied now, but %s sets %s = %s after this collection's drop-in: it wins at the next boot"
                % (over["file"], key, over["value"]))
    return "%s sets %s = %s after this collection's drop-in, and wins at boot" % (over["file"], key, over["value"])


def _sysctl_setting(family, key, want, running, ctx):
    persisted = None if ctx.sysctl_persisted is None else ctx.sysctl_persisted.get(key)
    if running is None:
        return setting(family, key, want, None, "not_applicable",
                       "this kernel has no %s (/proc/sys/%s)" % (key, key.replace(".", "/")), persisted)
    over = (getattr(ctx, "sysctl_overrides", None) or {}).get(key)
    if same(running, want):
        row = setting(family, key, want, running, "applied", _override_reason(key, want, running, over) if over
                      else "", persisted)
    else:
        why = ""
        if over:
            why = _override_reason(key, want, running, over)
        elif persisted is not None and same(persisted, want):
            why = "the drop-in sets %s at boot, but the running value differs (changed since)" % want
        row = setting(family, key, want, running, "drifted", why, persisted)
    if over:
        row["cause"] = {"kind": "sysctl_override", "file": over["file"], "value": over["value"]}
    return row


def evaluate(facts: dict, desired: dict, ctx: Any) -> list:
    """NUMA balancing, transparent hugepages and the other sysctls (the desired state's keys of those names)."""
    out = []
    mine = facts.get(NAME) or {}
    sysctl = mine.get("sysctl") or {}
    if desired.get("numa_balancing") is not None:
        running = mine.get("numa_balancing")
        if running is None:
            running = sysctl.get("kernel.numa_balancing")
        out.append(_sysctl_setting("numa_balancing", "kernel.numa_balancing", desired["numa_balancing"], running, ctx))
    thp = mine.get("thp") or {}
    for key, want in sorted((desired.get("thp") or {}).items(), key=lambda kv: kv[0] != "enabled"):
        if want in (None, ""):
            continue
        running = thp.get(key)
        persisted = ctx.boot_persisted(want)
        if running is None:
            out.append(setting("thp", key, want, None, "not_applicable",
                               "no transparent hugepages (/sys/kernel/mm/transparent_hugepage/%s)" % key, persisted))
        else:
            out.append(setting("thp", key, want, running, "applied" if running == want else "drifted", "", persisted))
    for key, want in sorted((desired.get("sysctl") or {}).items()):
        if key == "kernel.numa_balancing" and desired.get("numa_balancing") is not None:
            continue
        out.append(_sysctl_setting("sysctl", key, want, sysctl.get(key), ctx))
    return out
