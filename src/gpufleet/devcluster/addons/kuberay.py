"""KubeRay: the Ray operator (RayCluster, RayJob, RayService), v1.6.2 from its own module
(controlplane/kuberay), installed from its config/default (CRDs, RBAC; everything in namespace
default, as the module has it). It serves no webhook (the only one it has, a RayCluster
validator, runs with ENABLE_WEBHOOKS=true, and the RayJob controller checks the same itself)
and is configured by its Deployment's flags.

It talks to each Ray head's dashboard (job submission, job status): through the API server's
service proxy (``--use-kubernetes-proxy``), as a process beside the API server cannot resolve
cluster DNS names. Kueue admits RayJobs (``ray.io/rayjob``) when it runs."""

from __future__ import annotations

from gpufleet.devcluster.addons.base import Addon, Config

KUBERAY = Addon(
    name="kuberay",
    project="kuberay",
    namespace="default",
    service_account="kuberay-operator",
    config=Config.FLAGS,
    flags=(
        "--kubeconfig={kubeconfig}",
        "--metrics-addr=127.0.0.1:{metrics}",
        "--health-probe-bind-address=127.0.0.1:{health}",
        "--leader-election-namespace=default",  # its default: the pod's namespace
        "--use-kubernetes-proxy",
    ),
    kueue_frameworks=("ray.io/rayjob",),
)
