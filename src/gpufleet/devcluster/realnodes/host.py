"""What real nodes change on the host, recorded before each change is made (``HostChanges``,
``host-changes.json`` in the cluster's directory, and its copy ``HOST_RECORD`` at a fixed place)
and undone by ``undo``: after ``down``, and after a crash of ``up`` or of the nodes, the host is
as it was. A cluster that is never stopped (the program that ran it killed, its directory
removed with it) is undone by the next ``up`` with real nodes (``undo_orphan``).

The changes: network namespaces and links (network.py), cgroups (each node's root in every
cgroup v1 hierarchy), mounts (everything mounted under a node's directories: the kubelet's
volumes, containerd's snapshots and pod network namespaces), the global sysctls the kubelet
sets (their old values), and fixed paths the components create when missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devcluster.state import State
from gpufleet.errors import ClusterUpError

JOURNAL = "host-changes.json"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Global (not per network namespace) sysctls the kubelet sets at start (kubelet's
# pkg/kubelet/cm/container_manager_linux.go setupKernelTunables), restored by ``undo``.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Fixed paths the kubelet and containerd create whatever their configuration says: removed by
# ``undo`` when they were not there before.
FIXED_PATHS = (
    "/var/lib/kubelet",  # the device plugins' socket directory is fixed (kubelet's constant)
    "/var/log/containers",  # the kubelet's links to container logs
    "/var/lib/cni",  # libcni's result cache (containerd's CNI)
    "/run/containerd",  # containerd shims' sockets (/run/containerd/s)
    "/etc/cni",
    "/opt/cni",
    "/run/gpufleet",  # the nodes' run directories (RUN_ROOT)
    "/var/lib/gpufleet",  # the nodes' data directories (DATA_ROOT)
)
# Short fixed roots: the kubelet and containerd make unix sockets below them, and a socket's
# path has at most 107 bytes (a checkout's or a test's temporary directory is too deep).
RUN_ROOT = "/run/gpufleet"  # sockets and runtime state (tmpfs)
DATA_ROOT = "/var/lib/gpufleet"  # the kubelet's root (pods' emptyDirs) and pod logs, on disk
# iproute2's directory of named network namespaces: its first `ip netns add` creates it and
# makes it a mount point (a shared bind mount of itself), which `ip netns delete` leaves.
NETNS_DIR = Path("/run/netns")
# The copy of the real-node cluster's journal at a fixed place: it outlives the cluster's
# directory (often a test's temporary one), so the next `up` finds what a cluster that was
# never stopped left. One at a time: the bridge, RUN_ROOT and DATA_ROOT are fixed names.
HOST_RECORD = Path("/var/lib/gpufleet-host-changes.json")


@dataclass
class HostChanges:
    """The journal of one cluster's host changes (appended to and saved before each change)."""

    path: Path
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)  # relative to each hierarchy, parents first
    mount_roots: list[str] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)
    created_paths: list[str] = field(default_factory=list)
    # What the first `ip netns add` made of NETNS_DIR: "" nothing, "mounted" a mount point of
    # a directory that was there, "created" the directory and its mount.
    netns_dir: str = ""
    # The cluster's directory, when its journal is also kept as HOST_RECORD (real nodes' `up`).
    cluster: str = ""

    @classmethod
    def load(cls, directory: Path) -> HostChanges | None:
        """The journal in ``directory``, or HOST_RECORD when it names ``directory``."""
        path = directory / JOURNAL
        data = _read_json(path)
        if data is None:
            data = _read_json(HOST_RECORD)
            if data is None or data.get("cluster") != str(directory):
                return None
        return cls(path=path, **{k: v for k, v in data.items() if k != "path"})

    def save(self) -> None:
        data = json.dumps({k: v for k, v in asdict(self).items() if k != "path"}, indent=1)
        for path in (self.path, HOST_RECORD) if self.cluster else (self.path,):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(data)
            tmp.replace(path)

    def add_netns(self, name: str) -> None:
        if not self.netns and not _mounted(NETNS_DIR):
            self.netns_dir = "mounted" if NETNS_DIR.is_dir() else "created"
        self.netns.append(name)
        self.save()

    def add_link(self, name: str) -> None:
        self.links.append(name)
        self.save()

    def add_mount_root(self, path: Path) -> None:
        self.mount_roots.append(str(path))
        self.save()

    def remember_sysctls(self) -> None:
        """The kubelet's global sysctls as they are now (the first value seen is kept)."""
        for key in KUBELET_SYSCTLS:
            self.sysctls.setdefault(key, (Path("/proc/sys") / key).read_text().strip())
        self.save()

    def remember_fixed_paths(self) -> None:
        for path in FIXED_PATHS:
            if not os.path.lexists(path) and path not in self.created_paths:
                self.created_paths.append(path)
        self.save()

    def make_cgroup(self, relative: str) -> None:
        """``relative`` in every cgroup v1 hierarchy (cpuset's cpus and mems copied from the
        parent, which v1 leaves empty), parents first."""
        parts = Path(relative).parts
        for depth in range(1, len(parts) + 1):
            sub = str(Path(*parts[:depth]))
            if sub not in self.cgroups:
                self.cgroups.append(sub)
                self.save()
            for hierarchy in hierarchies():
                path = hierarchy / sub
                if path.is_dir():
                    continue
                path.mkdir()
                if hierarchy.name == "cpuset":
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (path / knob).write_text((path.parent / knob).read_text())


def hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies (v1 controllers, named ones, and v2's in hybrid mode)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, *_ = line.split()
        if kind in ("cgroup", "cgroup2") and where.startswith(str(CGROUP_ROOT)):
            found.append(Path(where))
    return found


def cgroup_pids(relative: str) -> set[int]:
    """Every process in ``relative`` or below it, in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in hierarchies():
        top = hierarchy / relative
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            try:
                pids |= {int(p) for p in procs.read_text().split()}
            except OSError:
                continue
    return pids


def kill_cgroup(relative: str, timeout: float = 10) -> int:
    """SIGKILL every process in ``relative`` (the node's containers, shims and runtime: all
    started by this cluster) until none is left. Returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(relative)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return len(killed)


def mounts_under(roots: list[str]) -> list[str]:
    """Mount points at or below any of ``roots``, deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == r or point.startswith(r.rstrip("/") + "/") for r in roots):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def unmount_all(roots: list[str]) -> None:
    """Unmount everything below ``roots`` (lazily: a busy mount goes once its users do)."""
    for _ in range(5):  # a mount stacked over another shows again once the top one goes
        points = mounts_under(roots)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_cgroups(cgroups: list[str]) -> None:
    """rmdir each cgroup and everything below it, in every hierarchy, deepest first."""
    for hierarchy in hierarchies():
        for relative in reversed(cgroups):
            top = hierarchy / relative
            if not top.is_dir():
                continue
            for sub in sorted((p for p in top.rglob("*") if p.is_dir()),
                              key=lambda p: -len(p.parts)):  # fmt: skip
                _rmdir(sub)
            _rmdir(top)


def _rmdir(path: Path) -> None:
    for _ in range(50):  # a cgroup whose last process just died can be busy for a moment
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def _restore_netns_dir(made: str) -> None:
    """NETNS_DIR as it was before our first namespace: unmounted, and removed when we created
    it; left as it is while any namespace (another program's) is still named there."""
    if not made or not _mounted(NETNS_DIR) or any(NETNS_DIR.iterdir()):
        return
    subprocess.run(["umount", str(NETNS_DIR)], capture_output=True, check=False)
    if made == "created" and not _mounted(NETNS_DIR):
        _rmdir(NETNS_DIR)


def _mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point (a bind mount on the same file system included, which
    os.path.ismount does not see)."""
    return str(path) in mounts_under([str(path)])


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def undo_orphan(directory: Path, log: Callable[[str], None]) -> None:
    """Before real nodes start for the cluster in ``directory``: the changes HOST_RECORD keeps
    for another cluster undone once none of that cluster's processes runs (it was never
    stopped: its `up`, its nodes or the program that ran it died, its directory maybe gone);
    ClusterUpError while one does."""
    data = _read_json(HOST_RECORD)
    if data is None or not data.get("cluster") or data["cluster"] == str(directory):
        return
    owner = Path(data["cluster"])
    state = State.read(owner)
    alive = state is not None and any(state.alive(name) for name in state.pids)
    if alive or _runs_from(owner):
        raise ClusterUpError(f"the real nodes of the cluster in {owner} still run: "
                             f"`gpufleet cluster down --dir {owner}` first")  # fmt: skip
    log(f"  undoing what a cluster that was never stopped left on the host ({owner})")
    undo(owner, log)


def _runs_from(directory: Path) -> bool:
    """Whether a process names a file in ``directory`` on its command line (a component of
    the cluster there: every one is given its kubeconfig, data or configuration in it), even
    when the directory's state is gone."""
    needle = (str(directory).rstrip("/") + "/").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def undo(directory: Path, log: Callable[[str], None] | None = None) -> bool:
    """Undo every change the journal of ``directory`` records; False when there is none."""
    changes = HostChanges.load(directory)
    if changes is None:
        return False
    for relative in reversed(changes.cgroups):
        kill_cgroup(relative)
    unmount_all(changes.mount_roots)
    remove_cgroups(changes.cgroups)
    for name in reversed(changes.netns):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    _restore_netns_dir(changes.netns_dir)
    for name in reversed(changes.links):
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
    for key, value in changes.sysctls.items():
        (Path("/proc/sys") / key).write_text(value)
    for path in changes.created_paths:
        shutil.rmtree(path, ignore_errors=True)
    if not mounts_under(changes.mount_roots):  # never remove through a mount left behind
        for root in changes.mount_roots:
            shutil.rmtree(root, ignore_errors=True)
    changes.path.unlink(missing_ok=True)
    record = _read_json(HOST_RECORD)
    if changes.cluster and record is not None and record.get("cluster") == changes.cluster:
        HOST_RECORD.unlink(missing_ok=True)
    if log is not None:
        log("  host restored: namespaces, links, cgroups, mounts, sysctls")
    return True
