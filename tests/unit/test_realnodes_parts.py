"""The parts of real nodes that need no root: addresses, configuration files, the journal of
host changes (and, as root only, its undo of iproute2's netns mount), shared volumes, images'
names, and the kubeconfig merge of `cluster up --kubeconfig`. The nodes themselves are tested
live (tests/cluster/test_realnodes*.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from gpufleet.devcluster.build import binaries_dir
from gpufleet.devcluster.kubeconfig import check_merge_target, merge_kubeconfig
from gpufleet.devcluster.realnodes import configs, network, storage
from gpufleet.devcluster.realnodes.host import HostChanges, mounts_under, undo
from gpufleet.devcluster.realnodes.images import names_in
from gpufleet.errors import ClusterUpError, UserInputError

PATHS = configs.NodePaths(run=Path("/run/gpufleet/n0"), data=Path("/d/n0"), cache=Path("/c/n0"))


def test_nodes_and_their_pods_get_disjoint_addresses_off_loopback() -> None:
    ips = [ipaddress.ip_address(network.node_ip(i)) for i in range(network.MAX_NODES)]
    assert len(set(ips)) == network.MAX_NODES
    assert all(ip in network.NODE_NET and not ip.is_loopback for ip in ips)
    assert str(network.HOST_IP) not in map(str, ips)
    cidrs = [ipaddress.ip_network(network.pod_cidr(i)) for i in range(4)]
    assert all(c.subnet_of(network.POD_NET) for c in cidrs)  # type: ignore[arg-type]
    assert not any(a.overlaps(b) for i, a in enumerate(cidrs) for b in cidrs[i + 1 :])


def test_containerd_config_is_toml_with_the_settings_this_host_needs(tmp_path: Path) -> None:
    doc = tomllib.loads(configs.containerd_config(PATHS, Path("/bin/x"), Path("/cni")))
    runtime = doc["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE here
    assert runtime["netns_mounts_under_state_dir"] is True  # not /run/netns: undo finds them
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["BinaryName"] == "/bin/x/runc"
    images = doc["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == configs.SANDBOX_IMAGE
    assert doc["grpc"]["address"] == "/run/gpufleet/n0/containerd.sock"
    assert len(doc["grpc"]["address"].encode()) < 108  # a unix socket's path limit


def test_kubelet_config_allows_cgroup_v1_keeps_images_and_listens_on_the_node() -> None:
    doc = yaml.safe_load(configs.kubelet_config(PATHS, "n0", 0, Path("/ca"), []))
    assert doc["failCgroupV1"] is False and doc["cgroupDriver"] == "cgroupfs"
    assert doc["cgroupRoot"] == "/gpufleet/n0"
    assert doc["imageGCHighThresholdPercent"] == 100  # no registry to pull a removed image
    # an amount, not a share of the host's (thin-provisioned) disk: not DiskPressure at 4 GB free
    disk = doc["evictionHard"]
    assert disk["nodefs.available"] == disk["imagefs.available"] == "1Gi"
    assert doc["authentication"]["anonymous"]["enabled"] is False
    assert doc["address"] == network.node_ip(0) and doc["clusterDNS"] == [network.HOST_IP]


def test_the_pod_network_is_the_nodes_own_cidr_with_nftables() -> None:
    """Pods keep their own address across nodes (no masquerade): the network policies of the
    pod reached see the pod that reaches it, not its node."""
    net = configs.cni_network(PATHS, 3)
    bridge, portmap = net["plugins"]
    assert bridge["ipam"]["ranges"] == [[{"subnet": network.pod_cidr(3)}]]
    assert bridge["ipMasq"] is False and portmap["backend"] == "nftables"
    assert bridge["ipam"]["dataDir"].startswith(str(PATHS.run))  # not /var/lib/cni


def test_coredns_answers_only_the_cluster_domain_on_the_bridge() -> None:
    text = configs.corefile(Path("/k"), 9000)
    assert f"bind {network.HOST_IP}" in text and "kubernetes cluster.local" in text
    assert "forward" not in text  # nothing is asked of servers outside the machine


@pytest.mark.skipif(not (binaries_dir() / "coredns").is_file(), reason="make controlplane first")
def test_the_built_coredns_has_every_plugin_its_corefile_names() -> None:
    # CoreDNS is built with the plugins controlplane/coredns/main.go imports, not all of them:
    # one the Corefile names and the build lacks would stop the cluster's DNS at `cluster up`.
    built = subprocess.run([str(binaries_dir() / "coredns"), "-plugins"], capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    named = set(re.findall(r"^    (\w+)", configs.corefile(Path("/k"), 9000), re.MULTILINE))
    assert named == {"bind", "errors", "ready", "kubernetes", "cache"}
    assert named <= set(built), sorted(named - set(built))
    assert "route53" not in built  # the cloud back ends are left out


def test_the_journal_survives_a_crash_and_undo_without_one_does_nothing(tmp_path: Path) -> None:
    changes = HostChanges(tmp_path / "host-changes.json")
    changes.add_link("gpufleet0")
    changes.add_netns("gpufleet-n0")
    changes.sysctls["kernel/panic"] = "1"
    changes.save()
    again = HostChanges.load(tmp_path)
    assert again is not None
    assert (again.links, again.netns, again.sysctls) == (["gpufleet0"], ["gpufleet-n0"],
                                                         {"kernel/panic": "1"})  # fmt: skip
    assert undo(tmp_path / "elsewhere") is False


# Run in a mount namespace of its own (the host's mount table, which the real-node tests
# compare before and after their cluster, never sees its mount).
NETNS_UNDO = """
import os, subprocess, sys
from pathlib import Path
from gpufleet.devcluster.realnodes import host
where, made = Path(sys.argv[1]), sys.argv[2]
host.NETNS_DIR = where
changes = host.HostChanges(where.parent / "host-changes.json")
changes.add_netns("gpufleet-n0")  # recorded while the directory is not a mount point
assert changes.netns_dir == "mounted", changes.netns_dir
subprocess.run(["mount", "--bind", str(where), str(where)], check=True)
(where / "theirs").touch()
host._restore_netns_dir(made)
assert host._mounted(where), "unmounted while another namespace is named there"
(where / "theirs").unlink()
host._restore_netns_dir(made)
assert not host._mounted(where), "still mounted"
assert where.exists() == (made == "mounted"), where.exists()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
@pytest.mark.parametrize("made", ["created", "mounted"])
def test_iproute2s_netns_mount_is_undone_once_no_namespace_is_named_there(
    tmp_path: Path, made: str
) -> None:
    """The first `ip netns add` on a host bind-mounts /run/netns onto itself, which `ip netns
    delete` leaves (a fresh host's real-node cluster left it mounted): undo unmounts it (and
    removes it when it was not there before), but not while another namespace is named there."""
    where = tmp_path / "netns"
    where.mkdir()
    argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-c",
            NETNS_UNDO, str(where), made]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


