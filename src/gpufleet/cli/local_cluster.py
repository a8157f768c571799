"""``gpufleet cluster up | down | status``: the local control plane (real Kubernetes components
built from their Go modules, kwok's fake GPU nodes) on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from gpufleet.cli.common import fail
from gpufleet.console import err_console
from gpufleet.devcluster import LocalCluster, NodeSpec
from gpufleet.devcluster.addons import SEALED_SECRETS, KueueSettings
from gpufleet.devcluster.build import KUBESEAL
from gpufleet.devcluster.kubeconfig import check_merge_target, merge_kubeconfig
from gpufleet.devcluster.nodes import pools_from_values
from gpufleet.devcluster.platform import helm_command, platform_values, write_values
from gpufleet.devcluster.realnodes import RealNodes, real_pools
from gpufleet.devcluster.realnodes.images import names_in
from gpufleet.devcluster.state import DEFAULT_DIR
from gpufleet.errors import EXIT_FAILED, ClusterUpError, FieldError, UserInputError
from gpufleet.spec.units import parse_duration

NODE_DEFAULTS = NodeSpec()
local_cluster = typer.Typer(
    help="A local Kubernetes cluster built from source: the control plane (etcd, "
    "kube-apiserver, controller-manager, scheduler), fake GPU nodes (kwok) and, as root, real "
    "nodes that run containers (kubelet, containerd, runc).",
    no_args_is_help=True,
)
DirOption = Annotated[
    Path, typer.Option("--dir", help="State directory: certificates, kubeconfig, logs.")
]


# up's options, one alias each (the command's signature stays readable).
NodesOption = Annotated[int, typer.Option(help="Fake nodes (0 allowed beside --real-nodes).")]
GpusOption = Annotated[int, typer.Option(help="nvidia.com/gpu per node.")]
ProductOption = Annotated[str, typer.Option(help="The nodes' nvidia.com/gpu.product label.")]
WithoutOption = Annotated[
    list[str] | None,
    typer.Option(
        help="Leave a controller out (kueue, jobset, training-operator, mpi-operator, "
        "trainer, volcano; repeatable)."
    ),
]
WithOption = Annotated[
    list[str] | None,
    typer.Option(
        "--with",
        help="Run an optional controller too: sealed-secrets (Sealed Secrets' controller; "
        "seal with kubeseal and the certificate `up` prints; root only; repeatable).",
    ),
]
FairSharingOption = Annotated[
    bool, typer.Option(help="Turn on Kueue's fair sharing among a cohort's queues.")
]
PodsReadyOption = Annotated[
    str | None,
    typer.Option(
        help="Kueue's waitForPodsReady timeouts (e.g. 20s; default: the chart's, "
        "deploy/helm/gpufleet/files/kueue-config.yaml): an admitted job whose pods are not all "
        "Ready by then is evicted and requeued."
    ),
]
PodDelayOption = Annotated[
    int | None,
    typer.Option(
        help="At most this many ms at each step of a fake pod's life (created, ready, "
        "completed); kwok's own Stages wait 1-5 s at each. For fast tests.",
        min=0,
    ),
]
RealNodesOption = Annotated[
    int,
    typer.Option(
        help="Real nodes beside the fake ones (root only): each a kubelet with containerd "
        "and runc that runs containers, with the GPUs of --gpus-per-node advertised.",
        min=0,
    ),
]
ImageOption = Annotated[
    list[Path] | None,
    typer.Option(
        help="An OCI archive imported into every real node (no registry here; repeatable).",
    ),
]
MetricsOption = Annotated[
    bool,
    typer.Option(
        help="With --real-nodes: Prometheus (every pod's port named metrics) and Prometheus "
        "Adapter (custom.metrics.k8s.io, the metrics an InferenceService's autoscaler scales "
        "on) on the host.",
    ),
]
ValuesOption = Annotated[
    Path | None,
    typer.Option(
        help="A platform chart values file (deploy/helm/gpufleet/ci/...): --nodes nodes per "
        "flavor, with its node labels and the Kueue topology's levels."
    ),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option(
        help="Also write the cluster's context into this kubeconfig (merged into one that "
        "exists, made current), as kind does."
    ),
]


@local_cluster.command()
def up(
    nodes: NodesOption = NODE_DEFAULTS.count,
    gpus_per_node: GpusOption = NODE_DEFAULTS.gpus,
    gpu_product: ProductOption = NODE_DEFAULTS.gpu_product,
    without: WithoutOption = None,
    with_: WithOption = None,
    kueue_fair_sharing: FairSharingOption = False,
    pods_ready_timeout: PodsReadyOption = None,
    pod_delay_ms: PodDelayOption = None,
    real_nodes: RealNodesOption = 0,
    image: ImageOption = None,
    metrics_pipeline: MetricsOption = False,
    values: ValuesOption = None,
    kubeconfig: KubeconfigOption = None,
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Build what is missing, start the control plane and wait until it is ready."""
    _check(nodes, gpus_per_node, real_nodes, image or [], metrics_pipeline)
    pools = _pools(values, nodes, gpus_per_node, gpu_product)
    kinds: list[Any] = list(pools) if nodes else []
    if real_nodes:
        real = real_pools(pools, real_nodes)
        kinds.append(RealNodes(real, images=list(image or []), metrics=metrics_pipeline))
    cluster = LocalCluster(directory, log=err_console.print)
    try:
        if kubeconfig is not None:
            check_merge_target(kubeconfig)
        kueue = KueueSettings(kueue_fair_sharing, _go_duration(pods_ready_timeout))
        state = cluster.up(kinds, without=tuple(without or ()), with_=tuple(with_ or ()),
                           kueue=kueue, pod_delay_ms=pod_delay_ms)  # fmt: skip
    except ClusterUpError as exc:
        err_console.print(f"cluster up failed: {exc}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    except UserInputError as exc:
        fail(exc)
    described = [p.describe() for p in pools if p.count and nodes]
    described += [f"{real_nodes} real node(s)"] if real_nodes else []
    exported = cluster.kubeconfig
    if kubeconfig is not None:
        exported = merge_kubeconfig(cluster.kubeconfig, kubeconfig)
    err_console.print(
        f"API server {state.server}; {', '.join(described)}"
        f"\n  export KUBECONFIG={exported}"
        f"\n  {_platform(directory, real_nodes, image or [], without or [], values)}"
        f"{_kubeseal(directory, Path(state.binaries), with_ or [])}"
        "\n  gpufleet cluster down   # when done",
        markup=False,
    )


def _platform(
    directory: Path, real_nodes: int, images: list[Path], without: list[str], values: Path | None
) -> str:
    """Write the chart values this cluster needs into its state directory (devcluster/
    platform.py); the helm command that installs the platform with them, its paths as the
    user gave them (relative ones: to where `up` ran, where the command is to run)."""
    names = [n for archive in images for n in names_in(archive)]
    volcano = "volcano" not in without
    written = write_values(directory, platform_values(real_nodes=bool(real_nodes), images=names,
                                                      volcano=volcano))  # fmt: skip
    return f"{helm_command(written, values)}   # the platform chart, from the repository's root"


def _kubeseal(directory: Path, binaries: Path, with_: list[str]) -> str:
    """With Sealed Secrets: how to seal a Secret offline, with the controller's certificate."""
    if SEALED_SECRETS.project not in with_:
        return ""
    cert = directory / f"{SEALED_SECRETS.name}.pem"
    return (f"\n  {binaries / KUBESEAL} --cert {cert} -f secret.yaml -w sealed.yaml"
            "   # seal a Secret offline; kubectl apply -f sealed.yaml")  # fmt: skip


def _check(nodes: int, gpus: int, real_nodes: int, images: list[Path], metrics: bool) -> None:
    """The numbers and archives make sense together (exit 2 with every field that does not)."""
    least = 0 if real_nodes else 1  # real nodes alone, or kwok's beside them
    bad = [FieldError("--nodes", f"must be at least {least}")] if nodes < least else []
    bad += [FieldError("--gpus-per-node", "must be 0 or more")] if gpus < 0 else []
    bad += [FieldError("--image", f"{p} is not a file (an OCI archive: make image)")
            for p in images if not p.is_file()]  # fmt: skip
    bad += [FieldError("--image", "needs --real-nodes")] if images and not real_nodes else []
    # kwok's pods serve no metrics: nothing to scrape or scale on
    bad += (
        [FieldError("--metrics-pipeline", "needs --real-nodes")]
        if metrics and not real_nodes
        else []
    )
    if bad:
        fail(UserInputError(bad))


def _pools(values: Path | None, nodes: int, gpus: int, product: str) -> list[NodeSpec]:
    """The fake nodes' pools: one, or one per flavor of a chart values file."""
    if values is None:
        return [NodeSpec(count=nodes, gpus=gpus, gpu_product=product)]
    try:
        loaded = yaml.safe_load(values.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(UserInputError([FieldError("--values", f"cannot read {values}: {exc}")]))
    if not isinstance(loaded, dict):
        fail(UserInputError([FieldError("--values", f"{values} is not a values mapping")]))
    return pools_from_values(loaded, nodes, gpus, product)


@local_cluster.command()
def down(directory: DirOption = DEFAULT_DIR) -> None:
    """Stop every component the state directory's cluster started."""
    stopped = LocalCluster(directory, log=err_console.print).down()
    if not stopped:
        err_console.print("nothing was running")


@local_cluster.command(name="status")
def status_cmd(directory: DirOption = DEFAULT_DIR) -> None:
    """Each component: running, or exited (with its log). Exit 1 if any has exited."""
    states = LocalCluster(directory).status()
    if not states:
        err_console.print("no local cluster was started here (gpufleet cluster up)")
        raise typer.Exit(EXIT_FAILED)
    for name, state in states.items():
        print(f"{name}: {state}")
    if any(s != "running" for s in states.values()):
        raise typer.Exit(EXIT_FAILED)


@local_cluster.command(name="crash-node")
def crash_node(
    name: Annotated[str, typer.Argument(help="A real node's name (kubectl get nodes).")],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """A real node's power cut, for failure drills: its wire cut, then its kubelet, runtime
    and containers killed at once. `start-node` brings it back."""
    from gpufleet.devcluster.realnodes import chaos

    try:
        killed = chaos.crash(directory, name)
    except (ClusterUpError, UserInputError) as exc:
        fail(exc)
    err_console.print(f"{name}: wire cut; kubelet, kube-proxy, containerd and {killed} "
                      "processes of its pods and runtime killed")  # fmt: skip


@local_cluster.command(name="start-node")
def start_node(
    name: Annotated[str, typer.Argument(help="A real node `crash-node` stopped.")],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Bring a crashed real node back, as after a reboot: its wire, containerd, kubelet and
    kube-proxy."""
    from gpufleet.devcluster.realnodes import chaos

    try:
        chaos.start(directory, name, log=err_console.print)
    except (ClusterUpError, UserInputError) as exc:
        fail(exc)
    err_console.print(f"{name}: started; Ready again with its kubelet's next heartbeat")


@local_cluster.command(name="load")
def load_cmd(
    archives: Annotated[list[Path], typer.Argument(help="OCI archives of images.")],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Import images into every real node, as `kind load image-archive` does: your own image
    (docs/images.md), for a job's spec.image, with no registry."""
    from gpufleet.devcluster.realnodes.load import load

    try:
        names = load(directory, archives, log=err_console.print)
    except (ClusterUpError, UserInputError) as exc:
        fail(exc)
    err_console.print(f"loaded into every real node: {', '.join(names)}")


NodesArgument = Annotated[list[str], typer.Argument(help="Two or more real nodes' names.")]


@local_cluster.command(name="partition")
def partition_cmd(nodes: NodesArgument, directory: DirOption = DEFAULT_DIR) -> None:
    """Cut the pod network between real nodes, for failure drills: every packet between
    their pods dropped; the nodes stay Ready. `heal` routes them again."""
    _partition(nodes, directory, cut=True)


@local_cluster.command(name="heal")
def heal_cmd(nodes: NodesArgument, directory: DirOption = DEFAULT_DIR) -> None:
    """Route the pod network between real nodes again after `partition`."""
    _partition(nodes, directory, cut=False)


def _partition(nodes: list[str], directory: Path, cut: bool) -> None:
    from gpufleet.devcluster.realnodes import chaos

    try:
        names = chaos.partition(directory, nodes, cut)
    except (ClusterUpError, UserInputError) as exc:
        fail(exc)
    what = "cut: their packets dropped" if cut else "routed again"
    err_console.print(f"the pod network between {', '.join(names)}: {what}")


def _go_duration(text: str | None) -> str | None:
    """A duration option as Go's time.ParseDuration reads it (seconds), or exit 2."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        fail(UserInputError([FieldError("--pods-ready-timeout", str(exc))]))
    if seconds <= 0:
        fail(UserInputError([FieldError("--pods-ready-timeout", f"must be positive, got {text}")]))
    return f"{round(seconds * 1000)}ms"  # Go's time.ParseDuration: no exponent notation
