# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validators of what the boot configuration takes: kernel command-line arguments, systemd unit names, the paths
of the files the persistent flow, the boot unit and the guard write (and whether such a file can be written), the
PCI ids of a udev rule.

Apart from core/validate.py so that a run that only applies does not compile them: the command-line family, the
plan halves, the boot unit and the guard (flows/) and the controller import them.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import normalize_hex_id
from ansible_collections.gpunode.tuning.plugins.module_utils.core.validate import ValidationError, each

PATH_RE = re.compile(r"/[A-Za-z0-9_.+@:/-]*")
PATH_ALLOWED = ("an absolute path of letters, digits and _ . + @ : - / (no whitespace, quotes, '%', control "
                "characters or '..')")
KERNEL_ARG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,:/+@%=~^-]{0,255}")
KERNEL_ARG_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# The one argument that needs ';': pci=disable_acs_redir= with a list of PCI addresses (the kernel's
# separator; the GRUB drop-in quotes it, families/kernel_cmdline.py's grub_word). Addresses only: no other ';' passes.
# pci= takes comma-separated options (kernel-parameters.txt), so the list is one option of pci=;
# every address in it is checked, one or many: domain (4-8 hex digits, optional), bus, device 00-1f,
# function 0-7.
ACS_REDIR_OPTION = "disable_acs_redir="
ACS_REDIR_MAX = 128
PCI_ADDR_RE = re.compile(r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[01][0-9a-fA-F]\.[0-7]")
PCI_ADDR_ALLOWED = "[DDDD:]BB:DD.F in hex (domain of 4 to 8 digits, device 00-1f, function 0-7)"
KERNEL_ARG_ALLOWED = (
    "KEY or KEY=VALUE; KEY of letters, digits, '_', '.', '-' (not starting with '-'); VALUE of letters, digits "
    "and , . _ : / + @ % = ~ ^ - (no quotes, whitespace, control characters or shell characters such as $ ` ; |); "
    "';' only between the PCI addresses of pci=disable_acs_redir=DDDD:BB:DD.F;DDDD:BB:DD.F")

UNIT_TYPES = ("service", "socket", "device", "mount", "automount", "swap", "target", "path", "timer", "slice",
              "scope")
_UNIT_CHAR = r"(?:[A-Za-z0-9:_.-]|\\x[0-9a-fA-F]{2})"
UNIT_NAME_RE = re.compile(r"%s+(?:@%s*)?\.(?:%s)" % (_UNIT_CHAR, _UNIT_CHAR, "|".join(UNIT_TYPES)))
UNIT_NAME_MAX = 255
UNIT_NAME_ALLOWED = (
    "a systemd unit name NAME.TYPE (NAME of letters, digits, ':', '_', '.', '-' and \\xHH escapes, optionally "
    "TEMPLATE@INSTANCE; not starting with '-'; TYPE one of %s), at most %d characters"
    % (", ".join(UNIT_TYPES), UNIT_NAME_MAX))

# --- kernel command line ------------------------------------------------------------------------


def kernel_argument(arg: object) -> str:
    """A kernel command-line argument that fits the GRUB drop-in's double quotes and grubby's --args."""
    if not isinstance(arg, str):
        raise ValidationError("argument %r is invalid: allowed is %s" % (arg, KERNEL_ARG_ALLOWED))
    key, sep, value = arg.partition("=")
    plain = arg
    if key == "pci" and sep:
        options = value.split(",")
        for i, option in enumerate(options):
            if option.startswith(ACS_REDIR_OPTION):
                acs_redir_addresses(arg, option[len(ACS_REDIR_OPTION):])
                options[i] = ACS_REDIR_OPTION + "0"  # checked: the plain grammar sees a stand-in
        plain = "pci=" + ",".join(options)
    if not KERNEL_ARG_RE.fullmatch(plain) or not KERNEL_ARG_KEY_RE.fullmatch(key):
        raise ValidationError("argument %r is invalid: allowed is %s" % (arg, KERNEL_ARG_ALLOWED))
    return arg


def acs_redir_addresses(arg: str, text: str) -> list[str]:
    """The addresses of a ``disable_acs_redir=`` list (``;``-separated, at most 128); the error names the bad one."""
    addresses = text.split(";")
    if len(addresses) > ACS_REDIR_MAX:
        raise ValidationError("argument %r is invalid: its disable_acs_redir= list has %d addresses, at most %d are "
                              "allowed: allowed is %s" % (arg, len(addresses), ACS_REDIR_MAX, KERNEL_ARG_ALLOWED))
    for address in addresses:
        if not PCI_ADDR_RE.fullmatch(address):
            raise ValidationError("argument %r is invalid: %r in its disable_acs_redir= list is not a PCI address %s: "
                                  "allowed is %s" % (arg, address, PCI_ADDR_ALLOWED, KERNEL_ARG_ALLOWED))
    return addresses


# --- systemd ------------------------------------------------------------------------------------


def systemd_unit_name(name: object) -> str:
    """A unit name for Before=/After= lists: no whitespace (it would split the list), no '%' specifiers."""
    if (not isinstance(name, str) or len(name) > UNIT_NAME_MAX or name.startswith("-")
            or not UNIT_NAME_RE.fullmatch(name)):
        raise ValidationError("unit name %r is invalid: allowed is %s" % (name, UNIT_NAME_ALLOWED))
    return name


def systemd_unit_names(names: object) -> list[str]:
    """Validate a list of unit names; the error lists every invalid one."""
    return each(names, systemd_unit_name, "unit names", UNIT_NAME_ALLOWED)


def pci_id(value: object) -> str:
    """A vendor or device id as sysfs shows it (``0x10de``), from hex text with or without ``0x``."""
    try:
        return normalize_hex_id(value, "value")
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def absolute_path(path: object) -> str:
    """An absolute path that can stand unquoted in a unit file, a udev rule or a shell line."""
    if (not isinstance(path, str) or not PATH_RE.fullmatch(path) or "/../" in path + "/"
            or "/./" in path + "/"):
        raise ValidationError("path %r is invalid: allowed is %s" % (path, PATH_ALLOWED))
    return path


def write_problem(path: str) -> str | None:
    """Why a file at the absolute ``path`` could not be written, or None when it looks writable."""
    if os.path.lexists(path) and not os.path.isfile(path):
        kind = "a directory" if os.path.isdir(path) else "not a regular file"
        return "%s is %s" % (path, kind)
    directory = os.path.dirname(path)
    existing = directory
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return "%s is not a directory" % existing
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing != directory:
            return "its directory %s does not exist and %s does not accept new files (%s)" % (
                directory, existing, _refusal(existing))
        return "its directory %s does not accept new files (%s)" % (directory, _refusal(directory))
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "%s cannot be replaced (%s)" % (path, _refusal(path))
    return None


def _refusal(path: str) -> str:
    """The likely cause of a refused write: a read-only mount, else an immutable flag or permissions."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "immutable attribute or permissions"
