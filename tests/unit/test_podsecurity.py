"""The Pod Security "restricted" checker: a compliant pod passes, each weakening is caught."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.render import check_restricted, pod_specs_in


def good_pod() -> dict[str, Any]:
    sc = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{"name": "worker", "image": "x:1", "securityContext": dict(sc)}],
        "initContainers": [{"name": "init", "image": "x:1", "securityContext": dict(sc)}],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
        ],
    }


def test_compliant_pod_passes() -> None:
    assert check_restricted(good_pod()) == []


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        node = pod
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
        node[path[-1]] = value

    return mutate


def _del(path: list[Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(pod: dict[str, Any]) -> None:
        node = pod
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return mutate


C0 = ["containers", 0, "securityContext"]
CASES = [
    ("host network", _set(["hostNetwork"], True), "spec.hostNetwork"),
    ("host pid", _set(["hostPID"], True), "spec.hostPID"),
    ("privileged", _set([*C0, "privileged"], True), "containers[0].securityContext.privileged"),
    ("escalation", _set([*C0, "allowPrivilegeEscalation"], True), "allowPrivilegeEscalation"),
    ("escalation unset", _del([*C0, "allowPrivilegeEscalation"]), "allowPrivilegeEscalation"),
    ("no drop ALL", _set([*C0, "capabilities"], {"drop": ["NET_RAW"]}), "capabilities.drop"),
    ("add SYS_ADMIN", _set([*C0, "capabilities", "add"], ["SYS_ADMIN"]), "capabilities.add"),
    ("root user", _set(["securityContext", "runAsUser"], 0), "securityContext.runAsUser"),
    ("root container", _set([*C0, "runAsUser"], 0), "containers[0].securityContext.runAsUser"),
    ("non-root off", _set([*C0, "runAsNonRoot"], False), "runAsNonRoot"),
    ("non-root unset", _del(["securityContext", "runAsNonRoot"]), "runAsNonRoot"),
    ("seccomp unset", _del(["securityContext", "seccompProfile"]), "seccompProfile.type"),
    ("unconfined", _set([*C0, "seccompProfile"], {"type": "Unconfined"}), "seccompProfile"),
    ("hostPath", _set(["volumes", 0], {"name": "h", "hostPath": {"path": "/"}}), "volumes[0]"),
    ("nfs volume", _set(["volumes", 1], {"name": "n", "nfs": {"server": "s"}}), "volumes[1]"),
    ("host port", _set(["containers", 0, "ports"], [{"containerPort": 1, "hostPort": 80}]),
     "hostPort"),
    ("proc mount", _set([*C0, "procMount"], "Unmasked"), "procMount"),
    ("selinux user", _set([*C0, "seLinuxOptions"], {"user": "root"}), "seLinuxOptions.user"),
    ("sysctl", _set(["securityContext", "sysctls"], [{"name": "kernel.msgmax", "value": "1"}]),
     "sysctls[0]"),
    ("apparmor", _set([*C0, "appArmorProfile"], {"type": "Unconfined"}), "appArmorProfile"),
    ("host process", _set([*C0, "windowsOptions"], {"hostProcess": True}),
     "containers[0].securityContext.windowsOptions.hostProcess"),
    ("selinux type", _set([*C0, "seLinuxOptions"], {"type": "spc_t"}), "seLinuxOptions.type"),
    ("init escalation", _set(["initContainers", 0, "securityContext", "allowPrivilegeEscalation"],
     True), "initContainers[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "mutate", "want"), CASES, ids=[c[0] for c in CASES])
def test_each_weakening_is_caught(
    name: str, mutate: Callable[[dict[str, Any]], None], want: str
) -> None:
    pod = copy.deepcopy(good_pod())
    mutate(pod)
    errors = check_restricted(pod)
    assert any(want in e.path for e in errors), (name, [str(e) for e in errors])


def test_container_level_settings_can_satisfy_the_profile() -> None:
    pod = good_pod()
    pod["securityContext"] = {}
    for c in pod["containers"] + pod["initContainers"]:
        c["securityContext"].update(runAsNonRoot=True, seccompProfile={"type": "Localhost"})
    assert check_restricted(pod) == []


def test_pod_specs_found_in_nested_objects() -> None:
    job = {"kind": "JobSet", "spec": {"replicatedJobs": [
        {"template": {"spec": {"template": {"spec": good_pod()}}}},
        {"template": {"spec": {"template": {"spec": good_pod()}}}},
    ]}}  # fmt: skip
    found = list(pod_specs_in(job))
    assert [p for p, _ in found] == [
        "spec.replicatedJobs[0].template.spec.template.spec",
        "spec.replicatedJobs[1].template.spec.template.spec",
    ]


def test_only_the_unsafe_sysctls_are_named() -> None:
    pod = good_pod()
    pod["securityContext"]["sysctls"] = [
        {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},  # safe
        {"name": "kernel.shm_rmid_forced", "value": "1"},  # safe
        {"name": "kernel.msgmax", "value": "1"},
    ]
    assert [(e.path, e.message) for e in check_restricted(pod)] == [
        ("spec.securityContext.sysctls[2]", "unsafe sysctl 'kernel.msgmax'")
    ]