# Run in network and mount namespaces of their own (the host's links, which the real-node tests
# compare before and after their cluster, never see the test's), HOST_RECORD in a test directory.
ORPHAN_UNDO = """
import os, subprocess, sys
from pathlib import Path
from gpufleet.devcluster.realnodes import host
from gpufleet.devcluster.state import State
from gpufleet.errors import ClusterUpError
tmp = Path(sys.argv[1])
host.HOST_RECORD = tmp / "record.json"
def orphan(name):  # a cluster that made a link and a directory, then was never stopped
    owner = tmp / name
    owner.mkdir()
    changes = host.HostChanges(owner / host.JOURNAL, cluster=str(owner))
    changes.add_link("gpufleet-t0")
    subprocess.run(["ip", "link", "add", "gpufleet-t0", "type", "bridge"], check=True)
    changes.created_paths.append(str(tmp / "made"))
    (tmp / "made").mkdir()
    changes.save()
    return owner
def link():
    return subprocess.run(["ip", "link", "show", "gpufleet-t0"], capture_output=True).returncode < 1
alive = orphan("alive")  # its recorded process still runs: this one
exe = Path(sys.executable)
State(pids={exe.name: os.getpid()}, binaries=str(exe.parent)).write(alive)
try:
    host.undo_orphan(tmp / "new", print)
    raise SystemExit("an orphan whose process runs was undone")
except ClusterUpError as error:
    assert f"cluster down --dir {alive}" in str(error), error
assert link() and host.HOST_RECORD.exists()
host.undo_orphan(alive, print)  # its own directory: `down` undoes it, not this
assert link()
host.undo(alive)
subprocess.run(["rm", "-r", str(alive)], check=True)
# Its state gone too, but a process of it still runs (named by its files): refused as well.
unrecorded = orphan("unrecorded")
(unrecorded / "state.json").unlink(missing_ok=True)
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                            str(unrecorded / "kubelet.kubeconfig")])
# Popen returns once the child's exec has begun, before the kernel has set up its new argv:
# until then its /proc cmdline reads empty (a run of this test saw the orphan undone).
cmdline = Path(f"/proc/{sleeper.pid}/cmdline")
while b"kubelet.kubeconfig" not in cmdline.read_bytes():
    pass
try:
    host.undo_orphan(tmp / "new", print)
    raise SystemExit("an orphan whose process runs without a state was undone")
except ClusterUpError:
    pass
finally:
    sleeper.kill()
    sleeper.wait()
host.undo(unrecorded)
subprocess.run(["rm", "-r", str(unrecorded)], check=True)
gone = orphan("gone")  # its directory is gone too: only HOST_RECORD remembers
subprocess.run(["rm", "-r", str(gone)], check=True)
host.undo_orphan(tmp / "new", print)
assert not link() and not (tmp / "made").exists() and not host.HOST_RECORD.exists()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="links need root")
def test_up_undoes_what_a_cluster_never_stopped_left_and_refuses_while_it_runs(
    tmp_path: Path,
) -> None:
    """A cluster whose test run was killed left its bridge, and the next `up` failed ("File
    exists"): HOST_RECORD outlives its directory and the next `up` undoes it; while any of
    its processes runs, `up` refuses and names `down`."""
    argv = ["unshare", "--net", "--mount", "--propagation", "private", "--", sys.executable,
            "-c", ORPHAN_UNDO, str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"never stopped left on the host ({tmp_path / 'gone'})" in done.stdout, done.stdout


def test_mounts_below_a_root_come_deepest_first() -> None:
    points = mounts_under(["/proc"])
    assert points and all(p == "/proc" or p.startswith("/proc/") for p in points)
    depths = [p.count("/") for p in points]
    assert depths == sorted(depths, reverse=True)


def test_shared_volumes_are_on_every_real_node_and_read_write_many(tmp_path: Path) -> None:
    storage.make_dirs(tmp_path)
    objects = storage.shared_volumes(tmp_path, ["a", "b"])
    volumes = [o for o in objects if o["kind"] == "PersistentVolume"]
    assert len(volumes) == storage.VOLUMES
    for volume in volumes:
        terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == ["a", "b"]
        assert "ReadWriteMany" in volume["spec"]["accessModes"]
        assert Path(volume["spec"]["local"]["path"]).is_dir()


def test_image_names_come_from_the_archives_index(tmp_path: Path) -> None:
    index = {"manifests": [{"annotations": {"org.opencontainers.image.ref.name": "x/y:1"}}]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        tar.add(tmp_path / "index.json", "index.json")
    assert names_in(tmp_path / "a.tar") == ["x/y:1"]
    with tarfile.open(tmp_path / "b.tar", "w") as tar:
        tar.add(tmp_path / "a.tar", "other")
    with pytest.raises(ClusterUpError, match="not an OCI archive"):
        names_in(tmp_path / "b.tar")


def test_kubeconfig_merge_keeps_other_contexts_and_makes_ours_current(tmp_path: Path) -> None:
    ours = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpufleet-local",
        "clusters": [{"name": "gpufleet-local", "cluster": {"server": "https://new"}}],
        "users": [{"name": "admin", "user": {}}],
        "contexts": [{"name": "gpufleet-local", "context": {"cluster": "gpufleet-local"}}],
    }
    theirs = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
              "clusters": [{"name": "prod", "cluster": {"server": "https://prod"}},
                           {"name": "gpufleet-local", "cluster": {"server": "https://old"}}],
              "contexts": [{"name": "prod", "context": {"cluster": "prod"}}],
              "users": []}  # fmt: skip
    (tmp_path / "ours").write_text(yaml.safe_dump(ours))
    target = tmp_path / "config"
    target.write_text(yaml.safe_dump(theirs))
    merged = yaml.safe_load(merge_kubeconfig(tmp_path / "ours", target).read_text())
    assert merged["current-context"] == "gpufleet-local"
    servers = {c["name"]: c["cluster"]["server"] for c in merged["clusters"]}
    assert servers == {"prod": "https://prod", "gpufleet-local": "https://new"}
    assert {c["name"] for c in merged["contexts"]} == {"prod", "gpufleet-local"}
    assert target.stat().st_mode & 0o077 == 0
    (tmp_path / "bad").write_text("- a list\n")
    with pytest.raises(UserInputError, match="not a kubeconfig"):
        check_merge_target(tmp_path / "bad")


def test_crash_node_names_the_real_nodes_when_given_another_and_needs_a_cluster(
    tmp_path: Path,
) -> None:
    from gpufleet.devcluster.state import State
    from tests.support.cli import run_cli

    none = run_cli("cluster", "crash-node", "real-a30-node-0", "--dir", str(tmp_path), cwd=tmp_path)
    assert none.returncode == 1 and "no cluster with real nodes" in none.stderr, none.stderr
    changes = HostChanges(tmp_path / "host-changes.json")
    for name in ("real-a30-node-0", "real-a30-node-1"):
        changes.netns.append(network.netns_name(name))
    changes.save()
    State(binaries=str(tmp_path)).write(tmp_path)
    wrong = run_cli("cluster", "start-node", "kwok-node-0", "--dir", str(tmp_path), cwd=tmp_path)
    assert wrong.returncode == 2, wrong.stderr
    assert "NAME: not a real node of this cluster (real-a30-node-0, real-a30-node-1)" in (
        wrong.stderr
    ), wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_partition_needs_two_real_nodes_and_names_them_when_given_another(tmp_path: Path) -> None:
    from gpufleet.devcluster.state import State
    from tests.support.cli import run_cli

    one = run_cli("cluster", "partition", "real-a30-node-0", "real-a30-node-0", "--dir",
                  str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert one.returncode == 2, one.stderr
    assert "NODES: name two or more distinct real nodes" in one.stderr, one.stderr
    changes = HostChanges(tmp_path / "host-changes.json")
    changes.netns.append(network.netns_name("real-a30-node-0"))
    changes.save()
    State(binaries=str(tmp_path)).write(tmp_path)
    wrong = run_cli("cluster", "heal", "real-a30-node-0", "kwok-node-0", "--dir", str(tmp_path),
                    cwd=tmp_path)  # fmt: skip
    assert wrong.returncode == 2, wrong.stderr
    assert "NODES: not a real node of this cluster (real-a30-node-0)" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_the_metrics_pipeline_needs_real_nodes_to_scrape(tmp_path: Path) -> None:
    """kwok's pods serve no metrics: `--metrics-pipeline` alone is refused before anything
    starts (exit 2, the option named)."""
    from gpufleet.devcluster.state import State
    from tests.support.cli import run_cli

    up = run_cli("cluster", "up", "--metrics-pipeline", "--dir", str(tmp_path), cwd=tmp_path)
    assert up.returncode == 2, up.stderr
    assert "--metrics-pipeline: needs --real-nodes" in up.stderr and "Traceback" not in up.stderr
    assert State.read(tmp_path) is None


def test_prometheus_scrapes_each_pods_metrics_port_as_the_adapter_rules_read_it() -> None:
    """Only ports named metrics (the chart's PodMonitors select the same), running pods, with the
    namespace and pod labels every adapter rule maps to objects."""
    from gpufleet.devcluster.realnodes.metrics import prometheus_config
    from tests.support.serving import adapter_rules

    (job,) = prometheus_config(Path("k.kubeconfig"))["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "k.kubeconfig"}]
    kept = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"]
            if r.get("action") == "keep"}  # fmt: skip
    assert kept == {"__meta_kubernetes_pod_container_port_name": "metrics",
                    "__meta_kubernetes_pod_phase": "Running"}  # fmt: skip
    labels = {r["target_label"] for r in job["relabel_configs"] if "target_label" in r}
    for rule in adapter_rules():
        assert set(rule["resources"]["overrides"]) <= labels


def test_the_local_adapter_rules_are_the_files_with_a_window_of_four_scrapes(
    tmp_path: Path,
) -> None:
    """Every rate() of the adapter's rules reads 20 s here (4 scrapes of 5 s), not a minute;
    nothing else differs from deploy/prometheus/adapter-rules.yaml."""
    from gpufleet.devcluster.realnodes import metrics

    pipeline = metrics.MetricsPipeline(tmp_path)
    original = metrics.ADAPTER_RULES_FILE.read_text()
    local = pipeline.rules().read_text()
    assert local.count("[20s]") == original.count("[1m]") >= 2 and "[1m]" not in local
    assert local.replace("[20s]", "[1m]") == original
    assert metrics.SCRAPE_INTERVAL == "5s"


def test_the_hosts_mounts_leave_out_only_those_of_the_other_pytest_workers() -> None:
    """A full-disk test in the other xdist worker mounted its tmpfs while the real-node cluster
    started, and unmounted it before the cluster stopped: `down` was said to have left the host
    changed (seen once in a full run). The cluster's own mounts, and the host's, still count."""
    from tests.support.realnodes import cluster_mounts

    mine = Path("/tmp/pytest-of-root/pytest-10/popen-gw0")
    other = f"{mine.parent}/popen-gw1/test_a_full_disk0/tiny"
    points = ["/", "/dev/shm", "/run/netns/real-0", f"{mine}/realcluster0/state/pods/x", other,
              "/tmp/pytest-of-root/x"]  # fmt: skip
    info = "".join(f"36 35 98:0 / {p} rw,relatime - ext4 /dev/vda rw\n" for p in points)
    assert cluster_mounts(info, mine) == sorted(
        ["/", "/dev/shm", "/run/netns/real-0", f"{mine}/realcluster0/state/pods/x",
         "/tmp/pytest-of-root/x"]
    )  # fmt: skip


def test_the_hosts_processes_leave_out_only_those_of_the_other_pytest_workers() -> None:
    """The other xdist worker's versitygw (a built binary, serving its test's directory) ran
    when the real-node cluster stopped: `down` was said to have left a process (seen once in
    CI). A built binary on this worker's paths, or on none, still counts."""
    from tests.support.realnodes import cluster_process

    mine, built = Path("/tmp/pytest-of-root/pytest-30/popen-gw0"), Path("/r/.tools/controlplane")
    gw = str(built / "versitygw")
    theirs = [gw, "--port", "127.0.0.1:1", "posix", f"{mine.parent}/popen-gw1/test_x0/s3"]
    assert not cluster_process(gw, theirs, built, mine)
    assert cluster_process(gw, [gw, "posix", f"{mine}/test_y0/s3"], built, mine)
    assert cluster_process(str(built / "kubelet"), ["kubelet", f"--root-dir={mine}/n"], built, mine)
    assert cluster_process(str(built / "kubelet"), ["kubelet", "--v=2"], built, mine)
    assert not cluster_process("/usr/bin/python3", ["python3", f"{mine}/x"], built, mine)
