"""One real node: its files, identity and processes. containerd runs in the node's network
namespace and cgroup (so its shims and containers do too); the kubelet in the node's network
namespace and a mount namespace of its own, where the device plugins' fixed directory is the
node's own (two kubelets on one host would otherwise remove each other's sockets); its root
directory is a shared mount, so the volumes it mounts reach containerd; kube-proxy and
kube-router's firewall (NetworkPolicy enforcement) in the node's network namespace."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.devcluster.components import SERVICE_CIDR, Component, _get
from gpufleet.devcluster.nodes import NodeContext
from gpufleet.devcluster.realnodes import configs, images, network
from gpufleet.devcluster.realnodes.host import HostChanges
from gpufleet.devcluster.realnodes.network import run as _run

DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")  # the kubelet's fixed path
PINNED = "io.cri-containerd.pinned=pinned"  # containerd's CRI label: the kubelet never removes
ROUTER_HEALTH_PORT = 20244  # kube-router's default, on the node's own address
SNAPSHOTS = "io.containerd.snapshotter.v1.overlayfs/snapshots"  # under containerd's root
# A snapshot's files, and an overlay's read-only layers, in the mounts containerd gives.
_SNAPSHOT_DIR = re.compile(rf"/[^\s,:=]*/{re.escape(SNAPSHOTS)}/\d+/fs")
_LOWER = re.compile(r"lowerdir=([^\s,]+)")


@dataclass(frozen=True)
class RealNode:
    """Node ``index`` of ``count``, named ``name``, with ``paths``."""

    name: str
    index: int
    count: int
    paths: configs.NodePaths

    @property
    def netns(self) -> str:
        return network.netns_name(self.name)

    @property
    def runtime_cgroup(self) -> str:
        return f"{configs.cgroup_of(self.name)}/runtime"

    def prepare(self, changes: HostChanges) -> None:
        """The node's directories (its run and data directories are mount roots: ``undo``
        unmounts and removes them), network namespace and cgroups."""
        for root in (self.paths.run, self.paths.data):
            changes.add_mount_root(root)
            root.mkdir(parents=True, exist_ok=True)
        self.paths.cache.mkdir(parents=True, exist_ok=True)
        root = self.paths.kubelet_root
        root.mkdir(parents=True, exist_ok=True)
        _run("mount", "--bind", str(root), str(root))
        _run("mount", "--make-rshared", str(root))
        network.make_node_netns(changes, self.name, self.index, self.count)
        changes.make_cgroup(self.runtime_cgroup)

    def write_configs(self, ctx: NodeContext, cni_bin: Path, proxy_kubeconfig: Path,
                      taints: list[dict[str, str]]) -> None:  # fmt: skip
        """containerd's, the CNI network's, the kubelet's (its kubeconfig with a client
        certificate as system:node:<name>) and kube-proxy's."""
        run, binaries, pki = self.paths.run, ctx.binaries, ctx.pki
        (run / "cni").mkdir(exist_ok=True)
        (run / "containerd.toml").write_text(
            configs.containerd_config(self.paths, binaries, cni_bin)
        )
        (run / "cni" / "10-gpufleet.conflist").write_text(
            json.dumps(configs.cni_network(self.paths, self.index), indent=1)
        )
        (run / "kubelet.yaml").write_text(
            configs.kubelet_config(self.paths, self.name, self.index, pki.ca, taints)
        )
        kubeconfig = ctx.issue_client(f"node-{self.name}", f"system:node:{self.name}",
                                      ("system:nodes",))  # fmt: skip
        (run / "kubelet.kubeconfig").write_bytes(kubeconfig.read_bytes())
        (run / "kubelet.kubeconfig").chmod(0o600)
        (run / "kube-proxy.yaml").write_text(configs.kube_proxy_config(proxy_kubeconfig, self.name))

    def containerd(self, binaries: Path) -> Component:
        """containerd, joined to the node's runtime cgroup in every hierarchy before it
        starts (its shims and their containers stay there: ``undo`` ends them all)."""
        from gpufleet.devcluster.realnodes.host import hierarchies

        procs = " ".join(f"'{h / self.runtime_cgroup / 'cgroup.procs'}'" for h in hierarchies())
        script = f'for f in {procs}; do echo $$ > "$f"; done; exec nsenter --net="$0" -- "$@"'
        argv = ["sh", "-c", script, f"/run/netns/{self.netns}", str(binaries / "containerd"),
                "--config", str(self.paths.run / "containerd.toml")]  # fmt: skip
        env = (("PATH", f"{binaries}:/usr/sbin:/usr/bin:/sbin:/bin"),)  # its runc shim
        return Component(f"containerd@{self.name}", argv, self._containerd_ready(binaries), env)

    def _containerd_ready(self, binaries: Path) -> Callable[[], bool]:
        socket = self.paths.containerd_socket

        def ready() -> bool:
            if not socket.exists():
                return False
            argv = [str(binaries / "ctr"), "--address", str(socket), "version"]
            return subprocess.run(argv, capture_output=True, check=False).returncode == 0

        return ready

    def kubelet(self, binaries: Path, registered: Callable[[], bool]) -> Component:
        """The kubelet in the node's network namespace and a mount namespace of its own."""
        own_plugins = self.paths.run / "device-plugins"
        own_plugins.mkdir(exist_ok=True)
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        script = f'mount --bind "{own_plugins}" "{DEVICE_PLUGINS}" && exec "$0" "$@"'
        run = self.paths.run
        argv = [
            "nsenter", f"--net=/run/netns/{self.netns}", "--",
            "unshare", "--mount", "--propagation", "unchanged", "--",
            "sh", "-c", script, str(binaries / "kubelet"),
            f"--config={run / 'kubelet.yaml'}",
            f"--kubeconfig={run / 'kubelet.kubeconfig'}",
            f"--root-dir={self.paths.kubelet_root}",
            f"--cert-dir={run / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={network.node_ip(self.index)}",
        ]  # fmt: skip
        return Component(f"kubelet@{self.name}", argv, registered)

    def kube_proxy(self, binaries: Path) -> Component:
        argv = ["nsenter", f"--net=/run/netns/{self.netns}", "--", str(binaries / "kube-proxy"),
                f"--config={self.paths.run / 'kube-proxy.yaml'}"]  # fmt: skip
        return Component(f"kube-proxy@{self.name}", argv, lambda: True)

    def kube_router(self, binaries: Path, kubeconfig: Path) -> Component:
        """kube-router with its firewall alone (as k3s embeds it: the bridge CNI routes and
        kube-proxy serves Services): each pod's NetworkPolicies as iptables rules and ipsets
        in the node's namespace, which go with it. Ready when its health check answers on the
        node's address (every controller it runs has synced)."""
        address = network.node_ip(self.index)
        argv = ["nsenter", f"--net=/run/netns/{self.netns}", "--", str(binaries / "kube-router"),
                "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
                "--enable-cni=false", f"--kubeconfig={kubeconfig}",
                f"--hostname-override={self.name}", f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--health-addr={address}", f"--health-port={ROUTER_HEALTH_PORT}",
                "--metrics-port=0"]  # fmt: skip
        url = f"http://{address}:{ROUTER_HEALTH_PORT}/healthz"
        return Component(f"kube-router@{self.name}", argv, lambda: _get(url))

    def import_image(self, binaries: Path, archive: Path) -> bool:
        """Import an OCI archive into the node's containerd (the kubelet's namespace, k8s.io),
        unless every image it names is there already, unpacked (containerd's store outlives
        the cluster: a warm ``up`` imports nothing); then name each build of the project's
        image by its stable name too (images.stable_name). Images are pinned: with no
        registry, one the kubelet removed (image garbage collection, disk pressure) could not
        be pulled again. Returns whether it imported."""
        ctr = self._ctr(binaries)
        names = images.names_in(archive)
        listed = set(_listed(ctr))
        imported = not all(n in listed and _unpacked(ctr, n) for n in names)
        if imported:
            # Layers are discarded once unpacked (the snapshots are what runs): one copy a node.
            _run(*ctr, "images", "import", "--local", "--discard-unpacked-layers", "--label",
                 PINNED, str(archive))  # fmt: skip
        for name in names:
            stable = images.stable_name(name)
            if stable:  # the tag keeps the pinned label (ctr's local tag copies the record)
                _run(*ctr, "images", "tag", "--local", "--force", name, stable)
        return imported

    def layer_dirs(self, binaries: Path) -> set[Path]:
        """The directories of the node's image layers (committed snapshots, never written
        again): every snapshot's (containerd's overlayfs snapshotter: ``snapshots/<id>/fs``),
        less those that an active snapshot (a container's root, an unpacking) writes to, its
        upper or bound directory. Listed first, so that a container made meanwhile is not in it."""
        root = self.paths.containerd_root / SNAPSHOTS
        dirs = {d / "fs" for d in root.iterdir()} if root.is_dir() else set()
        ctr = self._ctr(binaries)
        rows = subprocess.run([*ctr, "snapshots", "list"], capture_output=True, text=True,
                              check=False).stdout.splitlines()[1:]  # fmt: skip
        written: set[str] = set()
        for key in (row.split()[0] for row in rows if row.split()[-1:] == ["Active"]):
            mounts = subprocess.run([*ctr, "snapshots", "mounts", "/", key], capture_output=True,
                                    text=True, check=False).stdout  # fmt: skip
            written |= written_dirs(mounts)
        return {d for d in dirs if str(d) not in written}

    def _ctr(self, binaries: Path) -> list[str]:
        """``ctr`` on the node's containerd, in the kubelet's namespace (k8s.io)."""
        return [str(binaries / "ctr"), "--address", str(self.paths.containerd_socket),
                "--namespace", "k8s.io"]  # fmt: skip

    def drop_other_builds(self, binaries: Path, names: list[str]) -> None:
        """Remove the other builds of the project's images that ``names`` has a build of
        (``localhost/gpufleet:cpu-<key>`` replaces every other ``cpu-<key>``), so that containerd
        collects their layers: the store holds one build of each flavor. Other images stay."""
        ctr = self._ctr(binaries)
        listed = _listed(ctr)
        flavors = {images.stable_name(n) for n in names} - {None}
        stale = [n for n in listed if images.stable_name(n) in flavors and n not in names]
        if not stale:
            return
        # CRI's names of the old builds by their config's digest (their image IDs) go too,
        # unless an image that stays has that config. The stable names stay, so that pods that
        # start meanwhile find an image, but they keep no ID: import_image moves them to the new
        # build, and containerd collects the old layers at its next collection.
        stays = [n for n in listed if n not in stale and n not in flavors and not _is_id(n)]
        ids = {_config_digest(ctr, n) for n in stale} - {_config_digest(ctr, n) for n in stays}
        _run(*ctr, "images", "remove", "--sync", *stale, *(i for i in ids if i in listed))


