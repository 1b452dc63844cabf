"""The kubernetes drain backend against a fake CoreV1Api (objects shaped like the client's V1Node/V1Pod)."""

import datetime
from email.utils import formatdate
from types import SimpleNamespace as NS

import pytest
from support.clock import Clock

from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import kubernetes as dk


class ApiError(Exception):
    def __init__(self, status, body=""):
        super().__init__(status)
        self.status, self.reason, self.body = status, "Too Many Requests", body


def node(name, unschedulable=False, ready=True, annotations=None, boot="b1"):
    return NS(metadata=NS(name=name, annotations=annotations),
              spec=NS(unschedulable=unschedulable),
              status=NS(conditions=[NS(type="Ready", status="True" if ready else "False")], node_info=NS(boot_id=boot)))


class FakeApi:
    """``now``: the API server's clock (seconds since the epoch), apart from the test's: it stamps our field
    manager's managedFields entry when a PATCH changes a value, and answers the list's Date header."""

    def __init__(self, nodes, pods=None, pdb=(), now=1_000_000_000):
        self.nodes = {n.metadata.name: n for n in nodes}
        self.pods = pods or {}
        self.pdb = set(pdb)
        self.calls = []
        self.now = now

    def list_node_with_http_info(self, _request_timeout=None, _return_http_data_only=None):
        assert _return_http_data_only is False
        return self.list_node(), 200, {"Date": formatdate(self.now, usegmt=True)}

    def stamp(self, name, manager="gpunode.tuning"):
        entry = NS(manager=manager, operation="Update", subresource=None,
                   time=datetime.datetime.fromtimestamp(self.now, datetime.UTC))
        meta = self.nodes[name].metadata
        meta.managed_fields = [e for e in (getattr(meta, "managed_fields", None) or []) if e.manager != manager]
        meta.managed_fields.append(entry)

    def list_node(self, _request_timeout=None, label_selector=None):
        if label_selector:  # "key=value"
            key, value = label_selector.split("=", 1)
            return NS(items=[n for n in self.nodes.values() if (getattr(n.metadata, "labels", None) or {}).get(key)
                             == value])
        return NS(items=list(self.nodes.values()))

    def read_node(self, name, _request_timeout=None):
        return self.nodes[name]

    def patch_node(self, name, body, _request_timeout=None, field_manager=None):
        self.calls.append(("patch", name, body))
        n = self.nodes[name]
        before = (n.spec.unschedulable, dict(n.metadata.annotations or {}))
        if "spec" in body:
            n.spec.unschedulable = body["spec"]["unschedulable"]
        ann = dict(n.metadata.annotations or {})
        for k, v in body["metadata"]["annotations"].items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        n.metadata.annotations = ann
        if field_manager and (n.spec.unschedulable, ann) != before:  # the server stamps a changed value only
            self.stamp(name, field_manager)

    def list_pod_for_all_namespaces(self, field_selector, _request_timeout=None):
        name = field_selector.split("=", 1)[1]
        return NS(items=list(self.pods.get(name, [])))

    def create_namespaced_pod_eviction(self, name, namespace, body, _request_timeout=None):
        self.calls.append(("evict", name))
        if name in self.pdb:
            raise ApiError(429, "Cannot evict pod as it would violate the pod's disruption budget.")
        for pods in self.pods.values():
            pods[:] = [p for p in pods if p.metadata.name != name]


def pod(name, daemonset=False):
    owners = [NS(kind="DaemonSet")] if daemonset else [NS(kind="ReplicaSet")]
    return NS(metadata=NS(name=name, namespace="default", owner_references=owners), status=NS(phase="Running"))


def backend(api):
    return dk.KubernetesBackend({"a": "a", "b": "b", "c": "node-c"}, api=api, error=RuntimeError)


def test_states_count_cordoned_and_not_ready_and_know_our_annotation():
    api = FakeApi([node("a", unschedulable=True), node("b", ready=False),
                   node("node-c", unschedulable=True, annotations={dk.ANNOTATION: "gpunode.tuning: kernel args"})])
    got = backend(api).states(["a", "b", "c"])
    assert got["out_of_service"] == ["a", "b", "c"]
    assert got["ours"] == ["c"]
    assert "cordoned" in got["why"]["a"] and "not Ready" in got["why"]["b"]


