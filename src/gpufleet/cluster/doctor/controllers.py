"""The controllers' checks of ``gpufleet doctor`` (pure, from Facts): the API server's version,
each controller's CRDs at the versions gpufleet writes and its processes running, and Kueue's
integrations for the targets in use."""

from __future__ import annotations

import re
from datetime import datetime

from gpufleet.cluster.doctor.facts import Facts
from gpufleet.cluster.doctor.findings import Finding, fail, ok, unreadable, warn
from gpufleet.cluster.doctor.requirements import (
    CONTROLLERS,
    KUEUE,
    KUEUE_CONFIGMAP,
    KUEUE_SETTINGS,
    MIN_KUBERNETES,
    TARGET_NEEDS,
    VERIFIED_KUBERNETES,
    Controller,
    Process,
)
from gpufleet.kube import Obj


def kubernetes_version(facts: Facts) -> Finding:
    """The API server is at least MIN_KUBERNETES."""
    if "version" in facts.errors:
        return unreadable("kubernetes", facts.errors["version"])
    minimum = "v" + ".".join(map(str, MIN_KUBERNETES))
    found = re.match(r"v?(\d+)\.(\d+)", facts.version)
    if found is None:
        return warn("kubernetes", f"version {facts.version!r} not understood (minimum {minimum})")
    if (int(found[1]), int(found[2])) < MIN_KUBERNETES:
        return fail(
            "kubernetes",
            f"{facts.version} is older than {minimum}",
            f"upgrade the control plane to {minimum} or later (verified: {VERIFIED_KUBERNETES})",
        )
    return ok("kubernetes", f"{facts.version} (minimum {minimum})")


def in_scope(facts: Facts, targets: list[str]) -> tuple[list[Controller], list[str]]:
    """The controllers to check and the targets in use: those named (every controller they
    need must then be there), else every target whose controllers' CRDs are installed."""
    if targets:
        needed = [KUEUE, *(c for t in targets for c in TARGET_NEEDS[t].controllers)]
        return list(dict.fromkeys(needed)), targets
    installed = [c for c in CONTROLLERS if _installed(c, facts)]
    used = [
        t for t, needs in TARGET_NEEDS.items() if all(c in installed for c in needs.controllers)
    ]
    return list(CONTROLLERS), used


def controller_findings(facts: Facts, controllers: list[Controller], named: bool) -> list[Finding]:
    """Each controller's CRDs and processes. One not installed at all (no CRD, no Deployment)
    is a WARN saying which targets cannot run, unless a named target needs it (``named``) or
    it is Kueue."""
    out = []
    deployed = {d["metadata"]["name"] for d in facts.deployments}
    for c in controllers:
        absent = "crds" not in facts.errors and not _installed(c, facts, any_crd=True)
        absent = absent and not any(p.deployment in deployed for p in c.processes)
        if absent and c is not KUEUE and not named:
            targets = [t for t, n in TARGET_NEEDS.items() if c in n.controllers]
            out.append(
                warn(
                    c.name,
                    f"not installed: target(s) {', '.join(targets)} cannot "
                    "run (doctor --target T checks one you use)",
                )
            )
            continue
        out.append(_crds(c, facts))
        for p in c.processes:
            out.append(_running(c, p, facts))
            if p.webhook_service:
                out.append(_webhooks(c, p, facts))
    return out


def kueue_integrations(facts: Facts, targets: list[str]) -> Finding:
    """Kueue queues the kinds of the targets in use (gpufleet renders them suspended: one whose
    integration is off would stay suspended)."""
    name = "kueue integrations"
    if "kueue-config" in facts.errors:
        return unreadable(name, facts.errors["kueue-config"])
    if facts.kueue_config is None:
        return warn(
            name,
            f"no ConfigMap {KUEUE_CONFIGMAP} (Kueue's configuration): cannot tell "
            "which kinds it queues",
        )
    frameworks = (facts.kueue_config.get("integrations") or {}).get("frameworks")
    if frameworks is None:
        return warn(name, "integrations.frameworks not set: Kueue's defaults apply")
    wanted = {
        t: TARGET_NEEDS[t].kueue_framework for t in targets if TARGET_NEEDS[t].kueue_framework
    }
    lacking = {t: f for t, f in wanted.items() if f not in frameworks}
    if lacking:
        what = ", ".join(f"{f} (target {t})" for t, f in lacking.items())
        return fail(
            name,
            f"Kueue does not queue {what}: such jobs stay suspended",
            f"add them to integrations.frameworks in ConfigMap {KUEUE_CONFIGMAP} and restart Kueue",
        )
    return ok(name, f"{', '.join(sorted(set(wanted.values())))}")


