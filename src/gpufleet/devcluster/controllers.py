"""Starting the controllers (``addons``) on a running control plane: install a project's
manifests, wait for its CRDs, run its manager, prove its webhooks answer through the API
server, apply its own objects; and the CRDs of projects that do not run here."""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.devcluster import addons
from gpufleet.devcluster.addons import LOOPBACK, Addon, Certs, Ready, sealed
from gpufleet.devcluster.api import Api, wait
from gpufleet.devcluster.components import Component, controller_runtime_manager
from gpufleet.devcluster.pki import Pki, write_kubeconfig
from gpufleet.devcluster.processes import Processes
from gpufleet.errors import ClusterUpError

# How often a controller's manager is started again when it exits before it is ready.
ADDON_RESTARTS = 3


@dataclass(frozen=True)
class Controllers:
    """The controllers of one cluster being started."""

    binaries: Path
    directory: Path
    pki: Pki
    server: str
    api: Api
    processes: Processes
    timeout: float
    log: Callable[[str], None]

    def start_all(self, enabled: list[Addon], kueue: addons.KueueSettings) -> None:
        """Start ``enabled`` side by side (each mostly waits: on its CRDs, certificates,
        readiness), in two waves: first those that install manifests and need no other
        controller, then the rest (the Trainer needs JobSet's kinds, Volcano's controllers and
        scheduler its CRDs)."""
        first = [a for a in enabled if a.installs and not a.requires]
        for wave in (first, [a for a in enabled if a not in first]):
            with ThreadPoolExecutor(max_workers=max(1, len(wave))) as pool:
                started = [pool.submit(self.start, a, enabled, kueue) for a in wave]
                for done in started:
                    done.result()  # the first failure, once every start has ended

    def start(self, addon: Addon, running: list[Addon], kueue: addons.KueueSettings) -> None:
        """Install the addon's manifests, wait for its CRDs, run its manager, then prove its
        webhooks answer through the API server. Kueue gets the integrations of the controllers
        in ``running`` and ``kueue``'s settings."""
        docs = addons.load_manifests(addons.manifest_path(self.binaries, addon))
        extra: dict[str, Any] = {}
        if addon is addons.KUEUE:
            extra = addons.kueue_config(docs, running, kueue)
        ports = self.processes.state.ports
        p = addons.Ports(*(ports[f"{addon.name}-{u}"] for u in ("webhook", "health", "metrics")))
        config = addons.prepare(addon, self.pki, self.directory, docs, p, extra)
        if addon.installs:  # the project's first process installs its manifests
            running_config = config.read_text() if config is not None else None
            objects = addons.cluster_objects(addon, docs, self.pki.ca.read_bytes(), p.webhook,
                                             running_config)  # fmt: skip
            self.api.create_all(objects)
            names = list(addons.crd_names(objects))
            self._wait(lambda: self.api.crds_established(names), f"{addon.name}'s CRDs Established")
        kc = write_kubeconfig(self.directory / f"{addon.name}.kubeconfig", self.server, self.pki,
                              addon.name)  # fmt: skip
        argv = addons.argv(addon, self.binaries / addon.name, config, kc, p, self.directory,
                           self.pki.ca)  # fmt: skip
        env = addons.environment(addon, self.directory, kc)
        if addon.in_cluster:
            argv, env = self._in_cluster(addon, argv, env)
        manager = self._manager(addon, argv, p, env)
        self.processes.start(manager, self.timeout, restarts=ADDON_RESTARTS)
        if addon.public_cert:
            url = f"http://{LOOPBACK}:{p.health}{addon.public_cert}"
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    (self.directory / f"{addon.name}.pem").write_bytes(answer.read())
            except OSError as exc:
                raise ClusterUpError(f"{addon.name}: no certificate at {url}: {exc}") from None
        if addon.probe is not None:
            probe = addon.probe
            self._wait(lambda: self.api.dry_run(probe), f"{addon.name}'s webhooks")
        if addon.after_ready:
            own = addons.load_manifests(self.binaries / "manifests" / f"{addon.after_ready}.yaml")
            self.api.create_custom(own)
            self.log(f"  {len(own)} {addon.after_ready} applied")

    def _in_cluster(
        self, addon: Addon, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        """What a manager that reads only the in-cluster configuration runs with: its
        ServiceAccount's files (a token the API server issues) in a mount namespace of its
        own, and a pod's environment instead of $KUBECONFIG."""
        account = sealed.service_account_dir(addon, self.directory)
        token = self.api.service_account_token(addon.namespace, addon.service_account,
                                               sealed.TOKEN_SECONDS)  # fmt: skip
        sealed.write_service_account(account, token, self.pki.ca.read_bytes(), addon.namespace)
        env = {k: v for k, v in env.items() if k != "KUBECONFIG"}
        env |= sealed.in_cluster_env(self.server, addon.namespace)
        return sealed.in_cluster_argv(argv, account), env

    def _manager(
        self, addon: Addon, argv: list[str], ports: addons.Ports, env: dict[str, str]
    ) -> Component:
        """The manager as a component, ready as its mode says; with a rotated certificate, once
        its Secret is mounted too."""
        if addon.ready == Ready.LEASE:
            lease = addon.ready_lease
            manager = Component(addon.name, argv,
                                lambda: self.api.lease_held(addon.namespace, lease),
                                tuple(env.items()))  # fmt: skip
        else:
            manager = controller_runtime_manager(addon.name, argv, ports.health, env,
                                                 path=addon.ready_path,
                                                 tls=addon.ready == Ready.HTTPS)  # fmt: skip
        if addon.certs != Certs.ROTATED:
            return manager
        ready, certs = manager.ready, addons.cert_dir(addon, self.directory)
        fixed = addons.FIXED_CERT_CHECK if addon.tmpdir_certs else None
        if fixed is not None:  # a previous cluster's would open the gate before ours exist
            fixed.unlink(missing_ok=True)

        def mounted_and_ready() -> bool:
            return self.mount_secret(addon, certs, fixed) and ready()

        return Component(manager.name, manager.argv, mounted_and_ready, manager.env)

    def mount_secret(self, addon: Addon, directory: Path, fixed: Path | None = None) -> bool:
        """The kubelet's part for a manager outside a pod: once the Secret its rotation writes
        holds a serving certificate, put it where the manager reads it (and at ``fixed``, a path
        the manager only checks exists). False until then."""
        if (directory / "tls.crt").exists():
            if fixed is not None and not fixed.exists():
                fixed.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(directory / "tls.crt", fixed)
            return True
        pair = self.api.tls_secret(addon.namespace, addon.cert_secret)
        if pair is None:
            return False
        addons.write_certs(directory, *pair)
        return True

    def install_other_crds(self) -> None:
        """The CRDs of projects a cluster of the chart's design has but that do not run here
        (Prometheus Operator, Volcano, KEDA, KServe, Multus: controlplane/crds.txt), from
        their modules; only the CRDs of a file that holds more (Multus' daemonset manifest)."""
        served = self.api.served_crds()
        docs = [d for f in sorted((self.binaries / "crds").glob("*.y*ml"))
                for d in addons.load_manifests(f) if d.get("kind") == addons.CRD]  # fmt: skip
        # Those a running controller installed already (Volcano's, when it runs) stay its own.
        self.api.create_all([d for d in docs if d["metadata"]["name"] not in served])
        names = list(addons.crd_names(docs))
        self._wait(lambda: self.api.crds_established(names),
                   f"{len(docs)} CRDs of other projects Established")  # fmt: skip

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        wait(check, what, self.timeout, self.log)