def test_a_node_briefly_unknown_is_transient_and_the_fleet_is_the_selectors_nodes():
    """Issue 42: Ready ``Unknown`` (the node controller has not heard from the kubelet lately) is asked again
    before the run, not judged on one reading; the fleet scope counts the selector's nodes out of service."""
    unknown = node("b")
    unknown.status.conditions = [NS(type="Ready", status="Unknown")]
    other = node("gpu-9", unschedulable=True)
    other.metadata.labels = {"fleet": "a100"}
    peer = node("a")
    peer.metadata.labels = {"fleet": "a100"}
    api = FakeApi([peer, unknown, node("node-c"), other])
    got = dk.KubernetesBackend({"a": "a", "b": "b", "c": "node-c"}, api=api, error=RuntimeError,
                               fleet_selector="fleet=a100").states(["a", "b", "c"])
    assert got["transient"] == ["b"] and got["out_of_service"] == ["b"]
    assert got["fleet"] == {"gpu-9": "cordoned (spec.unschedulable)"} and got["fleet_size"] == 4
    assert backend(api).states(["a", "b", "c"])["fleet"] == {}  # no selector: the run's nodes


def test_drain_evicts_all_but_daemonsets_and_undrain_removes_our_mark():
    api = FakeApi([node("a")], pods={"a": [pod("web"), pod("ds", daemonset=True)]})
    b = backend(api)
    b.drain("a", "gpunode.tuning: x")
    assert api.nodes["a"].spec.unschedulable is True
    assert b.drained("a") is False  # evicted this poll
    assert b.drained("a") is True
    assert ("evict", "ds") not in api.calls
    b.undrain("a")
    assert api.nodes["a"].spec.unschedulable is False
    assert dk.ANNOTATION not in api.nodes["a"].metadata.annotations


def test_someone_elses_cordon_is_never_undone():
    api = FakeApi([node("a", unschedulable=True)])
    backend(api).undrain("a")
    assert api.nodes["a"].spec.unschedulable is True and not api.calls


def test_pdb_blocked_eviction_is_named():
    api = FakeApi([node("a")], pods={"a": [pod("db")]}, pdb={"db"})
    b = backend(api)
    b.drain("a", "gpunode.tuning: x")
    assert b.drained("a") is False
    assert "PodDisruptionBudget" in b.blocked["a"] and "default/db" in b.blocked["a"]


def test_ready_needs_a_new_boot_id():
    api = FakeApi([node("a", boot="b1")])
    b = backend(api)
    mark = b.boot_mark("a")
    assert b.ready("a", mark) is False
    api.nodes["a"].status.node_info.boot_id = "b2"
    assert b.ready("a", mark) is True


