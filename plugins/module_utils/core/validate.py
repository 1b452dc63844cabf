# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Validators for every value that reaches a file or a command line on a node.

How it works and why: docs/dev/node-code.md, "core/validate.py".
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Callable

# The PCI id rule is setpci_mrrs's own (one definition); here it only gets this module's error type.

# Unicode categories never allowed: controls (C0, DEL, C1: newline, tab, escape ...), invisible
# format characters (bidi overrides, zero-width), and the line/paragraph separators that
# str.splitlines() treats as line breaks.
FORBIDDEN_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
TEXT_ALLOWED = "printable text without control characters or line breaks"

SYSCTL_COMPONENT_RE = re.compile(r"[A-Za-z0-9_:@+-]+")
SYSCTL_KEY_ALLOWED = (
    "a sysctl name under /proc/sys such as vm.swappiness or kernel/numa_balancing: components of letters, "
    "digits and _ - : @ +, separated by dots (or slashes), starting with a letter, digit or '_'; "
    "no '..', no leading '/' or '-', no '=', whitespace or control characters")
SYSCTL_KEY_MAX = 256
SYSCTL_VALUE_ALLOWED = (
    "printable text without control characters or line breaks; fields separated by spaces (or tabs, "
    "written as spaces); a leading '-' only on a negative integer")
SIGNED_INT_FIELDS_RE = re.compile(r"-?[0-9]+(?: +-?[0-9]+)*")

KMOD_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
KMOD_NAME_ALLOWED = "letters, digits, '_' and '-', not starting with '-', at most 64 characters"
KMOD_PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
KMOD_PARAM_NAME_ALLOWED = "a letter or '_' then letters, digits, '_', '.', '-', at most 64 characters"
# A value is always passed as NAME=VALUE (argv and modprobe.d alike), so a leading '-' cannot be
# read as an option there; negative numbers (index=-2) are common parameter values.
KMOD_PARAM_VALUE_RE = re.compile(r"[A-Za-z0-9_.,:/+@%=-]{1,256}")
KMOD_PARAM_VALUE_ALLOWED = (
    "1 to 256 of letters, digits and , . _ : / + @ % = - (no whitespace, quotes, control or shell characters)")


# The names the kernel shows in cpuidle/stateN/name: POLL, C1E, C6_ACPI (intel_idle), WFI,
# cpu-sleep-0 (psci_idle, from the device tree).
CSTATE_NAME_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}")
CSTATE_NAME_ALLOWED = ("an idle state name as cpuidle/stateN/name shows it (POLL, C1E, C6_ACPI, WFI, cpu-sleep-0): "
                       "1 to 64 letters, digits, '_', '.', '-', not starting with '-'")

# The largest CONFIG_NR_CPUS the kernel offers is 8192; the bound also keeps a range such as
# 0-99999999 from being expanded into a list of that size.
CPU_MAX = 8191
_CPU_RANGE_RE = re.compile(r" *([0-9]{1,5}) *(?:- *([0-9]{1,5}) *)?")
CPULIST_ALLOWED = ("a kernel cpulist such as 0-3,8,10-11: CPU numbers 0-%d and ascending ranges LOW-HIGH, "
                   "separated by commas" % CPU_MAX)


class ValidationError(ValueError):
    """A value that may not reach a file or a command line; the message names it and what is allowed."""


def forbidden_characters(text: str) -> list[str]:
    """The characters of ``text`` that must never reach a file or an argument list, in order, once each."""
    out: list[str] = []
    for char in text:
        if unicodedata.category(char) in FORBIDDEN_CATEGORIES and char not in out:
            out.append(char)
    return out


def describe_characters(chars: list[str]) -> str:
    """Human names of characters: ``line feed (\\n)``, ``U+202E``."""
    names = {"\n": "line feed (\\n)", "\r": "carriage return (\\r)", "\t": "tab (\\t)", "\x00": "NUL (\\0)",
             "\x1b": "escape (\\x1b)"}
    return ", ".join(names.get(c, "U+%04X" % ord(c)) for c in chars)


def check_text(what: str, text: str, allowed: str = TEXT_ALLOWED) -> str:
    """Return ``text`` unless it holds a forbidden character; the error names ``what`` and them."""
    bad = forbidden_characters(text)
    if bad:
        raise ValidationError("%s contains %s: allowed is %s" % (what, describe_characters(bad), allowed))
    return text


# --- sysctl --------------------------------------------------------------------------------------


