"""playbooks/verify.yml with the gpu_health family: a GPU at x8 of x16 with an Xid 79 fails its host.

One verify run (about 40 s on a quiet machine) over two simulated 8-GPU nodes: one sick (GPU 0 trained
at x8, Xid 79 in the kernel log), one healthy (same preset, with the node-local nvidia-smi stand-in).
"""

from __future__ import annotations

import json

import simnode
from support.inventory import write_inventory
from support.playbooks import run_playbook


def test_x8_link_and_xid79_fail_verification_and_the_report_names_the_gpu(tmp_path):
    roots = {"sick": str(tmp_path / "sick"), "healthy": str(tmp_path / "healthy")}
    info = simnode.build(roots["sick"], "audited-epyc-8gpu", cpus=4, gpu_faults={"x8": [0], "xid79": [0]})
    simnode.build(roots["healthy"], "audited-epyc-8gpu", cpus=4, nvidia_smi=True)
    bdf = info["gpu_bdfs"][0]
    reports = tmp_path / "reports"
    proc = run_playbook("verify.yml", write_inventory(tmp_path / "inv.yml", roots, reports))
    assert proc.returncode != 0, proc.stdout[-3000:]

    sick = json.loads((reports / "sick.json").read_text())
    rows = {s["name"]: s for s in sick["settings"] if s["family"] == "gpu_health"}
    assert sick["status"] == "fail"
    assert rows["link_width"]["state"] == "drifted" and rows["xid"]["state"] == "drifted"
    text = (reports / "sick.md").read_text()
    assert "%s link x8 of x16" % bdf in text
    assert "Xid 79 GPU has fallen off the bus (1x on %s)" % bdf in text

    healthy = json.loads((reports / "healthy.json").read_text())
    link = {s["name"]: s for s in healthy["settings"] if s["family"] == "gpu_health"}
    assert link["link_width"]["state"] == "applied" and link["xid"]["state"] == "applied"
    assert " link x8 " not in (reports / "healthy.md").read_text()
