"""tests/support/kubeapi.py, the Kubernetes API stand-in: its answers have the API's shapes.

Each answer is validated by the Python ``kubernetes`` client's own models (generated from the API's OpenAPI
document; they refuse a field the API does not have, at any depth, and a missing required one), and the 429
of an eviction is compared with a real one someone posted (tests/data/real/k8s-eviction-429-*). The backend
names the PodDisruptionBudget from that real answer.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client import models
from pydantic import ValidationError
from support.kubeapi import KubeApiStandIn

from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain.kubernetes import status_text

REAL_429 = "k8s-eviction-429-pdb-status-dojo6-intro-chaos-engineering.txt"


@pytest.fixture
def api(tmp_path):
    with KubeApiStandIn(["k1", "k2"], tmp_path) as standin:
        standin.add_pod("k1", "web-1")
        standin.add_pod("k1", "agent-1", daemonset=True)
        standin.add_pod("k1", "db-1", protected=True)
        standin.add_pod("k2", "job-1", phase="Succeeded")
        yield standin


def get(api, method, path, query=None, body=None, content_type="application/strategic-merge-patch+json"):
    with api.lock:
        return api.handle(method, path, query or {}, {"body": body, "content_type": content_type})


def paths(value, prefix=""):
    """Every key path of a JSON value (list items as ``[]``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + "/" + key
            yield from paths(item, prefix + "/" + key)
    elif isinstance(value, list):
        for item in value:
            yield from paths(item, prefix + "[]")


def test_the_client_models_refuse_what_the_api_does_not_have():
    """The check below can fail: a field the API does not know, at any depth, is refused."""
    node = {"metadata": {"name": "k1"}, "status": {"nodeInfo": {"bootID": "x", "bogus": 1}}}
    with pytest.raises(ValidationError, match="status.nodeInfo.bogus"):
        models.V1Node.model_validate(node)


def test_every_answer_has_the_shape_of_the_api(api):
    cordoned = get(api, "PATCH", "/api/v1/nodes/k1",
                   body={"spec": {"unschedulable": True}, "metadata": {"annotations": {"a/b": "x"}}})
    answers = [
        (models.VersionInfo, get(api, "GET", "/version")),
        (models.V1APIVersions, get(api, "GET", "/api")),
        (models.V1APIResourceList, get(api, "GET", "/api/v1")),
        (models.V1APIGroupList, get(api, "GET", "/apis")),
        (models.V1APIGroup, get(api, "GET", "/apis/policy")),
        (models.V1APIResourceList, get(api, "GET", "/apis/policy/v1")),
        (models.V1NodeList, get(api, "GET", "/api/v1/nodes")),
        (models.V1Node, get(api, "GET", "/api/v1/nodes/k2")),
        (models.V1Node, cordoned),
        (models.V1PodList, get(api, "GET", "/api/v1/pods", {"fieldSelector": ["spec.nodeName=k1"]})),
        (models.V1Pod, get(api, "GET", "/api/v1/namespaces/default/pods/web-1")),
        (models.V1Status, get(api, "POST", "/api/v1/namespaces/default/pods/db-1/eviction")),
        (models.V1Status, get(api, "POST", "/api/v1/namespaces/default/pods/web-1/eviction")),
        (models.V1Status, get(api, "GET", "/api/v1/nodes/k9")),
    ]
    for model, (_code, body) in answers:
        model.model_validate(body)
    assert [code for _model, (code, _body) in answers[-3:]] == [429, 201, 404]
    node = cordoned[1]
    assert node["spec"]["unschedulable"] is True and node["metadata"]["annotations"]["a/b"] == "x"
    assert [t["key"] for t in node["spec"]["taints"]] == ["node.kubernetes.io/unschedulable"]
    pods = get(api, "GET", "/api/v1/pods", {"fieldSelector": ["spec.nodeName=k1"]})[1]["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["agent-1", "db-1", "web-1"]


def test_an_uncordon_drops_the_field_the_taint_and_a_nulled_annotation(api):
    get(api, "PATCH", "/api/v1/nodes/k1",
        body={"spec": {"unschedulable": True}, "metadata": {"annotations": {"a": "x"}}})
    code, node = get(api, "PATCH", "/api/v1/nodes/k1",
                     body={"spec": {"unschedulable": False}, "metadata": {"annotations": {"a": None}}})
    assert code == 200 and "unschedulable" not in node["spec"] and "taints" not in node["spec"]
    assert "a" not in node["metadata"]["annotations"]
    code, _body = get(api, "PATCH", "/api/v1/nodes/k1", body=[{"op": "replace"}],
                      content_type="application/json-patch+json")
    assert code == 415


def test_the_stand_ins_429_is_shaped_like_a_real_one_and_the_backend_names_the_budget(api, real):
    capture = json.loads(real(REAL_429).text)
    code, ours = get(api, "POST", "/api/v1/namespaces/default/pods/db-1/eviction")
    assert code == 429 == capture["code"]
    assert set(paths(ours)) == set(paths(capture))
    for key in ("kind", "apiVersion", "status", "reason", "message"):
        assert ours[key] == capture[key], key
    assert ours["details"]["causes"][0]["reason"] == capture["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert status_text(real(REAL_429).text.strip()) == (
        "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget my-super-app-pdb "
        "needs 6 healthy pods and has 6 currently")
    assert status_text("upstream connect error") == "upstream connect error"  # not a Status: the raw text
    assert api.pods_on("k1") == ["agent-1", "db-1", "web-1"]  # a refused eviction leaves the pod


def test_the_server_clock_stamps_our_field_managers_entry_and_the_date_header_through_the_client(tmp_path):
    """Issue 42's claim, end to end over HTTP with the real client: a PATCH by field manager gpunode.tuning that
    changes a value stamps that entry's time with the server's clock (two hours behind this machine's here), one that
    changes nothing leaves it; ``list_node_with_http_info`` hands the backend the server's Date header."""
    import time

    from kubernetes import client, config

    from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import kubernetes as dk

    with KubeApiStandIn(["k1"], tmp_path, skew=-7200.0) as standin:
        api = client.CoreV1Api(config.new_client_from_config(config_file=standin.kubeconfig))
        body = {"spec": {"unschedulable": True}, "metadata": {"annotations": {dk.ANNOTATION: "gpunode.tuning: x"}}}
        api.patch_node("k1", body, field_manager=dk.FIELD_MANAGER)
        listed, _status, headers = api.list_node_with_http_info(_return_http_data_only=False)
        server_now, stamp = dk.http_date(headers), dk.stamped(listed.items[0])
        assert abs(server_now - (time.time() - 7200)) < 5 and abs(stamp - server_now) < 5
        entries = standin.node("k1")["metadata"]["managedFields"]
        assert [(e["manager"], e["operation"]) for e in entries] == [("gpunode.tuning", "Update")]
        standin.skew += 60
        api.patch_node("k1", body, field_manager=dk.FIELD_MANAGER)  # no value changed: the time stays
        assert dk.stamped(api.read_node("k1")) == stamp
        api.patch_node("k1", {"metadata": {"annotations": {dk.RENEWED: "1"}}}, field_manager=dk.FIELD_MANAGER)
        assert dk.stamped(api.read_node("k1")) >= stamp + 59