def test_missing_client_is_a_clear_error(monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "kubernetes":
            raise ImportError("No module named 'kubernetes'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(RuntimeError, match="Python 'kubernetes' client"):
        dk.KubernetesBackend({"a": "a"}, error=RuntimeError)


# --- the claim (issue 42) ---------------------------------------------------------------------------------------

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot  # noqa: E402

OURS = reboot.claim_of("run-a", "ctl-a", 1_000_000, 600)
OTHER = reboot.claim_of("run-b", "ctl-b", 1_000_000, 600)


def claiming(api, claim=None):
    return dk.KubernetesBackend({"a": "a", "b": "b", "c": "node-c"}, api=api, error=RuntimeError,
                                claim=OURS if claim is None else claim)


def claimed_node(api, name, claim=None, age=0):
    """``name`` cordoned by another run's claim, the server's stamp ``age`` seconds before its now."""
    api.nodes[name].spec.unschedulable = True
    reason = reboot.claimed_reason("gpunode.tuning: reboot", OTHER if claim is None else claim)
    api.nodes[name].metadata.annotations = {dk.ANNOTATION: reason}
    api.now -= age
    api.stamp(name)
    api.now += age


def test_the_annotation_names_the_run_and_its_lease_and_the_server_stamps_it():
    api = FakeApi([node("a")])
    b = claiming(api)
    b.drain("a", "gpunode.tuning: reboot for amd_pstate=active")
    text = api.nodes["a"].metadata.annotations[dk.ANNOTATION]
    assert reboot.parse_claim(text) == OURS and text.startswith("gpunode.tuning: reboot for amd_pstate=active")
    assert api.calls[-1][2]["spec"] == {"unschedulable": True}
    assert dk.stamped(api.nodes["a"]) == api.now


def test_another_live_runs_claim_is_claimed_by_the_servers_clock_never_ours():
    """Another run's claim, stamped 500 s before the server's now (lease 600): claimed, out of service, not ours;
    the test's own clock (years after the server's) plays no part."""
    api = FakeApi([node("a"), node("b")])
    claimed_node(api, "a", age=500)
    got = claiming(api).states(["a", "b"])
    assert got["claimed"] == {"a": "claimed by the live run run-b on ctl-b (renewed 500 s ago, lease 600 s)"}
    assert got["out_of_service"] == ["a"] and got["ours"] == []


def test_an_expired_claim_is_ours_to_adopt():
    api = FakeApi([node("a")])
    claimed_node(api, "a", age=601)
    got = claiming(api).states(["a"])
    assert got["claimed"] == {} and got["ours"] == ["a"]


def test_a_claim_without_a_server_stamp_or_date_counts_as_live():
    api = FakeApi([node("a")])
    claimed_node(api, "a")
    api.nodes["a"].metadata.managed_fields = [NS(manager="kubectl-annotate", operation="Update", subresource=None,
                                                 time="2001-09-09T01:46:40Z")]
    assert "a" in claiming(api).states(["a"])["claimed"]  # only our field manager's stamp counts


def test_renew_patches_only_the_renewal_annotation_and_the_server_restamps():
    api = FakeApi([node("a")])
    b = claiming(api)
    b.drain("a", "gpunode.tuning: reboot")
    api.now += 300
    b.renew("a")  # within a third of the lease: nothing
    assert len(api.calls) == 1
    b.renew("a", force=True)
    body = api.calls[-1][2]
    assert "spec" not in body and list(body["metadata"]["annotations"]) == [dk.RENEWED]  # never cordoned again
    assert dk.stamped(api.nodes["a"]) == api.now
    api.now += 500
    assert claiming(api, OTHER).states(["a"])["claimed"]  # 500 s after the renewal: still live for another run


def test_renew_leaves_a_node_whose_claim_is_no_longer_ours():
    api = FakeApi([node("a")])
    b = claiming(api)
    b.drain("a", "gpunode.tuning: reboot")
    claimed_node(api, "a")
    calls = len(api.calls)
    b.renew("a", force=True)
    assert len(api.calls) == calls


def test_holds_rereads_the_node_and_another_runs_claim_ends_ours():
    api = FakeApi([node("a")])
    b = claiming(api)
    b.drain("a", "gpunode.tuning: reboot")
    assert b.holds("a") is None
    claimed_node(api, "a")
    with pytest.raises(dk.ClaimLost) as lost:
        b.holds("a")
    assert lost.value.by_run
    with pytest.raises(dk.ClaimLost):
        b.drained("a")


def test_an_uncordoned_node_ends_our_claim_and_is_not_evicted():
    api = FakeApi([node("a")], pods={"a": [pod("web")]})
    b = claiming(api)
    b.drain("a", "gpunode.tuning: reboot")
    api.nodes["a"].spec.unschedulable = False
    with pytest.raises(dk.ClaimLost) as lost:
        b.drained("a")
    assert not lost.value.by_run and ("evict", "web") not in api.calls


def test_another_runs_claim_is_never_uncordoned_ours_is():
    api = FakeApi([node("a"), node("b")])
    claimed_node(api, "a")
    b = claiming(api)
    with pytest.raises(dk.ClaimLost):
        b.undrain("a")
    assert api.nodes["a"].spec.unschedulable is True and not api.calls
    b.drain("b", "gpunode.tuning: reboot")
    b.undrain("b")
    assert api.nodes["b"].spec.unschedulable is False
    assert not {dk.ANNOTATION, dk.RENEWED} & set(api.nodes["b"].metadata.annotations)


def test_the_date_header_is_read_in_any_case_and_timezone():
    assert dk.http_date({"date": "Sun, 09 Sep 2001 01:46:40 GMT"}) == 1_000_000_000
    assert dk.http_date({"Content-Type": "application/json"}) is None


def test_the_sequence_waits_for_another_live_runs_node_counts_it_and_adopts_it_once_expired(tmp_path):
    """Through the sequence (survey, take_slot): another live run's node is claimed, never cordoned by this run, and
    holds a slot of the budget; once its lease ran out by the API server's clock, it is ours (adopted)."""
    from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot_sequence as seq

    api = FakeApi([node("a"), node("b")])
    claimed_node(api, "a")
    mine, records = claiming(api), seq.Records(str(tmp_path), OURS["run"])
    assert "a" in seq.survey(mine, ["a", "b"], records, {"claim_lease": 600})["claimed"]
    base = {"max_unavailable": 1, "wait_timeout": 1, "drain_timeout": 5, "reboot_timeout": 5, "poll": 0.01}
    clock = Clock()
    got = seq.take_slot(mine, records, "b", ["a", "b"], base, False, sleep=clock.sleep, clock=clock)
    assert not got["taken"] and "out of service or starting now (a)" in got["why"], got["why"]  # a holds the slot
    clock = Clock()
    got = seq.take_slot(mine, records, "a", ["a", "b"], dict(base, max_unavailable=2), False, sleep=clock.sleep,
                        clock=clock)
    assert not got["taken"] and "claimed by the live run run-b on ctl-b" in got["why"]
    assert not api.calls  # never cordoned, patched or uncordoned
    api.now += 601
    assert seq.survey(mine, ["a", "b"], records, {"claim_lease": 600})["ours"] == ["a"]
