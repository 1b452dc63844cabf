"""A stand-in for the Kubernetes API server over HTTP, on loopback, for the ``kubernetes`` drain backend's tests.

No API server can be installed on the test machines, so this one serves just what a drain of Nodes needs: the
calls the backend (plugins/plugin_utils/drain/kubernetes.py, through the Python ``kubernetes`` client) and
kubernetes.core's ``k8s_drain`` and ``k8s_info`` (kind Node) make, API discovery included:

- discovery: ``GET /version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/policy``, ``/apis/policy/v1`` (the
  classic JSON documents; an ``Accept`` that asks only for aggregated discovery gets them too, as an older server
  answers);
- nodes: ``GET /api/v1/nodes`` (NodeList), ``GET`` and ``PATCH /api/v1/nodes/NAME`` (strategic merge or JSON merge
  patch: maps merge, ``null`` deletes a key; a JSON Patch list is refused with 415, like a body the server cannot
  read). A cordon (``spec.unschedulable: true``) adds the ``node.kubernetes.io/unschedulable`` taint, as the node
  controller does, and an uncordon drops both (the server omits ``unschedulable: false``);
- pods: ``GET /api/v1/pods`` and ``/api/v1/namespaces/NS/pods`` with ``fieldSelector=spec.nodeName=N``,
  ``GET`` and ``DELETE /api/v1/namespaces/NS/pods/NAME``, ``POST .../pods/NAME/eviction``: 201 and the pod
  goes (terminating for ``grace`` seconds, then deleted), or 429 ``TooManyRequests`` with a ``DisruptionBudget``
  cause for a pod a PodDisruptionBudget protects, as the eviction subresource answers; 404 for a pod that is gone.

The JSON follows the API's own shapes (Node, Pod, NodeList, PodList, Status, APIResourceList; see
docs/rebooting.md, "Tests"); every request needs the kubeconfig's bearer token (401 otherwise, so the client's
kubeconfig loading is exercised). ``reboot(node)`` is what a node's reboot looks like from the API: the Ready
condition goes Unknown ("Kubelet stopped posting node status."), then True again with a new
``status.nodeInfo.bootID``. ``log`` keeps every request (method, path, body, time) for the tests' assertions.

The server has its own clock (``skew`` seconds from the machine's), as a real API server's is not the
controller's: it answers every request with a ``Date`` header from it, and a PATCH that changes a value stamps
the request's ``fieldManager`` entry in ``metadata.managedFields`` (operation Update, ``time`` from it), as the
API server's field management does (a PATCH that changes nothing leaves the entry's time as it was).
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import yaml

TOKEN = "gpunode-tuning-standin-token"
SERVER_VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.14", "gitCommit": "0" * 40,
                  "gitTreeState": "clean", "buildDate": "2025-06-17T18:29:10Z", "goVersion": "go1.23.10",
                  "compiler": "gc", "platform": "linux/amd64"}
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
MERGE_PATCHES = ("application/strategic-merge-patch+json", "application/merge-patch+json")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resource(name, kind, namespaced, verbs, short=None, group_kind=None):
    out = {"name": name, "singularName": "" if "/" in name else name.rstrip("s"), "namespaced": namespaced,
           "kind": kind, "verbs": verbs}
    if short:
        out["shortNames"] = short
    if group_kind:
        out.update(group_kind)
    return out


ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
CORE_V1 = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    _resource("namespaces", "Namespace", False, ["create", "delete", "get", "list", "patch", "update", "watch"],
              ["ns"]),
    _resource("nodes", "Node", False, ALL_VERBS, ["no"]),
    _resource("nodes/status", "Node", False, ["get", "patch", "update"]),
    _resource("pods", "Pod", True, ALL_VERBS, ["po"]),
    _resource("pods/eviction", "Eviction", True, ["create"], group_kind={"group": "policy", "version": "v1"}),
    _resource("pods/status", "Pod", True, ["get", "patch", "update"]),
]}
POLICY_GROUP = {"name": "policy", "versions": [{"groupVersion": "policy/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "policy/v1", "version": "v1"}}
POLICY_V1 = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "policy/v1", "resources": [
    _resource("poddisruptionbudgets", "PodDisruptionBudget", True, ALL_VERBS, ["pdb"]),
    _resource("poddisruptionbudgets/status", "PodDisruptionBudget", True, ["get", "patch", "update"]),
]}


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A metav1 Status, as the API server answers a failed (or an eviction's successful) request."""
    out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" if code < 400 else "Failure",
           "message": message, "reason": reason, "code": code}
    if details:
        out["details"] = details
    if code < 400:
        out.pop("message")
        out.pop("reason")
    return out


