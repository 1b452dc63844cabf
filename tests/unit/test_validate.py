"""module_utils/core/validate.py: the validators every value passes before it reaches a file or an argv."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate as v
from ansible_collections.gpunode.tuning.plugins.module_utils.core import validate_boot as vb


@pytest.mark.parametrize("text,names", [
    ("a\nb", "line feed (\\n)"),
    ("a\rb\tc", "carriage return (\\r), tab (\\t)"),
    ("\x1b[31m", "escape (\\x1b)"),
    ("a\x85b", "U+0085"),  # NEL: a line break to str.splitlines()
    ("a\u2028b\u2029", "U+2028, U+2029"),
    ("\u202eevil", "U+202E"),  # bidi override: the text shown is not the text written
    ("a\x00", "NUL (\\0)"),
])
def test_check_text_names_the_characters(text, names):
    with pytest.raises(v.ValidationError) as exc:
        v.check_text("value %r" % text, text)
    assert names in str(exc.value) and "allowed is printable text" in str(exc.value)


def test_check_text_accepts_printable_unicode():
    assert v.check_text("v", "Grüße, 東京 %p |/usr/bin/x") == "Grüße, 東京 %p |/usr/bin/x"


@pytest.mark.parametrize("key", [
    "-kernel.modprobe", "kernel.modprobe\n", "kernel\nmodprobe", "vm.swappiness=1", "vm swappiness", "vm.*.x",
    ".vm", "/vm/x", "vm..x", "vm.x.", "vm/./x", "", None, 5, "a" * 257, "vm.\u2028x",
])
def test_sysctl_key_grammar_refuses(key):
    with pytest.raises(v.ValidationError, match="allowed is a sysctl name"):
        v.sysctl_key_components(key)


@pytest.mark.parametrize("key,parts", [
    ("vm.swappiness", ["vm", "swappiness"]),
    ("net.ipv4.conf.eth0/100.rp_filter", ["net", "ipv4", "conf", "eth0.100", "rp_filter"]),
    ("net/ipv4/conf/eth0.100/rp_filter", ["net", "ipv4", "conf", "eth0.100", "rp_filter"]),
    ("net.ipv4.conf.br-lan@x+1.forwarding", ["net", "ipv4", "conf", "br-lan@x+1", "forwarding"]),
    ("_x.y", ["_x", "y"]),
])
def test_sysctl_key_grammar_accepts(key, parts):
    assert v.sysctl_key_components(key) == parts


@pytest.mark.parametrize("text,expected", [
    ("10", "10"), ("-1", "-1"), ("-1  0\t5", "-1 0 5"), ("|/usr/lib/core %p", "|/usr/lib/core %p"),
    ("cubic", "cubic"),
])
def test_sysctl_value_accepts(text, expected):
    assert v.sysctl_value("k", text) == expected


@pytest.mark.parametrize("text,fragment", [
    ("x\nkernel.modprobe = /x", "line feed"), ("1\r", "carriage return"), ("", "empty"), ("  ", "empty"),
    ("-x", "starts with '-'"), ("-1 -x", "starts with '-'"), (5, "not text"),
])
def test_sysctl_value_refuses(text, fragment):
    with pytest.raises(v.ValidationError) as exc:
        v.sysctl_value("kernel.core_pattern", text)
    assert fragment in str(exc.value) and "kernel.core_pattern" in str(exc.value)


@pytest.mark.parametrize("name", ["-r", "--remove", "-", "nvidia\n", "nv idia", "nvidia.ko", "../x", "", None,
                                  "a" * 65])
def test_kmod_name_refuses(name):
    with pytest.raises(v.ValidationError, match="not starting with '-'"):
        v.kmod_name(name)


def test_kmod_name_and_param():
    assert v.kmod_name("nvidia-drm") == "nvidia-drm"
    assert v.kmod_param("snd", "index", -2) == "index=-2"
    assert v.kmod_param("nvidia_drm", "modeset", True) == "modeset=1"
    for name, value in (("-r", "1"), ("a b", "1"), ("x", "1 y=2"), ("x", "1\n"), ("x", '"1"'), ("x", None),
                        ("x", [1]), ("x", "")):
        with pytest.raises(v.ValidationError, match="allowed are"):
            v.kmod_param("m", name, value)


@pytest.mark.parametrize("arg", ["-rf", "--args=x", "quiet\n", 'a="b"', "a=b c", "a=$x", "a\u2028b", "", None])
def test_kernel_argument_refuses(arg):
    with pytest.raises(v.ValidationError, match="no quotes, whitespace, control characters"):
        vb.kernel_argument(arg)


@pytest.mark.parametrize("name", [
    "vllm.service", "nvidia-persistenced.service", "getty@tty1.service", "dev-disk-by\\x2duuid-1.device",
    "multi-user.target", "a:b_c.d.socket",
])
def test_unit_names_accepted(name):
    assert vb.systemd_unit_name(name) == name


@pytest.mark.parametrize("name", [
    "vllm.service\nExecStartPre=/bin/sh", "vllm", "vllm.exe", "-vllm.service", "a b.service", "%i.service",
    "a\\.service", "x" * 250 + ".service", "", None, "vllm.service ",
])
def test_unit_names_refused(name):
    with pytest.raises(v.ValidationError, match="allowed is a systemd unit name"):
        vb.systemd_unit_name(name)


def test_unit_name_list_names_every_bad_one():
    with pytest.raises(v.ValidationError) as exc:
        vb.systemd_unit_names(["ok.service", "bad one", "-x.service"])
    assert "'bad one'" in str(exc.value) and "'-x.service'" in str(exc.value) and "ok.service" not in str(exc.value)
    assert vb.systemd_unit_names([]) == []
    with pytest.raises(v.ValidationError, match="not a list"):
        vb.systemd_unit_names("vllm.service")


@pytest.mark.parametrize("path", ["relative/x", "/a b", "/a/../b", "/a/..", "/a\n", "/a%i", "/a'b", "", None])
def test_absolute_path_refuses(path):
    with pytest.raises(v.ValidationError, match="allowed is an absolute path"):
        vb.absolute_path(path)


def test_absolute_path_accepts():
    assert vb.absolute_path("/usr/local/lib/gpunode-tuning/apply-boot-tuning.sh")


def test_write_problem(tmp_path):
    target = tmp_path / "d" / "f.conf"
    assert vb.write_problem(str(target)) is None  # a missing directory is created by the writers
    (tmp_path / "d").mkdir()
    assert vb.write_problem(str(target)) is None
    target.mkdir()
    assert "is a directory" in vb.write_problem(str(target))
    target.rmdir()
    (tmp_path / "file").write_text("")
    assert "is not a directory" in vb.write_problem(str(tmp_path / "file" / "x.conf"))
    target.write_text("x\n")
    subprocess.run(["chattr", "+i", str(target)], check=True)
    try:
        assert "cannot be replaced (immutable attribute or permissions)" in vb.write_problem(str(target))
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    subprocess.run(["chattr", "+i", str(tmp_path / "d")], check=True)
    try:
        assert "does not accept new files" in vb.write_problem(str(target))
        assert "does not exist and" in vb.write_problem(str(tmp_path / "d" / "sub" / "x.conf"))
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "d")], check=True)
    assert os.path.exists(str(target))


def test_the_precheck_names_the_variable_of_a_bad_boot_value():
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import desired_state

    assert desired_state.combination_problems({"gpunode_tuning_boot_unit_before": ["vllm.service"]}) == []
    (msg,) = desired_state.combination_problems({"gpunode_tuning_boot_unit_before": ["a\nb.service"]})
    assert msg.startswith("value of gpunode_tuning_boot_unit_before: unit name 'a\\nb.service' is invalid: allowed is")
    (msg,) = desired_state.combination_problems({"gpunode_tuning_boot_script": "x y"})
    assert "gpunode_tuning_boot_script" in msg and "allowed is an absolute path" in msg


# --- what the boot script renders (issue 12, class 2: the boot script and the udev rule) ---------

SHELL_BREAKERS = ['x"; touch /tmp/x', "C2\ntouch /tmp/x", "C2 C6", "$(id)", "`id`", "C2;id", "C2|id", "'C2'",
                  "C2\u2028", "*", "C[12]"]


@pytest.mark.parametrize("name", SHELL_BREAKERS + ["-C2", "", None, 2, "x" * 65])
def test_cstate_name_refuses(name):
    with pytest.raises(v.ValidationError, match="allowed is an idle state name as cpuidle/stateN/name shows it"):
        v.cstate_name(name)


@pytest.mark.parametrize("name", ["POLL", "C1", "C1E", "C6_ACPI", "C1-SKX", "WFI", "cpu-sleep-0", "c.1", "_x"])
def test_cstate_name_accepts_kernel_names(name):
    assert v.cstate_name(name) == name


def test_cstate_names_lists_every_bad_one():
    with pytest.raises(v.ValidationError) as exc:
        v.cstate_names(["C2", 'x"; touch /tmp/x', "C6\n"])
    msg = str(exc.value)
    assert "'x\"; touch /tmp/x'" in msg and "'C6\\n'" in msg and "'C2'" not in msg
    assert v.cstate_names([]) == [] and v.cstate_names(["C2", "C6"]) == ["C2", "C6"]
    with pytest.raises(v.ValidationError, match="not a list of idle state names"):
        v.cstate_names("C2")


@pytest.mark.parametrize("text,cpus", [
    ("0", [0]), ("0-3,8", [0, 1, 2, 3, 8]), (" 2 - 3 , 0 ", [0, 2, 3]), ("3,1,1", [1, 3]), ("8191", [8191]),
])
def test_cpulist_expands(text, cpus):
    assert v.cpulist(text) == cpus


@pytest.mark.parametrize("text", ["", " ", "0-3\n8", "0-3,\n", "3-1", "0-8192", "1-", "-1", "0,,1", "0;id", "0-3 8",
                                  "²", "9" * 6000, None, 3, ["0"]])
def test_cpulist_refuses(text):
    with pytest.raises(v.ValidationError, match="allowed is a kernel cpulist such as 0-3,8,10-11"):
        v.cpulist(text)


def test_pci_selectors_are_the_modules_rules_normalized_as_sysfs_shows_them():
    from ansible_collections.gpunode.tuning.plugins.module_utils.core.pci import DeviceSelector

    assert vb.pci_id("10DE") == "0x10de" and vb.pci_id("0x2330") == "0x2330" and vb.pci_id("de") == "0x00de"
    # The same values setpci_mrrs selects with.
    sel = DeviceSelector(vendor="10DE", device="0x2330", class_prefixes=["0302"], bdfs=["41:00.0"])
    assert (sel.vendors, sel.device, sel.class_prefixes, sel.bdfs) == (
        [vb.pci_id("10DE")], vb.pci_id("0x2330"), ["0302"], ["0000:41:00.0"])
    # Several vendors: a device of any of them matches (NVIDIA's and AMD's GPUs in one selector).
    both = DeviceSelector(vendor=["10de", "0x1002"])
    assert both.vendors == ["0x10de", "0x1002"]
    assert both.matches({"bdf": "0000:41:00.0", "vendor": "0x1002", "device": "0x74a1", "class": "0x120000"})
    assert not both.matches({"bdf": "0000:41:00.0", "vendor": "0x15b3", "device": "0x1021", "class": "0x020000"})


@pytest.mark.parametrize("call,value,fragment", [
    (vb.pci_id, '10de" RUN+="/bin/x', "must be a 4-digit hex PCI id such as 10de or 0x10de"),
    (vb.pci_id, "10de0", "must be a 4-digit hex PCI id"),
    (vb.pci_id, "10de\nx", "must be a 4-digit hex PCI id"),
])
def test_pci_selectors_refuse(call, value, fragment):
    with pytest.raises(v.ValidationError) as exc:
        call(value)
    assert fragment in str(exc.value)


def test_validators_normalize_what_the_boot_files_get():
    assert v.cpulist("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(v.ValidationError, match="value must be"):
        vb.pci_id("")
    with pytest.raises(v.ValidationError, match="idle state name 'x\"; touch /tmp/x' is invalid: allowed is an idle "
                                                "state name"):
        v.cstate_names(["C2", 'x"; touch /tmp/x'])
    with pytest.raises(v.ValidationError, match="cpulist '0-3\\\\n8' is invalid"):
        v.cpulist("0-3\n8")
