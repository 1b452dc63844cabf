"""nvidia-smi topo -m and topo -p2p as other people captured them (tests/data/real/smi-topo-*).

Real output has the quirks a stand-in never had: drivers 590-610 underline the header row with ANSI
escapes even into a pipe, pastes turn the tabs into spaces or indent the matrix, P2P rows start with a
space and end with a tab, NIC rows and columns follow the GPUs, older drivers print no NUMA columns.
Each test asserts what a person reading the capture sees: how many GPUs, and each pair's link or verdict.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpunode.tuning.plugins.module_utils.core import nvidia_smi
from ansible_collections.gpunode.tuning.plugins.module_utils.families import gpu_p2p as p2p


def links(text):
    return {(link["a"], link["b"]): link["link"] for link in nvidia_smi.parse_topology(text)["links"]}


@pytest.mark.parametrize("name", ["smi-topo-m-h100-590.48.01.txt", "smi-topo-m-l40s-595.80.txt",
                                  "smi-topo-m-rtx2080s-610.57.04.txt"])
def test_the_ansi_underlined_header_of_drivers_590_to_610_is_still_the_header(real, name):
    text = real(name).text
    assert text.startswith("\t\x1b[4mGPU0\t")  # the escape is in the real capture, into a file
    topo = nvidia_smi.parse_topology(text)
    assert topo == {"gpus": ["GPU0"], "links": []}


def test_five_gpus_behind_an_ansi_header_keep_every_pair_derived(real):
    capture = real("smi-topo-m-ansi-5gpu-derived.txt")
    assert capture.meta["source"].startswith("DERIVED")
    topo = nvidia_smi.parse_topology(capture.text)
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3", "GPU4"] and len(topo["links"]) == 10
    assert links(capture.text)[("GPU3", "GPU4")] == "PHB" and links(capture.text)[("GPU0", "GPU4")] == "NODE"
    # The same matrix without the escapes, as posted: the same answer.
    assert nvidia_smi.parse_topology(real("smi-topo-m-node-5gpu-aikitoria-13.txt").text) == topo


def test_eight_gpus_behind_switches_with_a_nic_column(real):
    text = real("smi-topo-m-8gpu-mlx5-quda-669.txt").text
    topo = nvidia_smi.parse_topology(text)
    assert topo["gpus"] == ["GPU%d" % i for i in range(8)] and len(topo["links"]) == 28
    got = links(text)
    assert got[("GPU0", "GPU1")] == "PIX" and got[("GPU0", "GPU2")] == "PXB" and got[("GPU3", "GPU4")] == "SYS"
    assert got[("GPU6", "GPU7")] == "PIX"
    assert "mlx5_0" not in {n for pair in got for n in pair}  # the NIC row and column are not GPU pairs


def test_sixteen_nvlinked_gpus_pasted_with_spaces(real):
    text = real("smi-topo-m-16gpu-nv6-nccl-tests-78.txt").text
    topo = nvidia_smi.parse_topology(text)
    assert topo["gpus"] == ["GPU%d" % i for i in range(16)]
    got = links(text)
    assert got[("GPU0", "GPU15")] == "NV6" and got[("GPU3", "GPU10")] == "NV6"
    # The paste stops after GPU3's row: the pairs of later rows are known only from the earlier rows' columns.
    assert ("GPU4", "GPU5") not in got and len(got) == 15 + 14 + 13 + 12


@pytest.mark.parametrize("name, gpus, pair, link", [
    ("smi-topo-m-4gpu-phb-spaces-aikitoria-1.txt", 4, ("GPU0", "GPU3"), "PHB"),
    ("smi-topo-m-2gpu-sys-l4-cuda-samples-284.txt", 2, ("GPU0", "GPU1"), "SYS"),
    ("smi-topo-m-phb-rtx5090-club3090-1229.txt", 2, ("GPU0", "GPU1"), "PHB"),
    ("smi-topo-m-8gpu-pix-node-sys-nccl-1817.txt", 8, ("GPU2", "GPU3"), "PIX"),
])
def test_pastes_with_tabs_or_spaces_and_numa_columns(real, name, gpus, pair, link):
    text = real(name).text
    assert len(nvidia_smi.parse_topology(text)["gpus"]) == gpus
    assert links(text)[pair] == link


def test_a_geforce_pair_is_gpu_not_supported_tabs_and_pasted_spaces_alike(real):
    for name in ("smi-topo-p2p-rw-gns-rtx5090-club3090-1229.txt", "smi-topo-p2p-rw-gns-spaces-club3090-1130.txt"):
        parsed = nvidia_smi.parse_p2p(real(name).text)
        assert parsed["gpus"] == ["GPU0", "GPU1"]
        assert [(p["a"], p["b"], p["status"], p["meaning"]) for p in parsed["pairs"]] == [
            ("GPU0", "GPU1", "GNS", "GPU not supported"), ("GPU1", "GPU0", "GNS", "GPU not supported")]


def test_five_gpus_all_ok(real):
    parsed = nvidia_smi.parse_p2p(real("smi-topo-p2p-p-ok-5gpu-aikitoria-13.txt").text)
    assert parsed["gpus"] == ["GPU%d" % i for i in range(5)] and len(parsed["pairs"]) == 20
    assert parsed["not_ok"] == []


def test_the_real_legend_has_dr_and_every_code_is_known(real):
    legend = nvidia_smi.parse_legend(real("smi-topo-p2p-rw-gns-rtx5090-club3090-1229.txt").text)
    assert legend["DR"] == "Disabled by regkey"
    assert set(legend) == set(nvidia_smi.P2P_LEGEND)
    # Our table says what the driver's legend says (in lower case; "Status Ok" is "ok", "Self" is "self").
    for code, meaning in legend.items():
        assert nvidia_smi.P2P_LEGEND[code].lower() == {"OK": "ok"}.get(code, meaning.lower())


def smi(read, write):
    def answer(text):
        return {"rc": 0, "stdout": text, "stderr": ""}
    query = "0, 00000000:01:00.0, Enabled\n1, 00000000:41:00.0, Enabled\n"
    return {"probe": "present", "query": answer(query), "p2p_read": answer(read), "p2p_write": answer(write)}


def test_a_cns_pair_fails_naming_both_gpus_derived(real):
    capture = real("smi-topo-p2p-rw-cns-derived-from-club3090-1229.txt")
    assert capture.meta["source"].startswith("DERIVED")
    rows = p2p.pair_rows({}, smi(capture.text, capture.text))
    assert [r["name"] for r in rows] == ["GPU0-GPU1"] and rows[0]["state"] == "drifted"
    assert "GPU0 (0000:01:00.0) and GPU1 (0000:41:00.0)" in rows[0]["reason"]
    assert "read GPU0->GPU1 CNS (chipset not supported)" in rows[0]["reason"]


def test_an_ansi_header_on_topo_p2p_still_finds_the_broken_pair_derived(real):
    text = real("smi-topo-p2p-ansi-cns-derived.txt").text
    assert "\x1b[4m" in text
    rows = p2p.pair_rows({}, smi(text, text))
    # Before the escapes were stripped the header was lost and the node read as "fewer than 2 GPUs".
    assert [r["state"] for r in rows] == ["drifted"] and "not_applicable" not in [r["state"] for r in rows]


def test_an_all_ok_real_matrix_is_one_applied_row(real):
    ok = real("smi-topo-p2p-p-ok-5gpu-aikitoria-13.txt").text
    five = "".join("%d, 00000000:%02x:00.0, Enabled\n" % (i, 0x41 + i) for i in range(5))
    probe = smi(ok, ok)
    probe["query"]["stdout"] = five
    rows = p2p.pair_rows({}, probe)
    assert [(r["name"], r["state"]) for r in rows] == [("pairs", "applied")]
    assert rows[0]["running"] == "read OK, write OK on all 10 pairs of 5 GPUs"