def kueue_pods_ready(facts: Facts) -> Finding:
    """Kueue admits all or nothing (waitForPodsReady), as the chart's Kueue settings say."""
    name = "kueue pods ready"
    if facts.kueue_config is None or "kueue-config" in facts.errors:
        return warn(name, "Kueue's configuration not read (see kueue integrations)")
    wait = facts.kueue_config.get("waitForPodsReady")
    if not wait or wait.get("enable") is False:  # v1beta1's switch
        return warn(name, "waitForPodsReady not set: a job admitted whose pods cannot all start "
                          "holds its quota while others wait",
                    f"merge {KUEUE_SETTINGS} into ConfigMap {KUEUE_CONFIGMAP}")  # fmt: skip
    backoff = (wait.get("requeuingStrategy") or {}).get("backoffBaseSeconds", 60)
    return ok(name, f"evicted after {wait.get('timeout', '?')} without all pods Ready, "
                    f"requeued after {backoff} s or more")  # fmt: skip


def _installed(c: Controller, facts: Facts, *, any_crd: bool = False) -> bool:
    present = [name in facts.crds for name, _ in c.crds]
    return any(present) if any_crd else all(present)


def _crds(c: Controller, facts: Facts) -> Finding:
    name = f"{c.name} CRDs"
    if "crds" in facts.errors:
        return unreadable(name, facts.errors["crds"])
    fix = f"install {c.name} {c.verified} (the version verified here)"
    missing = [n for n, _ in c.crds if n not in facts.crds]
    if missing:
        return fail(name, f"missing {', '.join(missing)}", fix)
    for crd, version in c.crds:
        served = [v["name"] for v in facts.crds[crd]["spec"]["versions"] if v.get("served")]
        if version not in served:
            return fail(name, f"{crd} does not serve {version} (serves {', '.join(served)})", fix)
    if c.marker is not None:
        crd, version, path, minimum = c.marker
        if not _has_field(facts.crds[crd], version, path):
            return fail(name, f"{crd} {version} has no {path}: older than {minimum}", fix)
    return ok(name, ", ".join(f"{n.split('.', 1)[0]} {v}" for n, v in c.crds))


def _has_field(crd: Obj, version: str, path: str) -> bool:
    """Whether ``crd``'s schema at ``version`` has the field at dotted ``path``."""
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    node = (schema.get("schema") or {}).get("openAPIV3Schema") or {}
    for part in path.split("."):
        node = (node.get("properties") or {}).get(part)
        if node is None:
            return False
    return True


def _running(c: Controller, p: Process, facts: Facts) -> Finding:
    """A ready Deployment named ``p.deployment``, else its Lease renewed lately."""
    name = f"{c.name} {p.deployment}"
    if "deployments" in facts.errors:
        return unreadable(name, facts.errors["deployments"])
    deployments = [d for d in facts.deployments if d["metadata"]["name"] == p.deployment]
    for d in deployments:
        ready = (d.get("status") or {}).get("readyReplicas") or 0
        want = d["spec"].get("replicas", 1)
        if ready:
            return ok(name, f"Deployment {_where(d)} ready ({ready}/{want})")
    lease = _fresh_lease(p, facts.leases, facts.now)
    if lease:
        return ok(name, lease)
    if deployments:
        d = deployments[0]
        ns = d["metadata"]["namespace"]
        return fail(
            name,
            f"Deployment {_where(d)} has no ready replica",
            f"kubectl -n {ns} describe deployment {p.deployment}",
        )
    if facts.probes.get(p.deployment) == "":
        return ok(name, "no Deployment, but its webhooks answer (a manager outside a pod)")
    if not p.lease:
        return warn(
            name,
            f"no Deployment {p.deployment}; a manager run outside a pod without "
            "leader election cannot be seen from the API",
        )
    return fail(
        name,
        f"no Deployment {p.deployment} and no Lease {p.lease} renewed lately",
        f"install {c.name} {c.verified}, or start its manager",
    )


def _webhooks(c: Controller, p: Process, facts: Facts) -> Finding:
    """Its webhooks are configured, and answered the probe's dry-run create."""
    name = f"{c.name} webhooks"
    if "webhooks" in facts.errors:
        return unreadable(name, facts.errors["webhooks"])
    if p.deployment not in facts.probes:
        return fail(name, f"no webhook configuration calls Service {p.webhook_service}: "
                          f"{c.name} is not (wholly) installed",
                    f"install {c.name} {c.verified}")  # fmt: skip
    if error := facts.probes[p.deployment]:
        fix = (f"check Service {p.webhook_service} and its serving certificate, and that the "
               "API server may reach the pods behind it")  # fmt: skip
        return fail(name, error, fix)
    kind = p.probe["kind"] if p.probe else "?"
    return ok(name, f"answer (a {kind} created with dryRun)")


def _fresh_lease(p: Process, leases: list[Obj], now: datetime) -> str:
    """'leader Lease ... renewed N s ago' when ``p``'s Lease was renewed within twice its
    duration (plus 30 s for clocks apart); '' otherwise."""
    for lease in leases:
        spec = lease.get("spec") or {}
        if lease["metadata"]["name"] != p.lease or not spec.get("renewTime"):
            continue
        renewed = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
        age = (now - renewed).total_seconds()
        if age <= 2 * (spec.get("leaseDurationSeconds") or 15) + 30:
            return f"leader Lease {_where(lease)} renewed {max(age, 0):.0f} s ago"
    return ""


def _where(obj: Obj) -> str:
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
