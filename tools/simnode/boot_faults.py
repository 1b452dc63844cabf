"""Faults a simulated boot brings (a GPU that amd-smi no longer lists, new uncorrectable ECC errors)."""

from __future__ import annotations

import json
import os

from .amd import AMD_FAULTS, AMD_SMI_STATE
from .tree import Tree, read_rel

# GPU faults the next simulated boot brings (the post-reboot gate's tests): {kind: [GPU index, ...]}, the index in
# bus order among the GPUs amd-smi lists at that boot. Consumed by the boot (the faults stay, the file goes).
BOOT_FAULTS = "var/lib/simnode/boot-faults.json"
BOOT_FAULT_KINDS = {
    "ecc_uncorrectable": AMD_FAULTS["ecc_uncorrectable"],
    "missing": "the GPU stays on the PCI bus but amd-smi no longer lists it (list, static, metric, bad-pages, "
               "topology, xgmi -l)",
}


def write_boot_faults(root: str, faults: dict) -> str:
    """Place ``faults`` ({kind: [GPU index]}, BOOT_FAULT_KINDS) for the node's next simulated boot; return the file."""
    unknown = sorted(set(faults) - set(BOOT_FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown boot fault(s) {', '.join(unknown)}; available: {', '.join(BOOT_FAULT_KINDS)}")
    t = Tree(root)
    t.write(BOOT_FAULTS, json.dumps({k: sorted(set(v)) for k, v in faults.items()}))
    return t.path(BOOT_FAULTS)


def _drop_gpu(answers: dict, n: int, bdf: str) -> None:
    """Take GPU ``n`` (listing position, ``bdf``) out of every amd-smi answer, renumbering the others."""
    for key in ("list", "static", "metric", "bad_pages"):
        records = json.loads(answers[key])["gpu_data"]
        del records[n]
        for k, rec in enumerate(records):
            rec["gpu"] = k
        answers[key] = json.dumps({"gpu_data": records}, indent=4)
    topology = [e for e in json.loads(answers["topology"]) if e["bdf"] != bdf]
    for k, entry in enumerate(topology):
        entry["gpu"] = k
        entry["links"] = [link for link in entry["links"] if link["bdf"] != bdf]
        for m, link in enumerate(entry["links"]):
            link["gpu"] = m
    answers["topology"] = json.dumps(topology, indent=4)
    # xgmi -l: one row per GPU ("GPU<k>   <bdf>  <cell per other GPU>  X"); drop its row and its column.
    lines = answers["xgmi_link_status"].split("\n")
    rows = [line for line in lines if line.startswith("GPU")]
    kept, k = [], 0
    for row_no, row in enumerate(rows):
        words = row.split()
        if words[1] == bdf:
            continue
        cells = words[2:-1]
        del cells[n if n < row_no else n - 1]
        kept.append("GPU%d   %s  %s" % (k, words[1], "  ".join(cells + ["X"])))
        k += 1
    head = [line for line in lines if not line.startswith("GPU")]
    answers["xgmi_link_status"] = "\n".join(head[:2] + kept + head[2:])


def apply_boot_faults(root: str, check_only: bool = False) -> dict:
    """The GPU faults of BOOT_FAULTS, applied to the amd-smi stand-in's answers at this boot, then the file removed.

    Returns ``{"applied": {kind: [bdf]}}``, or ``{}`` without the file. A node without the amd-smi stand-in, an
    unknown kind or an index out of range is an error (ValueError): the test that placed the file is wrong.
    ``check_only``: only that check (the boot makes it before it changes anything).
    """
    t = Tree(root)
    text = read_rel(t, BOOT_FAULTS)
    if text is None:
        return {}
    faults = json.loads(text)
    unknown = sorted(set(faults) - set(BOOT_FAULT_KINDS))
    if unknown:
        raise ValueError(f"{BOOT_FAULTS}: unknown boot fault(s) {', '.join(unknown)}; "
                         f"available: {', '.join(BOOT_FAULT_KINDS)}")
    if read_rel(t, AMD_SMI_STATE) is None:
        raise ValueError(f"{BOOT_FAULTS}: the node has no amd-smi stand-in ({AMD_SMI_STATE}) for its GPU faults")
    state = json.loads(read_rel(t, AMD_SMI_STATE))
    answers = state["answers"]
    listed = [g["bdf"] for g in json.loads(answers["list"])["gpu_data"]]
    for kind, indices in faults.items():
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < len(listed)]
        if bad:
            raise ValueError(f"{BOOT_FAULTS}: {kind}: GPU index {bad[0]!r} is not one of 0..{len(listed) - 1}")
    if check_only:
        return {}
    applied: dict = {}
    metric = json.loads(answers["metric"])["gpu_data"]
    for i in faults.get("ecc_uncorrectable", ()):
        metric[i]["ecc"]["total_uncorrectable_count"] = 2
        metric[i]["ecc_blocks"]["UMC"]["uncorrectable_count"] = 2
        applied.setdefault("ecc_uncorrectable", []).append(listed[i])
    answers["metric"] = json.dumps({"gpu_data": metric}, indent=4)
    for i in sorted(faults.get("missing", ()), reverse=True):
        _drop_gpu(answers, i, listed[i])
        applied.setdefault("missing", []).insert(0, listed[i])
    t.write(AMD_SMI_STATE, json.dumps(state))
    os.remove(t.path(BOOT_FAULTS))
    return {"applied": applied}
