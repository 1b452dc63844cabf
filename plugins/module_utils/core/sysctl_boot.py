# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sysctl files a boot applies, and which of them has the last word on a key.

Core library (docs/dev/adding-a-family.md): the tunables family's verification and verify_node's
reading of the node both use it.
"""

from __future__ import annotations

import os

from ansible_collections.gpunode.tuning.plugins.module_utils.core.family import same

# The directories systemd-sysctl and `sysctl --system` read at boot, in precedence order: a file name
# found in an earlier one hides the same name in the later ones; the files apply sorted by name, and
# /etc/sysctl.conf after all of them (procps; Debian links it as /etc/sysctl.d/99-sysctl.conf too).
SYSCTL_DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
SYSCTL_CONF = "/etc/sysctl.conf"


def sysctl_load_order(listing: dict) -> list:
    """The sysctl files a boot applies, first to last, from ``{directory: [file names]}`` (``SYSCTL_DIRS``).

    Only ``*.conf`` names count; a name is taken from the first directory of ``SYSCTL_DIRS`` that
    has it; the result is sorted by file name, then ``SYSCTL_CONF`` when ``listing`` holds it
    (``{"/etc": ["sysctl.conf"]}``).
    """
    chosen: dict = {}
    for directory in SYSCTL_DIRS:
        for name in listing.get(directory) or []:
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = "%s/%s" % (directory, name)
    order = [chosen[name] for name in sorted(chosen)]
    if os.path.basename(SYSCTL_CONF) in (listing.get(os.path.dirname(SYSCTL_CONF)) or []):
        order.append(SYSCTL_CONF)
    return order


def sysctl_overrides(files: list, ours: str, wanted: dict) -> dict:
    """``{key: {"file", "value"}}``: the wanted keys whose last setting at boot is another file's, with another value.

    ``files``: ``[(path, parsed {key: value})]`` in load order (``sysctl_load_order``, each parsed
    with ``verification.parse_sysctl_conf``); ``ours``: our drop-in's path; ``wanted``: key ->
    desired value. A file that sets a key to the desired value overrides nothing.
    """
    last: dict = {}
    for path, values in files:
        for key in wanted:
            if key in values:
                last[key] = (path, values[key])
    return {key: {"file": path, "value": value} for key, (path, value) in sorted(last.items())
            if path != ours and not same(value, wanted[key])}
