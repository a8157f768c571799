"""Pod Security Standards, "restricted" profile, as a pure check on rendered objects.

Written from the standard's controls (baseline + restricted, Kubernetes v1.33) so that tests
can reject a renderer or chart change that weakens a pod, without an API server. The
admission plugin itself is Go code inside the API server; there is no Python package for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gpufleet.errors import FieldError

# Baseline: capabilities a container may add (restricted narrows this to NET_BIND_SERVICE).
RESTRICTED_ADD_CAPS = frozenset({"NET_BIND_SERVICE"})
# What an RDMA worker adds (pinning the memory it registers with the adapter): in no Pod
# Security level but privileged (baseline's list lacks it), so the chart's rdma tenants are
# held to restricted plus this one by a ValidatingAdmissionPolicy instead.
RDMA_CAPABILITY = "IPC_LOCK"
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
Reporter = Callable[[str, str], None]


def pod_specs_in(obj: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every PodSpec inside a rendered object (Job, JobSet, PyTorchJob, ...), with its path."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            yield path, obj
            return
        for key, value in obj.items():
            yield from pod_specs_in(value, f"{path}.{key}" if path else str(key))
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from pod_specs_in(item, f"{path}[{i}]")


def check_restricted(
    pod: dict[str, Any], path: str = "spec", rdma_device: str | None = None
) -> list[FieldError]:
    """Every violation of the restricted profile in one PodSpec (empty: the pod passes); with
    ``rdma_device``, what an rdma tenant's policy allows besides: RDMA_CAPABILITY in a
    container whose limits hold that device (the chart's templates/rdma.yaml)."""
    errors: list[FieldError] = []

    def bad(where: str, message: str) -> None:
        errors.append(FieldError(f"{path}.{where}", message))

    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            bad(field, "host namespaces are not allowed")
    pod_sc = pod.get("securityContext") or {}
    _check_context(pod_sc, "securityContext", bad)
    for i, sysctl in enumerate(pod_sc.get("sysctls") or []):
        if sysctl.get("name") not in SAFE_SYSCTLS:
            bad(f"securityContext.sysctls[{i}]", f"unsafe sysctl {sysctl.get('name')!r}")
    for i, volume in enumerate(pod.get("volumes") or []):
        kinds = [k for k in volume if k != "name"]
        if "hostPath" in kinds or any(k not in RESTRICTED_VOLUMES for k in kinds):
            bad(f"volumes[{i}]", f"volume type {', '.join(kinds)} is not allowed")
    pod_non_root = pod_sc.get("runAsNonRoot") is True
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for kind in CONTAINER_LISTS:
        for i, c in enumerate(pod.get(kind) or []):
            where = f"{kind}[{i}]"
            sc = c.get("securityContext") or {}
            _check_context(sc, f"{where}.securityContext", bad)
            with_device = rdma_device in ((c.get("resources") or {}).get("limits") or {})
            may_add = RESTRICTED_ADD_CAPS | ({RDMA_CAPABILITY} if with_device else set())
            _check_container(c, sc, where, bad, frozenset(may_add))
            non_root = sc.get("runAsNonRoot", pod_non_root)
            if non_root is not True:
                bad(f"{where}.securityContext.runAsNonRoot", "must be true (pod or container)")
            seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
            if seccomp not in ("RuntimeDefault", "Localhost"):
                bad(
                    f"{where}.securityContext.seccompProfile.type",
                    "must be RuntimeDefault or Localhost (pod or container)",
                )
    return errors


def _check_context(sc: dict[str, Any], where: str, bad: Reporter) -> None:
    """Controls that apply to pod- and container-level security contexts alike."""
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        bad(f"{where}.windowsOptions.hostProcess", "HostProcess is not allowed")
    if sc.get("runAsUser") == 0:
        bad(f"{where}.runAsUser", "must not be 0 (root)")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        bad(f"{where}.seccompProfile.type", "Unconfined is not allowed")
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        bad(f"{where}.seLinuxOptions.type", f"SELinux type {selinux.get('type')!r} not allowed")
    for key in ("user", "role"):
        if selinux.get(key):
            bad(f"{where}.seLinuxOptions.{key}", "must not be set")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        bad(f"{where}.appArmorProfile.type", f"AppArmor profile {apparmor!r} not allowed")


def _check_container(
    c: dict[str, Any], sc: dict[str, Any], where: str, bad: Reporter, may_add: frozenset[str]
) -> None:
    """Controls that apply to each container."""
    if sc.get("privileged"):
        bad(f"{where}.securityContext.privileged", "privileged containers are not allowed")
    if sc.get("allowPrivilegeEscalation") is not False:
        bad(f"{where}.securityContext.allowPrivilegeEscalation", "must be false")
    if sc.get("procMount", "Default") != "Default":
        bad(f"{where}.securityContext.procMount", "must be Default")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        bad(f"{where}.securityContext.capabilities.drop", "must include ALL")
    extra = sorted(set(caps.get("add") or []) - may_add)
    if extra:
        allowed = ", ".join(sorted(may_add))
        bad(f"{where}.securityContext.capabilities.add", f"may add only {allowed}: {extra}")
    for j, port in enumerate(c.get("ports") or []):
        if port.get("hostPort"):
            bad(f"{where}.ports[{j}].hostPort", "host ports are not allowed")