def written_dirs(mounts: str) -> set[str]:
    """The snapshot directories that ``ctr snapshots mounts`` of an active snapshot writes to:
    every one it names but its overlay's read-only layers (lowerdir)."""
    lower = {m for found in _LOWER.findall(mounts) for m in found.split(":")}
    return set(_SNAPSHOT_DIR.findall(mounts)) - lower


def _is_id(name: str) -> bool:
    """Whether ``name`` is CRI's name of an image by its ID (``sha256:<config digest>``)."""
    return name.startswith("sha256:")


def _listed(ctr: list[str]) -> list[str]:
    """The names of the images in a node's store."""
    return subprocess.run([*ctr, "images", "list", "--quiet"], capture_output=True, text=True,
                          check=False).stdout.split()  # fmt: skip


def _config_digest(ctr: list[str], name: str) -> str:
    """The digest of image ``name``'s config (read from its manifest in the store)."""
    rows = subprocess.run([*ctr, "images", "list", f"name=={name}"], capture_output=True,
                          text=True, check=False).stdout.splitlines()[1:]  # fmt: skip
    manifest = rows[0].split()[2] if rows else ""
    try:
        return str(json.loads(_content(ctr, manifest))["config"]["digest"])
    except (ValueError, KeyError):
        return ""


def _content(ctr: list[str], digest: str) -> str:
    return subprocess.run([*ctr, "content", "get", digest], capture_output=True, text=True,
                          check=False).stdout  # fmt: skip


def _unpacked(ctr: list[str], name: str) -> bool:
    """Whether image ``name``'s layers are unpacked in the node's snapshotter: the snapshot
    of its top layer's chain ID exists (a snapshot is made on its parent only). An import that
    failed part way (the disk full) leaves the image's record without its layers, and their
    compressed copies discarded: no container of it could start again (seen: every later run
    of a team's image failed with "failed to extract layer ... not found")."""
    try:
        diff_ids = json.loads(_content(ctr, _config_digest(ctr, name)))["rootfs"]["diff_ids"]
    except (ValueError, KeyError, TypeError):
        return False
    if not diff_ids:
        return False
    top = images.chain_id(diff_ids)
    info = subprocess.run([*ctr, "snapshots", "info", top], capture_output=True, check=False)
    return info.returncode == 0
