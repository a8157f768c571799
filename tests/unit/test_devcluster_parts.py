"""The local control plane's pure parts: the API server's flags and the fake GPU nodes it creates
(its PKI: test_devcluster_pki.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.devcluster.components import KWOK_NODE_ANNOTATION, kube_apiserver
from gpufleet.devcluster.kwok import node_object
from gpufleet.devcluster.nodes import NodeSpec
from gpufleet.devcluster.pki import make_pki
from tests.support.paths import REPO


def test_gpu_nodes_carry_capacity_discovery_labels_taint_and_kwok_annotation() -> None:
    node = node_object("n0", NodeSpec(gpus=4, gpu_product="NVIDIA-H100-80GB-HBM3"), 0)
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    key, value = KWOK_NODE_ANNOTATION
    assert node["metadata"]["annotations"] == {key: value}
    cpu_only = node_object("c0", NodeSpec(gpus=0), 1)
    assert "nvidia.com/gpu" not in cpu_only["status"]["capacity"] and not cpu_only["spec"]["taints"]


def test_the_api_server_listens_on_loopback_only_and_secured(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    argv = kube_apiserver(Path("kube-apiserver"), pki, 6443, 2379).argv
    assert "--bind-address=127.0.0.1" in argv
    assert "--authorization-mode=Node,RBAC" in argv
    assert f"--client-ca-file={pki.ca}" in argv
    assert "--allow-privileged=false" in argv
    assert not any(a.startswith(("--insecure", "--anonymous-auth=true")) for a in argv)


def test_down_never_signals_a_process_that_is_not_ours(tmp_path: Path) -> None:
    """A pid in state.json whose component died long ago may belong to another program now
    (here: this test's own interpreter): down skips it and status reports the component gone."""
    import os

    from gpufleet.devcluster import LocalCluster, State

    State(pids={"etcd": os.getpid()}, ports={"etcd": 1}, server="https://127.0.0.1:1",
          binaries=str(tmp_path / "bin")).write(tmp_path)  # fmt: skip
    cluster = LocalCluster(tmp_path, log=lambda _: None)
    assert cluster.status()["etcd"].startswith("exited")
    assert cluster.down() == []  # and this process is still here to assert it
    assert State.read(tmp_path) is None
    (tmp_path / "state.json").write_text("{not json")
    assert State.read(tmp_path) is None and cluster.status() == {}


def test_node_pools_follow_the_charts_flavors_and_topology() -> None:
    """`cluster up --values ci/onprem-50node-values.yaml`: a pool per flavor whose nodes carry
    the flavor's nodeLabels (Kueue's ResourceFlavors select by them), GPUs only on GPU flavors
    (product from the flavor's label), and a value for each Kueue topology level."""
    import yaml

    from gpufleet.devcluster.nodes import pools_from_values

    values = yaml.safe_load(
        (REPO / "deploy/helm/gpufleet/ci/onprem-50node-values.yaml").read_text()
    )
    cpu, h100 = pools_from_values(values, count=2, gpus=8, gpu_product="NVIDIA-A30")
    assert (cpu.prefix, cpu.gpus, h100.prefix, h100.gpus) == ("cpu-node", 0, "h100-node", 8)
    node = node_object("h100-node-1", h100, 1)
    labels = node["metadata"]["labels"]
    assert labels["gpufleet.dev/pool"] == "gpu"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["topology.gpufleet.dev/rack"] == "rack-1"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    cpu_node = node_object("cpu-node-0", cpu, 0)
    assert cpu_node["metadata"]["labels"]["gpufleet.dev/pool"] == "cpu"
    assert "nvidia.com/gpu" not in cpu_node["status"]["capacity"]
    for flavor in values["flavors"]:  # every flavor's nodeLabels select its pool's nodes
        pool = {"cpu": cpu_node, "h100": node}[flavor["name"]]
        assert flavor["nodeLabels"].items() <= pool["metadata"]["labels"].items()


def _kueue_manifests(frameworks: list[str]) -> list[dict[str, Any]]:
    config = {"kind": "Configuration", "integrations": {"frameworks": frameworks}}
    return [{"kind": "ConfigMap", "metadata": {"name": "kueue-manager-config"},
             "data": {"controller_manager_config.yaml": yaml.safe_dump(config)}}]  # fmt: skip


def test_kueue_gets_the_integration_of_each_controller_that_runs() -> None:
    """A queued PyTorchJob or TFJob stays suspended unless Kueue's kubeflow.org/pytorchjob or
    kubeflow.org/tfjob integration is on (its default configuration leaves both off): on when
    the training-operator runs, not otherwise, and never twice."""
    from gpufleet.devcluster.addons import JOBSET, KUEUE, TRAINING_OPERATOR, kueue_frameworks

    docs = _kueue_manifests(["batch/job", "jobset.x-k8s.io/jobset"])
    with_it = kueue_frameworks(docs, [KUEUE, JOBSET, TRAINING_OPERATOR])["integrations"]
    assert with_it["frameworks"] == [
        "batch/job",
        "jobset.x-k8s.io/jobset",
        "kubeflow.org/pytorchjob",
        "kubeflow.org/tfjob",
    ]
    without = kueue_frameworks(docs, [KUEUE, JOBSET])["integrations"]
    assert without["frameworks"] == ["batch/job", "jobset.x-k8s.io/jobset"]
    already = _kueue_manifests(["kubeflow.org/pytorchjob"])
    assert kueue_frameworks(already, [TRAINING_OPERATOR])["integrations"]["frameworks"] == [
        "kubeflow.org/pytorchjob",
        "kubeflow.org/tfjob",
    ]


def test_the_training_operator_runs_on_loopback_with_its_own_certificate_directory(
    tmp_path: Path,
) -> None:
    """Flags with this cluster's ports, listeners on 127.0.0.1 where it has a flag for it, no
    MPIJob scheme (the MPI operator's), and $TMPDIR (where its webhook server reads the
    certificate) inside the cluster's directory, never the machine's /tmp."""
    from gpufleet.devcluster.addons import TRAINING_OPERATOR, Ports, argv, cert_dir, environment

    ports = Ports(webhook=41001, health=41002, metrics=41003)
    args = argv(TRAINING_OPERATOR, Path("/bin/to"), None, tmp_path / "kc", ports)
    assert args[0] == "/bin/to"
    assert f"--kubeconfig={tmp_path / 'kc'}" in args
    assert "--metrics-bind-address=127.0.0.1:41003" in args
    assert "--health-probe-bind-address=127.0.0.1:41002" in args
    assert "--webhook-server-port=41001" in args
    assert "--enable-scheme=pytorchjob" in args and "--enable-scheme=mpijob" not in args
    env = environment(TRAINING_OPERATOR, tmp_path, tmp_path / "kc")
    assert env["MY_POD_NAMESPACE"] == "kubeflow"
    assert env["KUBECONFIG"] == str(tmp_path / "kc")  # its own, never the user's
    tmp = Path(env["TMPDIR"])
    assert tmp.is_relative_to(tmp_path)
    assert cert_dir(TRAINING_OPERATOR, tmp_path) == tmp / "k8s-webhook-server" / "serving-certs"


def test_the_training_operator_leaves_mpijobs_to_the_mpi_operator() -> None:
    """Its install manifests minus the MPIJob CRD (kubeflow.org/v2beta1 belongs to the MPI
    operator), its Deployment and Service replaced by a loopback ExternalName, its webhooks
    called on the local port."""
    from gpufleet.devcluster.addons import TRAINING_OPERATOR, cluster_objects

    def crd(name: str) -> dict[str, Any]:
        return {"kind": "CustomResourceDefinition", "metadata": {"name": name}, "spec": {}}

    docs = [
        crd("mpijobs.kubeflow.org"),
        crd("pytorchjobs.kubeflow.org"),
        {"kind": "Deployment", "metadata": {"name": "training-operator"}},
        {"kind": "Service", "metadata": {"name": "training-operator", "namespace": "kubeflow"},
         "spec": {"type": "ClusterIP", "ports": [{"port": 443}]}},
        {"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "validator"},
         "webhooks": [{"clientConfig": {"service": {"name": "training-operator", "port": 443}}}]},
    ]  # fmt: skip
    out = cluster_objects(TRAINING_OPERATOR, docs, b"CA", 41001)
    assert [(o["kind"], o["metadata"]["name"]) for o in out] == [
        ("CustomResourceDefinition", "pytorchjobs.kubeflow.org"),
        ("Service", "training-operator"),
        ("ValidatingWebhookConfiguration", "validator"),
    ]
    assert (
        out[1]["spec"]["type"] == "ExternalName" and out[1]["spec"]["externalName"] == "127.0.0.1"
    )
    hook = out[2]["webhooks"][0]["clientConfig"]
    assert hook["service"]["port"] == 41001 and "caBundle" not in hook  # its rotation injects it


def test_pods_of_the_training_operators_kinds_complete_as_a_jobs_do(tmp_path: Path) -> None:
    """kwok's pod-complete Stage ends only pods a Job owns; the derived Stage ends a
    PyTorchJob's pods the same way, and a changed kwok Stage is an error, not a silent miss."""
    import pytest

    from gpufleet.devcluster.kwok import owner_complete_stage
    from gpufleet.errors import ClusterUpError

    stage = {
        "kind": "Stage",
        "metadata": {"name": "pod-complete"},
        "spec": {"selector": {"matchExpressions": [
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
        ]}},
    }  # fmt: skip
    kwok = tmp_path / "kwok"
    kwok.mkdir()
    (kwok / "pod-complete.yaml").write_text(yaml.safe_dump(stage))
    derived = yaml.safe_load(owner_complete_stage(kwok, tmp_path / "out").read_text())
    assert derived["metadata"]["name"] == "pod-complete-training-operator"
    owners = derived["spec"]["selector"]["matchExpressions"][1]["values"]
    assert "PyTorchJob" in owners and "Job" not in owners and "MPIJob" not in owners
    stage["spec"]["selector"]["matchExpressions"].pop()
    (kwok / "pod-complete.yaml").write_text(yaml.safe_dump(stage))
    with pytest.raises(ClusterUpError, match="pod-complete Stage changed"):
        owner_complete_stage(kwok, tmp_path / "out")


def test_a_port_held_on_loopback_is_not_free_for_a_server_on_every_interface() -> None:
    """The MPI operator listens on :8080 whatever it is told; a port any program holds (on
    127.0.0.1 or everywhere) is reported busy before the cluster starts, a released one not."""
    import socket

    from gpufleet.net import port_free

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not port_free(port)
    assert port_free(port)


def test_ports_chosen_together_are_distinct() -> None:
    """Every listener of the cluster gets its own port: chosen while all are held (separate
    free_port() calls once gave Volcano's controller the webhook's port)."""
    from gpufleet.net import free_ports

    ports = free_ports(40)
    assert len(set(ports)) == 40


def test_cluster_ports_are_ones_the_kernel_never_hands_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control plane's ports come from below the kernel's ephemeral range (no connection
    opened meanwhile takes one before its listener starts), skipping a held one; with no room
    below that range, from the kernel's own."""
    import socket

    from gpufleet import net

    span = tmp_path / "ip_local_port_range"
    span.write_text("32768\t60999\n")
    monkeypatch.setattr(net, "EPHEMERAL_RANGE", span)
    split = net.QUIET_FLOOR + net.CLUSTER_SPAN
    assert net.quiet_ports(cluster=True) == range(net.QUIET_FLOOR, split)
    assert net.quiet_ports() == range(split, 32768)  # every other caller's: apart
    ports = net.free_ports(40, cluster=True)
    assert len(set(ports)) == 40 and all(net.QUIET_FLOOR <= p < split for p in ports), ports
    assert all(split <= net.free_port() < 32768 for _ in range(20))  # one at a time

    with socket.socket() as held:
        held.bind(("127.0.0.1", ports[0]))
        with monkeypatch.context() as narrow:
            narrow.setattr(net, "quiet_ports", lambda **_: range(ports[0], ports[0] + 8))
            (port,) = net.free_ports(1)
        assert ports[0] < port < ports[0] + 8

    span.write_text("1024 65535\n")
    assert not net.quiet_ports()
    ports = net.free_ports(3)
    assert len(set(ports)) == 3 and all(p >= 1024 for p in ports)


def test_volcanos_processes_share_its_manifests_and_leave_together() -> None:
    """Volcano runs as three processes installed from one manifest; `--without volcano` names
    the project, and the scheduler's metrics listener is on loopback (its default is :8080 on
    every interface, the MPI operator's fixed port)."""
    from gpufleet.devcluster.addons import (
        PROJECTS,
        VOLCANO_ADMISSION,
        VOLCANO_CONTROLLERS,
        VOLCANO_SCHEDULER,
        Ports,
        argv,
        manifest_path,
    )

    where = Path("/bin")
    for addon in (VOLCANO_ADMISSION, VOLCANO_CONTROLLERS, VOLCANO_SCHEDULER):
        assert manifest_path(where, addon) == where / "manifests" / "volcano.yaml"
        assert addon.project == "volcano"
    assert "volcano" in PROJECTS and "vc-scheduler" not in PROJECTS
    args = argv(VOLCANO_SCHEDULER, where / "vc-scheduler", None, Path("kc"), Ports(1, 2, 3),
                Path("/w"), Path("ca.crt"))  # fmt: skip
    assert "--listen-address=127.0.0.1:3" in args and "--healthz-address=127.0.0.1:2" in args
    assert "--scheduler-conf=/w/vc-scheduler-files/volcano-scheduler.conf" in args


def test_capped_pod_stages_shorten_only_pod_delays_and_keep_annotated_ones(tmp_path: Path) -> None:
    """`cluster up --pod-delay-ms`: each Pod Stage's own delay and jitter capped; a node Stage
    (the heartbeat's 10 minutes) and a pod's annotated delay (RUN_FOR_A_DAY) left as they are."""
    from gpufleet.devcluster.kwok import capped_pod_stages

    annotated = {
        "expressionFrom": '.metadata.annotations["pod-complete.stage.kwok.x-k8s.io/delay"]'
    }
    stages = {
        "pod-complete.yaml": {"kind": "Stage", "spec": {"resourceRef": {"kind": "Pod"}, "delay": {
            "durationMilliseconds": 1000, "durationFrom": annotated,
            "jitterDurationMilliseconds": 5000}}},
        "node-heartbeat.yaml": {"kind": "Stage", "spec": {"resourceRef": {"kind": "Node"},
            "delay": {"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000}}},
        "pod-delete.yaml": {"kind": "Stage", "spec": {"resourceRef": {"kind": "Pod"}}},
    }  # fmt: skip
    kwok = tmp_path / "kwok"
    kwok.mkdir()
    for name, stage in stages.items():
        (kwok / name).write_text(yaml.safe_dump(stage))
    out = capped_pod_stages(kwok, tmp_path / "out", 300)
    got = {p.name: yaml.safe_load(p.read_text()) for p in out.glob("*.yaml")}
    assert set(got) == set(stages)
    pod = got["pod-complete.yaml"]["spec"]["delay"]
    assert pod == {"durationMilliseconds": 300, "durationFrom": annotated,
                   "jitterDurationMilliseconds": 300}  # fmt: skip
    assert got["node-heartbeat.yaml"] == stages["node-heartbeat.yaml"]
    assert got["pod-delete.yaml"] == stages["pod-delete.yaml"]


def test_an_addon_whose_fields_contradict_its_modes_is_refused_when_declared() -> None:
    """The modes are enums checked against the fields they need: a rotated certificate without
    the Secret it lands in, flags for a file-configured manager, a Lease-ready manager without
    its Lease, a webhook without a probe are errors at import, not if-chains at start."""
    from gpufleet.devcluster.addons import ADDONS, Addon, Certs, Config, Ready

    base = {"name": "x", "project": "x", "namespace": "ns", "service_account": "sa"}
    Addon(**base)  # no webhook, file config, HTTP readiness: consistent
    for wrong, field in [
        ({"certs": Certs.ROTATED, "webhook_service": "svc", "probe": {}}, "cert_secret"),
        ({"flags": ("--a",)}, "flags"),
        ({"config": Config.FLAGS}, "flags"),
        ({"ready": Ready.LEASE}, "ready_lease"),
        ({"certs": Certs.ISSUED, "webhook_service": "svc"}, "probe"),
        ({"webhook_service": "svc"}, "webhook_service"),
    ]:
        with pytest.raises(ValueError, match=field):
            Addon(**base, **wrong)  # type: ignore[arg-type]
    assert {a.project for a in ADDONS if not a.installs} == {"volcano"}
    assert all(a.installs for a in ADDONS if a.project != "volcano")


def test_kwok_nodes_create_their_nodes_and_the_nvidia_runtime_class_only_with_gpus() -> None:
    """kwok's node kind: every pool's nodes by name, and the RuntimeClass the GPU Operator
    installs only when some node has GPUs."""
    from gpufleet.devcluster.kwok import KwokNodes

    gpu, cpu = NodeSpec(count=2, gpus=4, prefix="g"), NodeSpec(count=1, gpus=0, prefix="c")
    names = [(o["kind"], o["metadata"]["name"]) for o in KwokNodes([gpu, cpu]).objects()]
    assert names == [("Node", "g-0"), ("Node", "g-1"), ("Node", "c-0"), ("RuntimeClass", "nvidia")]
    kinds = [o["kind"] for o in KwokNodes([cpu]).objects()]
    assert kinds == ["Node"]


def test_state_keeps_the_start_order_and_down_stops_newest_first(tmp_path: Path) -> None:
    """state.json records components in the order they started (a restarted one keeps its
    place); a state written before the order was kept is read in the build's order; `up`'s
    success is recorded, so a half-started cluster is never taken for a running one."""
    from gpufleet.devcluster import LocalCluster, State

    state = State(server="https://127.0.0.1:1", binaries=str(tmp_path))
    for name, pid in [("etcd", 11), ("kube-apiserver", 12), ("kwok", 13), ("etcd", 14)]:
        state.record(name, pid)
    state.write(tmp_path)
    read = State.read(tmp_path)
    assert read is not None and read.started == ["etcd", "kube-apiserver", "kwok"]
    assert read.pids["etcd"] == 14 and not read.complete
    legacy = {"pids": {"kwok": 1, "etcd": 2, "kube-scheduler": 3}, "ports": {}, "server": ""}
    (tmp_path / "state.json").write_text(json.dumps(legacy))
    old = State.read(tmp_path)
    assert old is not None and old.started == ["etcd", "kube-scheduler", "kwok"]
    assert LocalCluster(tmp_path, log=lambda _: None).state_if_running() is None


def test_kueue_runs_with_the_charts_all_or_nothing_admission_and_a_tests_timeout() -> None:
    """The local Kueue's configuration takes waitForPodsReady and the metrics from the chart's
    documented settings; `--pods-ready-timeout` shortens both its timeouts (tests)."""
    import yaml

    from gpufleet.devcluster.addons import (
        KUEUE,
        KueueSettings,
        chart_kueue_config,
        kueue_config,
    )

    module = {"integrations": {"frameworks": ["batch/job"]}}
    docs = [{"kind": "ConfigMap", "metadata": {"name": "kueue-manager-config"},
             "data": {"controller_manager_config.yaml": yaml.safe_dump(module)}}]  # fmt: skip
    chart = chart_kueue_config()
    plain = kueue_config(docs, [KUEUE], KueueSettings())
    assert plain["waitForPodsReady"] == chart["waitForPodsReady"]
    assert plain["metrics"] == {"enableClusterQueueResources": True}
    assert "fairSharing" not in plain
    fast = kueue_config(docs, [KUEUE], KueueSettings(fair_sharing=True, pods_ready_timeout="15s"))
    wait = fast["waitForPodsReady"]
    assert wait["timeout"] == wait["recoveryTimeout"] == "15s"
    assert wait["requeuingStrategy"] == chart["waitForPodsReady"]["requeuingStrategy"]
    assert "fairSharing" in fast and fast["integrations"]["frameworks"] == ["batch/job"]
