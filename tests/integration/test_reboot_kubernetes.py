"""The persistent rollout's reboot sequence with ``gpunode_tuning_drain=kubernetes`` against an API stand-in over HTTP.

No API server can be installed here, so tests/support/kubeapi.py serves the calls a drain of Nodes makes (API
discovery, nodes, pods, evictions) on loopback, with a kubeconfig pointing at it: the backend's Python
``kubernetes`` client loads that kubeconfig and talks HTTP to it, as it would to a cluster. The first test checks
the stand-in against kubernetes.core's own k8s_info and k8s_drain (the modules whose calls it serves).

A watcher thread turns each simulated reboot (a new boot id in the root) into the node's reboot as the API shows
it: Ready goes Unknown, then True with a new status.nodeInfo.bootID.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import simnode
from support.checkout import REPO, VENV_BIN, ansible_env
from support.inventory import write_inventory
from support.kubeapi import KubeApiStandIn
from support.nodes import BootWatcher

HOSTS = ["k1", "k2", "k3", "k4"]
NEEDS_REBOOT = "audited-epyc-8gpu"  # acpi-cpufreq: amd_pstate=active is left pending
NO_REBOOT = "epyc-pstate-epp"
ANNOTATION = "gpunode.tuning/drain"
DRIVER = "sys/devices/system/cpu/cpufreq/policy0/scaling_driver"


def boot_watcher(api, roots):
    """Reboots a node in the API stand-in when its simulated root gets a new boot id."""
    return BootWatcher(roots, lambda host: api.reboot(host, down_seconds=1.0))


@pytest.fixture
def api(tmp_path, request):
    """The stand-in; ``@pytest.mark.parametrize("api", [skew], indirect=True)`` sets its clock apart."""
    with KubeApiStandIn(HOSTS, tmp_path, skew=getattr(request, "param", 0.0)) as standin:
        yield standin


def build_fleet(tmp_path, api, presets, **common):
    roots = {}
    for host in HOSTS:
        roots[host] = str(tmp_path / host)
        simnode.build(roots[host], presets.get(host, NO_REBOOT), cpus=2, gpus=1)
    reports = tmp_path / "reports"
    inventory = write_inventory(
        tmp_path / "hosts.yml", roots, report_dir=reports, gpunode_tuning_reboot_ok=True,
        gpunode_tuning_drain="kubernetes", gpunode_tuning_drain_kubeconfig=api.kubeconfig,
        gpunode_tuning_reboot_poll_interval=0.3, **common)
    return roots, inventory, reports


def rollout(inventory, reports):
    cmd = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", "rollout.yml"),
           "-f", "8", "-e", "gpunode_tuning_rollout_flow=persistent", "-e", "gpunode_tuning_rollout_canary=0",
           "-e", "gpunode_tuning_rollout_batch=100%"]
    env = ansible_env()
    env.pop("KUBECONFIG", None)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400, check=False)
    path = os.path.join(reports, "rollout-summary.json")
    with open(path, encoding="utf-8") as fh:
        summary = json.load(fh)
    return proc, {r["host"]: r for r in summary["results"]}, summary


def cordons(api, node):
    """``[(when, unschedulable, annotation)]`` of every cordon and uncordon (a PATCH of spec) of ``node`` the stand-in
    received (not the claim's renewals, which PATCH one annotation only)."""
    out = []
    for request in api.requests("PATCH", "/api/v1/nodes/" + node):
        body = request["body"]
        if "spec" not in body:
            continue
        out.append((request["at"], body["spec"].get("unschedulable"),
                    (body.get("metadata") or {}).get("annotations", {}).get(ANNOTATION)))
    return out


def evictions(api, pod):
    return [r["at"] for r in api.requests("POST", "/api/v1/namespaces/default/pods/%s/eviction" % pod)]


def driver(root):
    with open(os.path.join(root, DRIVER), encoding="ascii") as fh:
        return fh.read().strip()


def test_the_stand_in_answers_kubernetes_core_k8s_info_and_k8s_drain(api, tmp_path):
    """kubernetes.core's modules (discovery through the dynamic client, then CoreV1Api) work against the stand-in:
    k8s_info reads a Node, k8s_drain cordons, evicts the pods (not the DaemonSet's) and waits for them to go,
    and uncordons."""
    api.add_pod("k1", "web-1")
    api.add_pod("k1", "agent-1", daemonset=True)
    playbook = tmp_path / "k8s.yml"
    playbook.write_text(json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"kubernetes.core.k8s_info": {"kind": "Node", "name": "k1", "kubeconfig": api.kubeconfig},
         "register": "info"},
        {"ansible.builtin.assert": {"that": ["info.resources | length == 1",
                                             "info.resources[0].status.nodeInfo.bootID | length > 0"]}},
        {"kubernetes.core.k8s_drain": {"name": "k1", "state": "drain", "kubeconfig": api.kubeconfig,
                                       "delete_options": {"ignore_daemonsets": True, "wait_timeout": 20,
                                                          "wait_sleep": 1}}},
        {"kubernetes.core.k8s_drain": {"name": "k1", "state": "uncordon", "kubeconfig": api.kubeconfig}},
    ]}]), encoding="utf-8")
    env = ansible_env(ANSIBLE_LOCALHOST_WARNING="0")
    env.pop("KUBECONFIG", None)
    proc = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + os.path.join(VENV_BIN, "python"), str(playbook)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    paths = {r["path"] for r in api.requests("GET")}
    assert {"/version", "/apis", "/api/v1"} <= paths, paths  # the dynamic client discovered the API
    assert evictions(api, "web-1") and not evictions(api, "agent-1")
    assert api.pods_on("k1") == ["agent-1"]
    assert [c[1] for c in cordons(api, "k1")] == [True, False]
    assert "unschedulable" not in api.node("k1")["spec"]