def _merge(target: dict, patch: dict) -> None:
    """JSON merge patch (RFC 7386), which is what a strategic merge patch does to the fields used here."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class KubeApiStandIn:
    """Nodes and pods behind a loopback HTTP server; ``start()`` it, point ``kubeconfig`` at it, ``stop()`` it."""

    def __init__(self, nodes, directory, grace: float = 0.5, skew: float = 0.0):
        self.directory, self.grace, self.skew = str(directory), grace, skew
        self.lock = threading.RLock()
        self.log: list[dict] = []
        self.nodes = {name: self._node(name) for name in nodes}
        self.pods: dict = {}
        self.protected: set = set()
        self._version = 1000
        self._timers: list[threading.Timer] = []
        self.server = None
        self.kubeconfig = None

    # --- objects -----------------------------------------------------------------------------------------

    def clock(self) -> float:
        """The server's now, in seconds since the epoch."""
        return time.time() + self.skew

    def _stamp(self, node: dict, manager: str, patch: dict) -> None:
        """``manager``'s Update entry in managedFields, its time the server's now (its fields: the patch's)."""
        def fields(value):
            return {"f:" + k: fields(v) if isinstance(v, dict) else {} for k, v in value.items() if v is not None}

        meta = node["metadata"]
        entries = [e for e in meta.get("managedFields", []) if (e["manager"], e["operation"]) != (manager, "Update")]
        entries.append({"manager": manager, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                        "fieldsV1": fields(patch),
                        "time": datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
        meta["managedFields"] = entries

    def _rv(self) -> str:
        self._version += 1
        return str(self._version)

    def _node(self, name: str) -> dict:
        now = _now()
        ready = {"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now,
                 "reason": "KubeletReady", "message": "kubelet is posting ready status"}
        kinds = (("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                 ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                 ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"))
        pressure = [{"type": kind, "status": "False", "lastHeartbeatTime": now, "lastTransitionTime": now,
                     "reason": "KubeletHas" + reason, "message": message} for kind, reason, message in kinds]
        return {
            "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "1", "creationTimestamp": now,
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                                    "beta.kubernetes.io/arch": "amd64"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
            "status": {
                "capacity": {"cpu": "64", "memory": "528000000Ki", "nvidia.com/gpu": "8", "pods": "110"},
                "allocatable": {"cpu": "64", "memory": "527000000Ki", "nvidia.com/gpu": "8", "pods": "110"},
                "conditions": pressure + [ready],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()),
                             "bootID": str(uuid.uuid4()), "kernelVersion": "6.8.0-49-generic",
                             "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                             "kubeletVersion": "v1.30.14", "kubeProxyVersion": "v1.30.14",
                             "operatingSystem": "linux", "architecture": "amd64"},
            },
        }

    def add_pod(self, node: str, name: str, namespace: str = "default", daemonset: bool = False,
                protected: bool = False, phase: str = "Running") -> None:
        """A pod bound to ``node``: a DaemonSet's (``daemonset``), one a PodDisruptionBudget protects
        (``protected``: its eviction answers 429), or a finished one (``phase`` Succeeded or Failed)."""
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet" if daemonset else "ReplicaSet",
                 "name": name.rsplit("-", 1)[0], "uid": str(uuid.uuid4()), "controller": True,
                 "blockOwnerDeletion": True}
        pod = {"metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                            "resourceVersion": self._rv(), "creationTimestamp": _now(),
                            "labels": {"app": name.rsplit("-", 1)[0]}, "ownerReferences": [owner]},
               "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}],
                        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30},
               "status": {"phase": phase, "hostIP": "127.0.0.1", "podIP": "10.244.0.%d" % (len(self.pods) + 2),
                          "startTime": _now()}}
        with self.lock:
            self.pods[(namespace, name)] = pod
            if protected:
                self.protected.add((namespace, name))

    def cordon(self, node: str, annotations: dict | None = None, manager: str = "kubectl-cordon") -> None:
        """Cordon ``node`` as someone else would (kubectl cordon: no annotation of ours; or another run of ours,
        its ``annotations`` and its field ``manager``)."""
        with self.lock:
            self._patch_node(self.nodes[node], {"spec": {"unschedulable": True},
                                                "metadata": {"annotations": annotations or {}}}, manager)

    def reboot(self, node: str, down_seconds: float = 1.0) -> None:
        """The node reboots: Ready goes Unknown (the kubelet stopped posting), then True with a new bootID."""
        with self.lock:
            self._set_ready(self.nodes[node], "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        timer = threading.Timer(down_seconds, self._boot, args=(node,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _boot(self, node: str) -> None:
        with self.lock:
            obj = self.nodes[node]
            obj["status"]["nodeInfo"]["bootID"] = str(uuid.uuid4())
            self._set_ready(obj, "True", "KubeletReady", "kubelet is posting ready status")

    def _set_ready(self, node: dict, value: str, reason: str, message: str) -> None:
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition.update(status=value, reason=reason, message=message, lastTransitionTime=_now(),
                                 lastHeartbeatTime=_now())
        node["metadata"]["resourceVersion"] = self._rv()

    def _patch_node(self, node: dict, patch: dict, manager: str | None = None) -> None:
        before = copy.deepcopy({"spec": node.get("spec"), "metadata": node["metadata"].get("annotations")})
        _merge(node, patch)
        spec = node.setdefault("spec", {})
        taints = [t for t in spec.get("taints", []) if t.get("key") != UNSCHEDULABLE_TAINT]
        if spec.get("unschedulable"):
            taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": _now()})
        else:
            spec.pop("unschedulable", None)  # omitempty: the server never shows unschedulable: false
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        changed = {k: v for k, v in spec.items() if k != "taints"} != {
            k: v for k, v in (before["spec"] or {}).items() if k != "taints"} or (
            node["metadata"].get("annotations") != before["metadata"])
        if manager and changed:
            self._stamp(node, manager, patch)
        node["metadata"]["resourceVersion"] = self._rv()

    def _delete_pod(self, key) -> None:
        pod = self.pods.get(key)
        if pod is None or "deletionTimestamp" in pod["metadata"]:
            return
        pod["metadata"]["deletionTimestamp"] = _now()
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        timer = threading.Timer(self.grace, self._forget_pod, args=(key,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _forget_pod(self, key) -> None:
        with self.lock:
            self.pods.pop(key, None)

    # --- what the tests read -------------------------------------------------------------------------------

    def node(self, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def pods_on(self, node: str) -> list:
        with self.lock:
            return sorted(name for (_ns, name), pod in self.pods.items() if pod["spec"]["nodeName"] == node)

    def requests(self, method: str | None = None, path: str | None = None) -> list:
        with self.lock:
            return [r for r in self.log if (method is None or r["method"] == method)
                    and (path is None or r["path"] == path)]

    # --- the server ----------------------------------------------------------------------------------------

    def start(self) -> KubeApiStandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # the tests read ``log``, not stderr
                return

            def date_time_string(self, timestamp=None):  # the Date header: the server's clock
                return super().date_time_string(standin.clock() if timestamp is None else timestamp)

            def _answer(self):
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                entry = {"method": self.command, "path": url.path, "query": parse_qs(url.query),
                         "content_type": self.headers.get("Content-Type"), "at": time.monotonic(), "body": None}
                try:
                    entry["body"] = json.loads(raw) if raw else None
                except ValueError:
                    entry["body"] = raw.decode(errors="replace")
                with standin.lock:
                    standin.log.append(entry)
                    if self.headers.get("Authorization") != "Bearer " + TOKEN:
                        code, body = 401, status(401, "Unauthorized", "Unauthorized")
                    else:
                        code, body = standin.handle(self.command, url.path, parse_qs(url.query), entry)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="kube-api-standin", daemon=True).start()
        self.kubeconfig = self.write_kubeconfig()
        return self

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return "http://%s:%d" % (host, port)

    def write_kubeconfig(self) -> str:
        path = "%s/kubeconfig" % self.directory
        config = {"apiVersion": "v1", "kind": "Config", "preferences": {},
                  "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                  "users": [{"name": "drainer", "user": {"token": TOKEN}}],
                  "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "drainer"}}],
                  "current-context": "standin"}
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(config, fh)
        return path

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self) -> KubeApiStandIn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the API -------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, entry: dict) -> tuple:  # noqa: PLR0911
        """``(HTTP status, JSON body)`` of one request (the lock is held)."""
        parts = [p for p in path.split("/") if p]
        cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.split("//", 1)[1]}]
        discovery = {
            "/version": SERVER_VERSION,
            "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs},
            "/api/v1": CORE_V1,
            "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [POLICY_GROUP]},
            "/apis/policy": dict(POLICY_GROUP, kind="APIGroup", apiVersion="v1"),
            "/apis/policy/v1": POLICY_V1,
        }
        if method == "GET" and "/" + "/".join(parts) in discovery:
            return 200, discovery["/" + "/".join(parts)]
        if parts[:3] == ["api", "v1", "nodes"]:
            return self._nodes(method, parts[3:], entry)
        if parts[:3] == ["api", "v1", "pods"] and method == "GET":
            return 200, self._pod_list(query)
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5 and parts[4] == "pods":
            return self._namespaced_pods(method, parts[3], parts[5:], query)
        return 404, status(404, "NotFound", "the server could not find the requested resource")

    def _nodes(self, method, rest, entry):
        if not rest:
            if method != "GET":
                return 405, status(405, "MethodNotAllowed", "the server does not allow this method on nodes")
            items = [copy.deepcopy(n) for n in self.nodes.values()]
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                         "items": items}
        node = self.nodes.get(rest[0])
        if node is None:
            return 404, status(404, "NotFound", 'nodes "%s" not found' % rest[0],
                               {"name": rest[0], "kind": "nodes"})
        if method == "PATCH" and len(rest) == 1:
            if entry["content_type"] not in MERGE_PATCHES or not isinstance(entry["body"], dict):
                return 415, status(415, "UnsupportedMediaType", "the stand-in serves strategic merge and JSON merge "
                                   "patches of an object, got %s" % entry["content_type"])
            self._patch_node(node, entry["body"], ((entry.get("query") or {}).get("fieldManager") or ["unknown"])[0])
        elif method != "GET" or len(rest) != 1:
            return 405, status(405, "MethodNotAllowed", "the stand-in serves GET and PATCH of a node")
        return 200, dict(copy.deepcopy(node), kind="Node", apiVersion="v1")

    def _pod_list(self, query, namespace=None):
        selector = (query.get("fieldSelector") or [""])[0]
        wanted = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
        unknown = set(wanted) - {"spec.nodeName", "metadata.namespace"}
        items = []
        for (ns, _name), pod in sorted(self.pods.items()):
            if unknown or (namespace and ns != namespace):
                continue
            if wanted.get("spec.nodeName", pod["spec"]["nodeName"]) != pod["spec"]["nodeName"]:
                continue
            if wanted.get("metadata.namespace", ns) != ns:
                continue
            items.append(copy.deepcopy(pod))
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._version)},
                "items": items}

    def _namespaced_pods(self, method, namespace, rest, query):
        if not rest:
            return (200, self._pod_list(query, namespace)) if method == "GET" else \
                (405, status(405, "MethodNotAllowed", "the stand-in serves GET of pods"))
        key = (namespace, rest[0])
        pod = self.pods.get(key)
        if pod is None:
            return 404, status(404, "NotFound", 'pods "%s" not found' % rest[0], {"name": rest[0], "kind": "pods"})
        if rest[1:] == ["eviction"] and method == "POST":
            if key in self.protected:
                return 429, status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                   "disruption budget.", {"causes": [
                                       {"reason": "DisruptionBudget", "message": "The disruption budget %s-pdb needs "
                                        "1 healthy pods and has 1 currently" % pod["metadata"]["labels"]["app"]}]})
            self._delete_pod(key)
            return 201, status(201, "", "")
        if not rest[1:] and method == "GET":
            return 200, dict(copy.deepcopy(pod), kind="Pod", apiVersion="v1")
        if not rest[1:] and method == "DELETE":
            self._delete_pod(key)
            return 200, dict(copy.deepcopy(pod), kind="Pod", apiVersion="v1")
        return 405, status(405, "MethodNotAllowed", "the stand-in serves GET, DELETE and eviction of a pod")
