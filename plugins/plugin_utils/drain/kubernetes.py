# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``kubernetes`` drain backend (issue 30): cordon, evict, uncordon through the Kubernetes API.

It uses the Python ``kubernetes`` client from the controller, the same calls kubernetes.core's k8s_drain makes
(PATCH spec.unschedulable, list the node's pods by fieldSelector spec.nodeName, POST pods/<name>/eviction), so one
list of the nodes answers the budget for every host. Our cordon carries the annotation ``gpunode.tuning/drain``
(the reason): a cordon without it is someone else's and is never undone by us. An eviction answered 429 is a
PodDisruptionBudget refusing it: the failure says so.
"""

from __future__ import annotations

import json

from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import Backend, ClaimLost

ANNOTATION = "gpunode.tuning/drain"
MISSING = ("gpunode_tuning_drain: kubernetes needs the Python 'kubernetes' client on the controller "
           "(pip install kubernetes; it is in requirements.txt): %s")


def status_text(body) -> str:
    """What a metav1 Status answer says (its message and its causes' messages), or the raw body, cut short."""
    try:
        answer = json.loads(body) if isinstance(body, (str, bytes)) else body
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return str(body or "")[:200]
    causes = [c.get("message", "") for c in (answer.get("details") or {}).get("causes") or [] if isinstance(c, dict)]
    return " ".join([str(answer.get("message") or answer.get("reason") or "")] + [c for c in causes if c])[:300]


class KubernetesBackend(Backend):
    """Nodes through the API; ``node_of`` maps inventory names to node names."""

    name = "kubernetes"

    def __init__(self, node_of: dict, kubeconfig=None, context=None, timeout: float = 30, api=None,  # noqa: PLR0913
                 error=Exception, fleet_selector=None):
        self.node_of, self.timeout, self.fleet_selector = node_of, timeout, fleet_selector
        self.error = error
        if api is None:
            try:
                from kubernetes import client, config  # noqa: PLC0415
            except ImportError as exc:
                raise error(MISSING % exc) from exc
            try:
                config.load_kube_config(config_file=kubeconfig, context=context)
            except Exception as exc:  # noqa: BLE001 - the client raises several kinds
                raise error("gpunode_tuning_drain: kubernetes: cannot load the kubeconfig: %s" % exc) from exc
            api = client.CoreV1Api()
        self.api = api
        self.blocked: dict = {}

    def _call(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors
            status = getattr(exc, "status", None)
            reason = str(getattr(exc, "reason", exc))
            raise self.error("kubernetes %s: %s %s" % (what, status or "", reason)) from exc

    @staticmethod
    def _state(node) -> tuple:
        """(out of service, ours, why) of one Node object."""
        annotations = (node.metadata.annotations or {}) if node.metadata else {}
        cordoned = bool(node.spec and node.spec.unschedulable)
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])) \
            if node.status else False
        ours = cordoned and ANNOTATION in annotations
        why = []
        if cordoned:
            why.append("cordoned (spec.unschedulable)")
        if not ready:
            why.append("not Ready")
        return bool(why), ours, ", ".join(why)

    @staticmethod
    def _unknown(node) -> bool:
        """Ready ``Unknown``: the node controller has not heard from the kubelet lately (asked again)."""
        return any(c.type == "Ready" and c.status == "Unknown" for c in (node.status.conditions or [])) \
            if node.status else False

    def states(self, hosts: list) -> dict:
        nodes = {n.metadata.name: n for n in self._call("list nodes", self.api.list_node).items}
        out: dict = {"out_of_service": [], "ours": [], "claimed": {}, "transient": [], "why": {}}
        run_nodes = {self.node_of[h] for h in hosts}
        if self.fleet_selector:
            fleet = {n.metadata.name: n for n in self._call("list nodes", self.api.list_node,
                                                            label_selector=self.fleet_selector).items}
        else:
            fleet = {name: node for name, node in nodes.items() if name in run_nodes}
        out["fleet_size"] = len(set(fleet) | run_nodes)
        out["fleet"] = {name: self._state(node)[2] for name, node in sorted(fleet.items())
                        if name not in run_nodes and self._state(node)[0]}
        for host in hosts:
            node = nodes.get(self.node_of[host])
            if node is None:
                out["out_of_service"].append(host)
                out["why"][host] = "no such Kubernetes node: %s" % self.node_of[host]
                continue
            down, ours, why = self._state(node)
            if self._unknown(node):
                out["transient"].append(host)
            if down:
                out["out_of_service"].append(host)
                out["why"][host] = why
            if ours:
                out["ours"].append(host)
        return out

    def _node(self, host):
        return self._call("read node " + self.node_of[host], self.api.read_node, self.node_of[host])

    def drain(self, host: str, reason: str) -> None:
        body = {"spec": {"unschedulable": True}, "metadata": {"annotations": {ANNOTATION: reason}}}
        self._call("cordon " + self.node_of[host], self.api.patch_node, self.node_of[host], body)

    def keep_drained(self, host: str, reason: str) -> None:
        self.drain(host, reason)

    def _pods(self, host):
        pods = self._call("list pods on " + self.node_of[host], self.api.list_pod_for_all_namespaces,
                          field_selector="spec.nodeName=" + self.node_of[host]).items
        out = []
        for pod in pods:
            owners = pod.metadata.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners):
                continue  # k8s_drain's ignore_daemonsets: they come back on the node anyway
            if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                continue
            out.append(pod)
        return out

    def drained(self, host: str) -> bool:
        """Evict what is left (each poll); drained once no pod but DaemonSets' is left."""
        pods = self._pods(host)
        for pod in pods:
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}}
            try:
                self.api.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body,
                                                        _request_timeout=self.timeout)
            except Exception as exc:  # noqa: BLE001
                status = getattr(exc, "status", None)
                if status == 429:
                    self.blocked[host] = "eviction of %s/%s blocked by a PodDisruptionBudget (429): %s" % (
                        pod.metadata.namespace, pod.metadata.name, status_text(getattr(exc, "body", "")))
                elif status != 404:
                    raise self.error("kubernetes evict %s/%s: %s %s" % (
                        pod.metadata.namespace, pod.metadata.name, status, getattr(exc, "reason", exc))) from exc
        return not pods

    def holds(self, host: str) -> str | None:
        """Right before the reboot: still cordoned with our annotation (ClaimLost when someone uncordoned it or took
        the annotation away), and no pod left but DaemonSets' and finished ones."""
        node = self._node(host)
        if not (node.spec and node.spec.unschedulable) or ANNOTATION not in (node.metadata.annotations or {}):
            raise ClaimLost("%s is no longer cordoned by gpunode.tuning (someone uncordoned it): our claim on it "
                            "ended; not rebooted, not cordoned again" % self.node_of[host])
        left = self._pods(host)
        if left:
            return "pods still on %s: %s" % (self.node_of[host], ", ".join(
                "%s/%s" % (p.metadata.namespace, p.metadata.name) for p in left[:5]))
        return None

    def boot_mark(self, host: str) -> str | None:
        node = self._node(host)
        return (node.status.node_info.boot_id if node.status and node.status.node_info else None)

    def ready(self, host: str, mark: str | None = None) -> bool:
        node = self._node(host)
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        boot = node.status.node_info.boot_id if node.status.node_info else None
        return ready and (mark is None or boot != mark)

    def undrain(self, host: str) -> None:
        node = self._node(host)
        if ANNOTATION not in (node.metadata.annotations or {}):
            return  # someone else's cordon: never undone by us
        body = {"spec": {"unschedulable": False}, "metadata": {"annotations": {ANNOTATION: None}}}
        self._call("uncordon " + self.node_of[host], self.api.patch_node, self.node_of[host], body)

    def in_service(self, host: str) -> bool:
        return not self._state(self._node(host))[0]
