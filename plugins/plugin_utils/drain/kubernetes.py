# Copyright: (c) 2026, gpunode.tuning contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``kubernetes`` drain backend (issue 30): cordon, evict, uncordon through the Kubernetes API.

It uses the Python ``kubernetes`` client from the controller, the same calls kubernetes.core's k8s_drain makes
(PATCH spec.unschedulable, list the node's pods by fieldSelector spec.nodeName, POST pods/<name>/eviction), so one
list of the nodes answers the budget for every host. Our cordon carries the annotation ``gpunode.tuning/drain``
(the reason): a cordon without it is someone else's and is never undone by us. An eviction answered 429 is a
PodDisruptionBudget refusing it: the failure says so.

With a claim (the action always gives one; issue 42) the annotation ends with the run's claim mark
(reboot.claim_mark: run id, controller, start, lease), and every PATCH of ours names the field manager
``gpunode.tuning``: the API server stamps that manager's ``metadata.managedFields[].time`` whenever the manager
changes a value it owns. A renewal changes only ``gpunode.tuning/renewed`` (never cordons again), so the server
stamps the time anew. A claim is live while the API server's own now (the ``Date`` header of its answer to the
read) is within the lease of that stamp: the controller's clock is never compared with anything.
"""

from __future__ import annotations

import calendar
import datetime
import json
import time
from email.utils import parsedate_tz

from ansible_collections.gpunode.tuning.plugins.plugin_utils import reboot
from ansible_collections.gpunode.tuning.plugins.plugin_utils.drain import Backend, ClaimLost

ANNOTATION = "gpunode.tuning/drain"
RENEWED = "gpunode.tuning/renewed"  # changed at each renewal so that the API server stamps our entry anew
FIELD_MANAGER = "gpunode.tuning"
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


def http_date(headers) -> int | None:
    """The ``Date`` header of an answer (RFC 9110's IMF-fixdate), in seconds since the epoch, or None."""
    for key, value in (dict(headers or {})).items():
        if str(key).lower() == "date":
            parsed = parsedate_tz(str(value))
            if parsed:
                return int(calendar.timegm(parsed[:9]) - (parsed[9] or 0))
    return None


def _epoch(value) -> int | None:
    """A metav1.Time (a datetime from the client, or its RFC 3339 text) in seconds since the epoch."""
    if isinstance(value, datetime.datetime):  # a naive one is UTC, as the client parses "Z"
        return int(calendar.timegm(value.utctimetuple()))
    if isinstance(value, str):
        try:
            return int(calendar.timegm(time.strptime(value.strip()[:19], "%Y-%m-%dT%H:%M:%S")))
        except ValueError:
            return None
    return None


def _get(obj, snake: str, camel: str):
    return obj.get(camel, obj.get(snake)) if isinstance(obj, dict) else getattr(obj, snake, None)


def stamped(node) -> int | None:
    """When the API server last stamped our field manager's entry (``managedFields[].time`` of manager
    ``gpunode.tuning``, operation Update, the main resource), or None."""
    entries = (_get(node.metadata, "managed_fields", "managedFields") or []) if node.metadata else []
    times = [_epoch(_get(e, "time", "time")) for e in entries
             if _get(e, "manager", "manager") == FIELD_MANAGER and _get(e, "operation", "operation") == "Update"
             and not _get(e, "subresource", "subresource")]
    times = [t for t in times if t is not None]
    return max(times) if times else None


class KubernetesBackend(Backend):
    """Nodes through the API; ``node_of`` maps inventory names to node names."""

    name = "kubernetes"

    def __init__(self, node_of: dict, kubeconfig=None, context=None, timeout: float = 30, api=None,  # noqa: PLR0913
                 error=Exception, fleet_selector=None, claim=None):
        self.node_of, self.timeout, self.fleet_selector = node_of, timeout, fleet_selector
        self.claim = claim
        self._reasons: dict = {}
        self._renewed: dict = {}
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

    def _with_date(self, what, fn, *args, **kwargs) -> tuple:
        """``(answer, the API server's now)``: the call ``_with_http_info`` (the client then returns the data, the
        status and the headers), its ``Date`` header read."""
        answer = self._call(what, fn, *args, _return_http_data_only=False, **kwargs)
        if isinstance(answer, tuple):
            return answer[0], http_date(answer[2] if len(answer) > 2 else None)
        return getattr(answer, "data", answer), http_date(getattr(answer, "headers", None))

    def _foreign(self, node, now) -> str | None:
        """Why ``node`` is another live run's (its claim, within its lease by the API server's clock), or None."""
        if self.claim is None:
            return None
        annotations = (node.metadata.annotations or {}) if node.metadata else {}
        if not (node.spec and node.spec.unschedulable) or ANNOTATION not in annotations:
            return None
        claim = reboot.parse_claim(annotations[ANNOTATION])
        if claim is None or reboot.same_claim(claim, self.claim):
            return None
        if reboot.claim_live(claim, stamped(node), now):
            return reboot.claim_text(claim, stamped(node), now)
        return None

    @staticmethod
    def _state(node) -> tuple:
        """(out of service, ours, why) of one Node object (``ours``: our annotation, whoever's claim)."""
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
        listed, now = self._with_date("list nodes", self.api.list_node_with_http_info)
        nodes = {n.metadata.name: n for n in listed.items}
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
            foreign = self._foreign(node, now)
            if foreign:
                out["claimed"][host] = foreign  # another live run's: out of service, waited for, never touched
            elif ours:
                out["ours"].append(host)
        return out

    def _node(self, host):
        return self._call("read node " + self.node_of[host], self.api.read_node, self.node_of[host])

    def _patch(self, what, host, body):
        self._call(what + " " + self.node_of[host], self.api.patch_node, self.node_of[host], body,
                   field_manager=FIELD_MANAGER)

    @staticmethod
    def _stamp() -> str:
        """A value that differs at each renewal (the controller's time, shown, never compared)."""
        return "%.6f" % time.time()

    def drain(self, host: str, reason: str) -> None:
        text = reboot.claimed_reason(reason, self.claim)
        annotations = {ANNOTATION: text}
        if self.claim is not None:
            annotations[RENEWED] = self._stamp()
        self._patch("cordon", host, {"spec": {"unschedulable": True}, "metadata": {"annotations": annotations}})
        self._reasons[host], self._renewed[host] = text, time.monotonic()

    def _check_claim(self, host: str, node) -> None:
        """Raise ClaimLost when the node is no longer cordoned with this run's claim (without a claim: with our
        annotation)."""
        annotations = (node.metadata.annotations or {}) if node.metadata else {}
        if not (node.spec and node.spec.unschedulable) or ANNOTATION not in annotations:
            raise ClaimLost("%s is no longer cordoned by gpunode.tuning (someone uncordoned it): our claim on it "
                            "ended; not rebooted, not cordoned again" % self.node_of[host])
        if self.claim is None:
            return
        claim = reboot.parse_claim(annotations[ANNOTATION])
        if not reboot.same_claim(claim, self.claim):
            raise ClaimLost("%s's annotation %s is no longer this run's (%r): our claim on it ended; not rebooted"
                            % (self.node_of[host], ANNOTATION, annotations[ANNOTATION]), by_run=claim is not None)

    def renew(self, host: str, force: bool = False) -> None:
        """Change ``gpunode.tuning/renewed`` (the API server stamps our entry's time anew) while the node holds our
        claim: a PATCH of that annotation only, never a cordon again."""
        if self.claim is None or not self._reasons.get(host):
            return
        if not force and time.monotonic() - self._renewed.get(host, 0) < self.claim["lease"] / 3.0:
            return
        node = self._node(host)
        annotations = (node.metadata.annotations or {}) if node.metadata else {}
        if node.spec and node.spec.unschedulable and reboot.same_claim(
                reboot.parse_claim(annotations.get(ANNOTATION)), self.claim):
            self._patch("renew the claim on", host, {"metadata": {"annotations": {RENEWED: self._stamp()}}})
            self._renewed[host] = time.monotonic()

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
        """Evict what is left (each poll); drained once no pod but DaemonSets' is left (ClaimLost when our claim
        on the node ended)."""
        if self.claim is not None:
            self._check_claim(host, self._node(host))
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
        """Right before the reboot, the node read again: still cordoned with our claim (ClaimLost when someone
        uncordoned it, took the annotation away or another run's claim replaced ours), and no pod left but
        DaemonSets' and finished ones."""
        self._check_claim(host, self._node(host))
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
        annotations = node.metadata.annotations or {}
        if ANNOTATION not in annotations:
            return  # someone else's cordon: never undone by us
        claim = reboot.parse_claim(annotations[ANNOTATION])
        if self.claim is not None and claim is not None and not reboot.same_claim(claim, self.claim):
            raise ClaimLost("%s's annotation %s is another run's (%r): not uncordoned by this run"
                            % (self.node_of[host], ANNOTATION, annotations[ANNOTATION]))
        body = {"spec": {"unschedulable": False}, "metadata": {"annotations": {ANNOTATION: None, RENEWED: None}}}
        self._patch("uncordon", host, body)
        self._reasons.pop(host, None)

    def in_service(self, host: str) -> bool:
        return not self._state(self._node(host))[0]