def sysctl_key_components(key: object) -> list[str]:
    """Split a sysctl name into its file path components below /proc/sys."""
    if not isinstance(key, str) or not key or len(key) > SYSCTL_KEY_MAX:
        raise ValidationError("sysctl key %r is invalid: allowed is %s" % (key, SYSCTL_KEY_ALLOWED))
    check_text("sysctl key %r" % key, key, SYSCTL_KEY_ALLOWED)
    if key[0] in "/.-" or ".." in key:
        raise ValidationError("sysctl key %r is invalid: allowed is %s" % (key, SYSCTL_KEY_ALLOWED))
    first = min((i for i in (key.find("."), key.find("/")) if i >= 0), default=-1)
    if first >= 0 and key[first] == "/":
        parts = key.split("/")
    else:
        parts = [p.replace("/", ".") for p in key.split(".")]
    for part in parts:
        # A dot inside a component is only allowed where it came from a '/' of a dotted name.
        if not all(SYSCTL_COMPONENT_RE.fullmatch(piece) for piece in part.split(".")):
            raise ValidationError("sysctl key %r is invalid: allowed is %s" % (key, SYSCTL_KEY_ALLOWED))
    return parts


def sysctl_value(key: str, text: str) -> str:
    """Check the text of a sysctl value; return it with runs of spaces collapsed."""
    if not isinstance(text, str):
        raise ValidationError("sysctl %s: value %r is not text: allowed is %s" % (key, text, SYSCTL_VALUE_ALLOWED))
    check_text("sysctl %s: value %r" % (key, text), text.replace("\t", " "), SYSCTL_VALUE_ALLOWED)
    value = " ".join(text.split())
    if not value:
        raise ValidationError("sysctl %s: an empty value is not allowed: allowed is %s" % (key, SYSCTL_VALUE_ALLOWED))
    if value.startswith("-") and not SIGNED_INT_FIELDS_RE.fullmatch(value):
        raise ValidationError("sysctl %s: value %r starts with '-': allowed is %s" % (key, text, SYSCTL_VALUE_ALLOWED))
    return value


# --- kernel modules -----------------------------------------------------------------------------


def kmod_name(name: object) -> str:
    """A kernel module name that modprobe can never take for an option or a path."""
    if not isinstance(name, str) or not KMOD_NAME_RE.fullmatch(name):
        raise ValidationError("module name %r is invalid: allowed are %s" % (name, KMOD_NAME_ALLOWED))
    return name


def kmod_param_value(value: object) -> str:
    """A parameter value as modprobe takes it (booleans as 1/0, numbers as text)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def kmod_param(module: str, name: object, value: object) -> str:
    """Return ``NAME=VALUE`` for one module parameter, the same on modprobe's argv and in modprobe.d."""
    if not isinstance(name, str) or not KMOD_PARAM_NAME_RE.fullmatch(name):
        raise ValidationError("%s: parameter name %r is invalid: allowed are %s"
                              % (module, name, KMOD_PARAM_NAME_ALLOWED))
    if value is None or isinstance(value, (dict, list)) or not KMOD_PARAM_VALUE_RE.fullmatch(kmod_param_value(value)):
        raise ValidationError("%s: value %r of parameter %s is invalid: allowed are %s"
                              % (module, value, name, KMOD_PARAM_VALUE_ALLOWED))
    return "%s=%s" % (name, kmod_param_value(value))


def each(values: object, validator: Callable[[Any], Any], noun: str, allowed: str) -> list:
    """Apply ``validator`` to every element of the list ``values``; the error lists every refused one."""
    if not isinstance(values, (list, tuple)):
        raise ValidationError("%r is not a list of %s: allowed is a list, each %s" % (values, noun, allowed))
    out, errors = [], []
    for value in values:
        try:
            out.append(validator(value))
        except ValidationError as exc:
            errors.append(str(exc))
    if errors:
        raise ValidationError("; ".join(errors))
    return out


# --- CPU idle states and CPU lists ------------------------------------------------------------


def cstate_name(name: object) -> str:
    """An idle state name, as the boot script compares it with cpuidle/stateN/name."""
    if not isinstance(name, str) or not CSTATE_NAME_RE.fullmatch(name):
        raise ValidationError("idle state name %r is invalid: allowed is %s" % (name, CSTATE_NAME_ALLOWED))
    return name


def cstate_names(names: object) -> list[str]:
    """Validate a list of idle state names; the error lists every invalid one."""
    return each(names, cstate_name, "idle state names", CSTATE_NAME_ALLOWED)


def cpulist(text: object) -> list[int]:
    """The sorted CPU numbers of a kernel cpulist (``0-3,8``); spaces around numbers are allowed."""
    bad = ValidationError("cpulist %r is invalid: allowed is %s" % (text, CPULIST_ALLOWED))
    if not isinstance(text, str) or not text.strip():
        raise bad
    cpus: set[int] = set()
    for part in text.split(","):
        m = _CPU_RANGE_RE.fullmatch(part)
        if not m:
            raise bad
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        if high < low or high > CPU_MAX:
            raise bad
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def sysfs_name(name: str) -> str:
    """The name the kernel uses in /sys/module (modprobe treats '-' and '_' alike)."""
    return name.replace("-", "_")
