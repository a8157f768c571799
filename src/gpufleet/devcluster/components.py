"""The local control plane's components: one small function each that returns its command line
and how to tell it is ready (the shape of kwokctl's pkg/kwokctl/components). Every listener is
on 127.0.0.1; every port is chosen free at start and recorded in the cluster's state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.devcluster.pki import FRONT_PROXY_CA, FRONT_PROXY_CLIENT, Pki

if TYPE_CHECKING:  # ssl and urllib load when a probe runs, not with every CLI start
    import ssl

# Pod IPs kwok hands out and the Service range: addresses inside the API objects only, except
# on real nodes (realnodes.network), where kube-proxy routes Services.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first of SERVICE_CIDR: the API server's Service
POD_CIDR = "10.244.0.0/16"
HPA_SYNC_PERIOD = "5s"  # kube-controller-manager's HorizontalPodAutoscaler controller
# kwok manages the nodes that carry this annotation (and no others).
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


@dataclass(frozen=True)
class Component:
    """A process of the control plane: its argv and a readiness probe (True when ready)."""

    name: str
    argv: list[str]
    ready: Callable[[], bool]
    env: tuple[tuple[str, str], ...] = ()  # added to this process's environment


def _get(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _insecure() -> ssl.SSLContext:
    import ssl

    # The controller-manager's and scheduler's health endpoints serve a self-signed certificate
    # of their own making; /healthz is public there (--authorization-always-allow-paths).
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def etcd(binary: Path, data_dir: Path, client_port: int, peer_port: int) -> Component:
    """etcd, one member, plain HTTP on loopback (only the API server talks to it)."""
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    argv = [
        str(binary),
        "--name=local",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--log-level=warn",
    ]
    return Component("etcd", argv, lambda: _get(f"{client}/readyz"))


def kube_apiserver(
    binary: Path, pki: Pki, port: int, etcd_port: int, address: str = "127.0.0.1"
) -> Component:
    """The API server as a real cluster runs it: client certificates, Node+RBAC authorization,
    signed ServiceAccount tokens, the default admission plugins (PodSecurity, ResourceQuota
    among them); privileged containers refused; Secrets encrypted in etcd (pki.py). It listens
    on ``address``: loopback, or the real nodes' bridge (pods reach it there, through the
    ``kubernetes`` Service); to kubelets with its own client certificate, at their
    InternalIP."""
    argv = [
        str(binary),
        f"--bind-address={address}",
        f"--advertise-address={address}",
        f"--secure-port={port}",
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--tls-cert-file={pki.cert('kube-apiserver')}",
        f"--tls-private-key-file={pki.key('kube-apiserver')}",
        f"--client-ca-file={pki.ca}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--encryption-provider-config={pki.encryption_config}",
        "--allow-privileged=false",
        "--profiling=false",
        f"--kubelet-client-certificate={pki.cert('kubelet-client')}",
        f"--kubelet-client-key={pki.key('kubelet-client')}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # The aggregation layer, as kubeadm sets it up: to an extension API server (Prometheus
        # Adapter's custom.metrics.k8s.io) the API server proxies as front-proxy-client, the
        # caller's identity in the X-Remote-* headers.
        f"--requestheader-client-ca-file={pki.cert(FRONT_PROXY_CA)}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.cert(FRONT_PROXY_CLIENT)}",
        f"--proxy-client-key-file={pki.key(FRONT_PROXY_CLIENT)}",
    ]

    def ready() -> bool:
        import ssl

        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
        return _get(f"https://{address}:{port}/readyz", context=ctx)

    return Component("kube-apiserver", argv, ready)


def _component_base_server(
    name: str, binary: Path, kubeconfig: Path, port: int, *flags: str
) -> Component:
    """A component-base server (controller-manager, scheduler): ``kubeconfig`` to reach the API
    and to authenticate and authorize callers of its own endpoints, its secure port on
    loopback, one replica (no leader election); ready when /healthz answers."""
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--profiling=false",
        *flags,
    ]
    url = f"https://127.0.0.1:{port}/healthz"
    return Component(name, argv, lambda: _get(url, context=_insecure()))


def kube_controller_manager(binary: Path, pki: Pki, kubeconfig: Path, port: int) -> Component:
    """The controllers (Job, ServiceAccount, namespace, garbage collector, ...), each with its
    own ServiceAccount credentials as in a cluster."""
    return _component_base_server(
        "kube-controller-manager",
        binary,
        kubeconfig,
        port,
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca}",
        f"--cluster-signing-key-file={pki.key('ca')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # A dev cluster's autoscalers act on a load within seconds (the default: every 15 s).
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
    )


def kube_scheduler(binary: Path, kubeconfig: Path, port: int) -> Component:
    """The scheduler: binds pods to (kwok's) nodes by resources, taints and selectors."""
    return _component_base_server("kube-scheduler", binary, kubeconfig, port)


def kwok(
    binary: Path, kubeconfig: Path, stages: list[Path], nodes_ready: Callable[[], bool]
) -> Component:
    """kwok: the node and pod lifecycles (no containers) of the nodes it manages, driven by
    kwok's own Stages. Ready once every fake node reports Ready."""
    key, value = KWOK_NODE_ANNOTATION
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        f"--cidr={POD_CIDR}",
        "--node-lease-duration-seconds=40",
        *[f"--config={s}" for s in stages],
    ]
    return Component("kwok", argv, nodes_ready)


def controller_runtime_manager(
    name: str,
    argv: list[str],
    health_port: int,
    env: dict[str, str] | None = None,
    *,
    path: str = "/readyz",
    tls: bool = False,
) -> Component:
    """A controller's manager (Kueue, JobSet, the Kubeflow operators, Volcano's); ready when its
    readiness endpoint answers (controller-runtime's /readyz reports ready only once the
    webhook server listens with its certificate)."""
    url = f"{'https' if tls else 'http'}://127.0.0.1:{health_port}{path}"
    context = _insecure() if tls else None  # our own CA's certificate, for another host name
    return Component(name, argv, lambda: _get(url, context=context), tuple((env or {}).items()))
