"""The chart values that a local cluster needs before the platform chart can run on it.

``gpufleet cluster up`` writes them into its state directory (``platform-values.yaml``, beside
the kubeconfig) and prints the helm command that installs the chart with them on top of one of
the chart's ``ci/`` values files. The tests install the chart on the local clusters the same way
(tests/support/realnodes.py), so the path a user walks is the one the suite proves.

What differs from a real cluster:
- real nodes reach the API server, CoreDNS and the host's services (an object store, the
  metrics pipeline's Prometheus) on the host's bridge address, which the network policies must
  let through;
- no registry: the exporter runs the project's image imported with ``--image``, by the stable
  name that every node gives it (``localhost/gpufleet:cpu``), and never pulls;
- no GPU, no NVIDIA runtime and no device plugin: the exporter simulates the node's GPUs (GPU 0
  falls off the bus on SIGUSR1, XID 79: the device-fault drill), and attributes none to pods;
- a real node has the host's CPUs: the exporter requests none, so that two one-CPU training
  pods still fit on one node;
- Volcano's Queues are rendered when the cluster runs Volcano.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufleet.devcluster.realnodes.images import stable_name
from gpufleet.devcluster.realnodes.network import HOST_IP
from gpufleet.kube import Obj

VALUES_FILE = "platform-values.yaml"
CHART = "deploy/helm/gpufleet"
# The chart's example values whose GPU flavor the local nodes' labels match (4 "A30" a node).
EXAMPLE_VALUES = f"{CHART}/ci/lab-3node-a30-values.yaml"
RELEASE, NAMESPACE = "gpufleet", "gpufleet-system"
# The chart's network-policy values that name addresses outside the cluster's pods.
HOST_NETWORKS = ("dnsCIDRs", "apiServerCIDRs", "egressCIDRs", "monitoringCIDRs")
# The exporter's simulated GPUs a node, and the one that fails on SIGUSR1 with its XID.
SIMULATED_GPUS, FAILING = 4, (0, 79)


def platform_values(*, real_nodes: bool, images: list[str], volcano: bool) -> Obj:
    """The values for a local cluster: ``images``, the names in the archives given with
    ``--image`` (the exporter runs the project's by its stable name, which every node gives
    it); with real nodes but no project image, the exporter is off (nothing could run it)."""
    values: Obj = {"volcano": {"enabled": volcano}}
    if not real_nodes:
        return values  # kwok's nodes run no process: nothing reaches out, nothing is scraped
    values["networkPolicy"] = {key: [f"{HOST_IP}/32"] for key in HOST_NETWORKS}
    project = [s for s in map(stable_name, images) if s]
    if not project:
        values["monitoring"] = {"exporter": {"enabled": False}}
        return values
    repository, tag = project[0].rsplit(":", 1)
    failing = f"--simulate-failure={FAILING[0]}:{FAILING[1]}"
    values["monitoring"] = {"exporter": {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "runtimeClassName": "",
        "podResources": {"enabled": False, "podLabels": False},
        "resources": {"requests": {"cpu": 0}},
        "extraArgs": [f"--simulate={SIMULATED_GPUS}", failing],
    }}  # fmt: skip
    return values


def write_values(state_dir: Path, values: Obj) -> Path:
    """``values`` as ``platform-values.yaml`` in the cluster's state directory."""
    path = state_dir / VALUES_FILE
    header = "# Written by `gpufleet cluster up` for this local cluster (devcluster/platform.py)\n"
    path.write_text(header + yaml.safe_dump(values, sort_keys=False))
    return path


def helm_command(values_path: Path, chart_values: Path | None = None) -> str:
    """The command that installs the platform chart on the local cluster, from the repository's
    root: the chart values the cluster's pools came from (``cluster up --values``; else the
    example whose flavor its nodes' labels match), then this cluster's on top."""
    example = chart_values or EXAMPLE_VALUES
    return (f"helm install {RELEASE} {CHART} -n {NAMESPACE} --create-namespace "
            f"-f {example} -f {values_path} --wait")  # fmt: skip