def test_a_rollout_cordons_evicts_reboots_and_uncordons_through_the_api(api, tmp_path):
    """max_unavailable 1; k1 and k2 need a reboot, k3 and k4 do not. Each of k1, k2 is cordoned with our
    annotation, its pods evicted (not the DaemonSet's, not a finished one) before its reboot, comes back Ready with
    a new bootID and is uncordoned after its gate; never both cordoned at once; k3 and k4 are never touched."""
    roots, inventory, reports = build_fleet(tmp_path, api, {"k1": NEEDS_REBOOT, "k2": NEEDS_REBOOT})
    for node in HOSTS:
        api.add_pod(node, "web-%s" % node)
    api.add_pod("k1", "agent-k1", daemonset=True)
    api.add_pod("k1", "job-k1", phase="Succeeded")
    boot_before = {n: api.node(n)["status"]["nodeInfo"]["bootID"] for n in HOSTS}
    with boot_watcher(api, roots) as watcher:
        proc, results, _summary = rollout(inventory, reports)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert sorted(watcher.rebooted) == ["k1", "k2"]
    intervals = []
    for node in ("k1", "k2"):
        patches = cordons(api, node)
        assert [p[1] for p in patches] == [True, False], patches
        (cordoned_at, _on, reason), (uncordoned_at, _off, cleared) = patches
        assert reason.startswith("gpunode.tuning: reboot for amd_pstate=active"), reason
        assert "{claim run=" in reason and " lease=" in reason, reason  # issue 42: the annotation is a claim
        renewals = [r for r in api.requests("PATCH", "/api/v1/nodes/" + node) if "spec" not in r["body"]]
        assert renewals and all(list(r["body"]["metadata"]["annotations"]) == ["gpunode.tuning/renewed"]
                                and r["query"]["fieldManager"] == ["gpunode.tuning"] for r in renewals), renewals
        assert cleared is None and ANNOTATION in api.requests("PATCH", "/api/v1/nodes/" + node)[-1]["body"][
            "metadata"]["annotations"]  # the uncordon removes our annotation (a null in the merge patch)
        evicted = evictions(api, "web-" + node)
        assert evicted and cordoned_at < evicted[0] < watcher.when[node] < uncordoned_at, (node, evicted)
        intervals.append((cordoned_at, uncordoned_at))
        after = api.node(node)
        assert after["status"]["nodeInfo"]["bootID"] != boot_before[node]
        assert [c["status"] for c in after["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
        assert "unschedulable" not in after["spec"] and ANNOTATION not in after["metadata"]["annotations"]
        assert results[node]["status"] == "done" and results[node]["reboot"]["returned"], results[node]
        assert driver(roots[node]) == "amd-pstate-epp"
    assert intervals[0][1] < intervals[1][0] or intervals[1][1] < intervals[0][0], intervals  # the budget of 1
    assert not evictions(api, "agent-k1") and not evictions(api, "job-k1")
    assert api.pods_on("k1") == ["agent-k1", "job-k1"]
    for node in ("k3", "k4"):
        assert cordons(api, node) == [] and api.pods_on(node) == ["web-" + node]
        assert api.node(node)["status"]["nodeInfo"]["bootID"] == boot_before[node]
        assert results[node]["reboot"] is None and results[node]["status"] == "done"


def test_a_pod_disruption_budget_keeps_the_host_cordoned_and_stops_the_run(api, tmp_path):
    """k1's pod is protected by a PodDisruptionBudget (every eviction answered 429): the drain times out, k1 stays
    cordoned with our annotation, its failure names the PodDisruptionBudget, nothing reboots, and k2 (waiting for
    the slot) is never cordoned."""
    roots, inventory, reports = build_fleet(tmp_path, api, {"k1": NEEDS_REBOOT, "k2": NEEDS_REBOOT},
                                            gpunode_tuning_drain_timeout=3)
    api.add_pod("k1", "db-k1", protected=True)
    with boot_watcher(api, roots) as watcher:
        proc, results, _summary = rollout(inventory, reports)
    assert proc.returncode != 0
    assert watcher.rebooted == []
    assert len(evictions(api, "db-k1")) >= 2  # asked again at each poll until the timeout
    k1 = api.node("k1")
    assert k1["spec"].get("unschedulable") is True
    assert k1["metadata"]["annotations"][ANNOTATION].startswith("gpunode.tuning: the drain did not finish within 3 s")
    reboot = results["k1"]["reboot"]
    assert reboot["stays_drained"] and reboot["stage"] == "drain", reboot
    assert "PodDisruptionBudget" in reboot["msg"] and "db-k1" in reboot["msg"], reboot["msg"]
    assert api.pods_on("k1") == ["db-k1"]
    assert cordons(api, "k2") == [] and "unschedulable" not in api.node("k2")["spec"]
    assert results["k2"]["status"] == "failed" and not results["k2"]["reboot"].get("rebooted"), results["k2"]
    assert driver(roots["k2"]) == "acpi-cpufreq"  # tuned, its reboot pending


def test_a_node_cordoned_by_someone_else_is_out_of_service_and_never_uncordoned(api, tmp_path):
    """max_unavailable 2 and k3 cordoned by an operator (kubectl cordon, no annotation of ours): k3 is
    out_of_service (not tuned, never patched by the run, still cordoned at the end) and holds one slot, so k1 and
    k2 reboot one at a time; the run exits non-zero naming k3."""
    roots, inventory, reports = build_fleet(tmp_path, api, {"k1": NEEDS_REBOOT, "k2": NEEDS_REBOOT},
                                            gpunode_tuning_reboot_max_unavailable=2)
    api.cordon("k3")
    with boot_watcher(api, roots) as watcher:
        proc, results, summary = rollout(inventory, reports)
    assert proc.returncode != 0
    assert "k3" in proc.stdout and "out of service" in proc.stdout
    assert results["k3"]["status"] == "out_of_service" and "cordoned" in results["k3"]["reason"], results["k3"]
    assert summary["counts"]["out_of_service"] == 1
    assert cordons(api, "k3") == [] and api.node("k3")["spec"]["unschedulable"] is True
    assert not os.path.exists(os.path.join(roots["k3"], "etc/gpunode-tuning/desired.json"))  # not tuned
    assert sorted(watcher.rebooted) == ["k1", "k2"]
    first, second = sorted((cordons(api, n)[0][0], cordons(api, n)[-1][0]) for n in ("k1", "k2"))
    assert first[1] < second[0], (first, second)  # k3 held one of the two slots
    for node in ("k1", "k2"):
        assert results[node]["status"] == "done", results[node]
        assert "unschedulable" not in api.node(node)["spec"]


@pytest.mark.parametrize("api", [-7200.0], indirect=True)
def test_a_node_another_live_run_claims_is_never_touched_and_holds_the_budget(api, tmp_path):
    """Issue 42: k1 is cordoned by another run on another controller (its claim in our annotation, lease 600 s,
    stamped by the API server just now); the API server's clock is two hours behind this machine's, so a lease judged
    by the controller's clock would look long expired. Budget 1: k1 holds the slot, so k2 (needing a reboot too)
    waits and is never cordoned; k1 is never patched, rebooted or uncordoned by this run, and says whose it is."""
    roots, inventory, reports = build_fleet(tmp_path, api, {"k1": NEEDS_REBOOT, "k2": NEEDS_REBOOT},
                                            gpunode_tuning_reboot_wait_timeout=3)
    other = ("gpunode.tuning: reboot for amd_pstate=active "
             "{claim run=run-b ctl=other-controller start=1700000000 lease=600}")
    api.cordon("k1", {ANNOTATION: other}, manager="gpunode.tuning")
    with boot_watcher(api, roots) as watcher:
        proc, results, _summary = rollout(inventory, reports)
    assert proc.returncode != 0
    assert watcher.rebooted == []
    assert api.requests("PATCH", "/api/v1/nodes/k1") == []  # never cordoned again, renewed or uncordoned
    k1 = api.node("k1")
    assert k1["spec"]["unschedulable"] is True and k1["metadata"]["annotations"][ANNOTATION] == other
    assert "claimed by the live run run-b on other-controller" in results["k1"]["reboot"]["msg"], results["k1"]
    assert results["k1"]["status"] == "failed" and not results["k1"]["reboot"].get("rebooted")
    assert cordons(api, "k2") == [] and "unschedulable" not in api.node("k2")["spec"]  # k1 held the only slot
    assert "waited" in results["k2"]["reboot"]["msg"] and "k1" in results["k2"]["reboot"]["msg"], results["k2"]
