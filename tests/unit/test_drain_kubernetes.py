"""The kubernetes drain backend against a fake CoreV1Api (objects shaped like the client's V1Node/V1Pod)."""

from types import SimpleNamespace as NS

import pytest

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
    def __init__(self, nodes, pods=None, pdb=()):
        self.nodes = {n.metadata.name: n for n in nodes}
        self.pods = pods or {}
        self.pdb = set(pdb)
        self.calls = []

    def list_node(self, _request_timeout=None, label_selector=None):
        if label_selector:  # "key=value"
            key, value = label_selector.split("=", 1)
            return NS(items=[n for n in self.nodes.values() if (getattr(n.metadata, "labels", None) or {}).get(key)
                             == value])
        return NS(items=list(self.nodes.values()))

    def read_node(self, name, _request_timeout=None):
        return self.nodes[name]

    def patch_node(self, name, body, _request_timeout=None):
        self.calls.append(("patch", name, body))
        n = self.nodes[name]
        n.spec.unschedulable = body["spec"]["unschedulable"]
        ann = dict(n.metadata.annotations or {})
        for k, v in body["metadata"]["annotations"].items():
            if v is None:
                ann.pop(k, None)
            else:
                ann[k] = v
        n.metadata.annotations = ann

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
