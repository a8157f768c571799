"""The local control plane (issue 11, item 5): `cluster up` to ready, resident memory, submit ->
admitted -> all pods Running through Kueue (ratio against the same job without a queue, in
the same run), and a 50-node run of 200 mixed jobs from two tenants with Kueue's fair sharing.

Needs the built components (make controlplane) and helm (make tools). Writes
benchmarks/results/controlplane_<hardware>_<date>.{json,md}.

    python benchmarks/controlplane.py [--reps 5] [--jobs 200] [--nodes 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml
from common import environment, median, result_path

from gpufleet.cluster import Cluster
from gpufleet.devcluster import LocalCluster, NodeSpec, State
from gpufleet.devcluster.addons import KueueSettings
from gpufleet.devcluster.kwok import RUN_FOR_A_DAY, exit_with
from gpufleet.render import render
from gpufleet.spec import validate_training_job

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "gpufleet"
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def rss_mib(state: State) -> dict[str, float]:
    out = {}
    for name, pid in state.pids.items():
        try:
            out[name] = psutil.Process(pid).memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            out[name] = 0.0
    return out


def job_doc(name: str, ns: str, nodes: int, gpus: int, queue: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": "ghcr.io/example/gpufleet:0.1.0",
        "workload": {"name": "digits"},
        "nodes": nodes,
        "procsPerNode": gpus,
        "resources": {"gpu": gpus},
        "checkpoint": {"dir": "s3://bench/ckpt"},
    }
    if queue:
        spec["queue"] = queue
    return {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip


def annotated(doc: dict[str, Any], target: str, annotations: dict[str, str]) -> list[Any]:
    objects = render(validate_training_job(doc), target)
    stack: list[Any] = list(objects)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            tpl = node.get("template")
            if isinstance(tpl, dict) and "containers" in tpl.get("spec", {}):
                meta = tpl.setdefault("metadata", {})
                meta["annotations"] = {**meta.get("annotations", {}), **annotations}
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return objects


class Api:
    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def cluster(self, ns: str) -> Cluster:
        return Cluster(self.custom, self.core, ns)

    def pods(self, ns: str, job: str) -> list[Any]:
        return list(
            self.core.list_namespaced_pod(ns, label_selector=f"gpufleet.dev/job={job}").items
        )

    def workloads(self, ns: str) -> list[dict[str, Any]]:
        return list(self.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"])


def wait(check: Any, timeout: float = 300, interval: float = 0.05) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError("benchmark step timed out")
        time.sleep(interval)
    return time.monotonic()


def helm(kubeconfig: Path, *args: str) -> None:
    subprocess.run(["helm", *args, "--kubeconfig", str(kubeconfig)], check=True,
                   capture_output=True, text=True)  # fmt: skip


def admitted(wl: dict[str, Any]) -> bool:
    return any(c["type"] == "Admitted" and c["status"] == "True"
               for c in wl.get("status", {}).get("conditions", []))  # fmt: skip


def small_run(workdir: Path, reps: int) -> dict[str, Any]:
    """3 nodes x 4 A30 with the lab chart: up time, RSS, a 2 x 4-GPU JobSet through Kueue."""
    cluster = LocalCluster(workdir / "small", log=lambda _: None)
    t0 = time.monotonic()
    state = cluster.up(NodeSpec(count=3, gpus=4))
    up_s = time.monotonic() - t0
    rss_idle = rss_mib(state)
    api = Api(cluster.kubeconfig)
    helm(cluster.kubeconfig, "install", "lab", str(CHART), "-f",
         str(CHART / "ci" / "lab-3node-a30-values.yaml"), "-n", "gpufleet-system",
         "--create-namespace", "--wait")  # fmt: skip
    api.core.create_namespace({"metadata": {"name": "plain"}})
    queued, plain = [], []
    for i in range(reps):
        for ns, queue, out in (("research", "research", queued), ("plain", None, plain)):
            name = f"bench-{'q' if queue else 'p'}-{i}"
            objects = annotated(job_doc(name, ns, 2, 4, queue), "jobset", RUN_FOR_A_DAY)
            start = time.monotonic()
            api.cluster(ns).submit(objects)
            t_adm = None
            if queue:
                t_adm = wait(lambda ns=ns, n=name: any(
                    admitted(w) for w in api.workloads(ns) if n in w["metadata"]["name"]
                ))  # fmt: skip
            t_run = wait(lambda ns=ns, n=name: len(
                [p for p in api.pods(ns, n) if p.status.phase == "Running"]) == 2
            )  # fmt: skip
            out.append({"admitted_s": (t_adm - start) if t_adm else None,
                        "running_s": t_run - start})  # fmt: skip
            api.cluster(ns).cancel(name)
            wait(lambda ns=ns, n=name: not api.pods(ns, n), timeout=120)
    rss_busy = rss_mib(state)
    cluster.down(quiet=True)
    q_run = median([r["running_s"] for r in queued])
    p_run = median([r["running_s"] for r in plain])
    return {
        "up_to_ready_s": round(up_s, 1),
        "rss_mib_idle": {k: round(v) for k, v in rss_idle.items()},
        "rss_mib_total_idle": round(sum(rss_idle.values())),
        "rss_mib_total_after_jobs": round(sum(rss_busy.values())),
        "queued_2x4_submit_to_admitted_s_median": round(
            median([r["admitted_s"] for r in queued]), 2),
        "queued_2x4_submit_to_all_running_s_median": round(q_run, 2),
        "plain_2x4_submit_to_all_running_s_median": round(p_run, 2),
        "ratio_queued_over_plain": round(q_run / p_run, 2),
        "reps": reps,
    }  # fmt: skip


def ts(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def fleet_cluster(workdir: Path, nodes: int) -> tuple[LocalCluster, State, Api, float]:
    """``nodes`` x 8 H100s, two tenants with equal nominal quotas in one cohort (borrowing
    allowed) and Kueue's fair sharing; the cluster, its state, clients, and its time to ready."""
    cluster = LocalCluster(workdir / "fleet", log=lambda _: None)
    t0 = time.monotonic()
    state = cluster.up(NodeSpec(count=nodes, gpus=8, gpu_product="NVIDIA-H100-80GB-HBM3",
                                gpu_memory_mib=81559, cpu="192", memory="2Ti"),
                       kueue=KueueSettings(fair_sharing=True),
                       timeout=300)  # fmt: skip
    up_s = time.monotonic() - t0
    api = Api(cluster.kubeconfig)
    half = nodes * 8 // 2
    tenant = lambda name: {  # noqa: E731
        "name": name, "groups": [name], "users": [],
        "quota": {"cpu": str(nodes * 192), "memory": f"{nodes * 2}Ti", "gpu": nodes * 8,
                  "pods": 2000, "persistentVolumeClaims": 10, "storage": "1Ti"},
        "limits": {"defaultCpu": "1", "defaultMemory": "4Gi"},
        "queue": {"flavors": [{"name": "h100",
                               "cpu": {"nominalQuota": str(nodes * 96)},
                               "memory": {"nominalQuota": f"{nodes}Ti"},
                               "gpu": {"nominalQuota": half}}]},
    }  # fmt: skip
    values = yaml.safe_load((CHART / "ci" / "minimal-values.yaml").read_text())
    values["flavors"] = [
        {
            "name": "h100",
            "gpu": True,
            "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        }
    ]
    values["tenants"] = [tenant("tenant-a"), tenant("tenant-b")]
    values.setdefault("kueue", {})["cohort"] = "fleet"
    vf = workdir / "fleet-values.yaml"
    vf.write_text(yaml.safe_dump(values))
    helm(cluster.kubeconfig, "install", "fleet", str(CHART), "-f", str(vf), "-n",
         "gpufleet-system", "--create-namespace", "--wait")  # fmt: skip
    return cluster, state, api, up_s


def fleet_plan(jobs: int, seed: int = 7) -> list[tuple[str, str, int, int, int]]:
    """(tenant, job, nodes, GPUs per node, run ms): half the jobs of each tenant, sizes mixed."""
    rng = random.Random(seed)
    sizes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]
    plan = []
    for t in ("tenant-a", "tenant-b"):
        for i in range(jobs // 2):
            n, g = rng.choice(sizes)
            plan.append((t, f"j{i:03d}", n, g, rng.randint(2000, 8000)))
    return plan


def fleet_run(workdir: Path, nodes: int, jobs: int, seed: int = 7) -> dict[str, Any]:
    """The fleet of fleet_cluster; tenant a submits its half first, then tenant b."""
    cluster, state, api, up_s = fleet_cluster(workdir, nodes)
    plan = fleet_plan(jobs, seed)
    start = time.monotonic()
    for t, name, n, g, ms in plan:
        api.cluster(t).submit(annotated(job_doc(name, t, n, g, t), "job", exit_with(0, ms)))
    submit_s = time.monotonic() - start
    batch = __import__("kubernetes").client.BatchV1Api(api.api)

    def done() -> bool:
        finished = 0
        for t in ("tenant-a", "tenant-b"):
            for j in batch.list_namespaced_job(t).items:
                finished += any(c.type in ("Complete", "Failed") and c.status == "True"
                                for c in (j.status.conditions or []))  # fmt: skip
        return finished >= len(plan)

    end = wait(done, timeout=1800, interval=2)
    wall = end - start
    latencies, gpu_s = [], {"tenant-a": 0.0, "tenant-b": 0.0}
    for t in ("tenant-a", "tenant-b"):
        for w in api.workloads(t):
            adm = [c for c in w["status"].get("conditions", [])
                   if c["type"] == "QuotaReserved" and c["status"] == "True"]  # fmt: skip
            if adm:
                latencies.append(
                    ts(adm[0]["lastTransitionTime"]) - ts(w["metadata"]["creationTimestamp"])
                )
        for p in api.core.list_namespaced_pod(t).items:
            cs = (p.status.container_statuses or [None])[0]
            term = cs.state.terminated if cs and cs.state else None
            if p.status.start_time and term and term.finished_at:
                gpus = int((p.spec.containers[0].resources.limits or {}).get("nvidia.com/gpu", 0))
                gpu_s[t] += gpus * (term.finished_at.timestamp() - p.status.start_time.timestamp())
    rss = rss_mib(state)
    cluster.down(quiet=True)
    latencies.sort()
    pct = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)  # noqa: E731
    total = sum(gpu_s.values()) or 1.0
    return {
        "nodes": nodes, "gpus": nodes * 8, "jobs": len(plan), "up_to_ready_s": round(up_s, 1),
        "submit_all_s": round(submit_s, 1), "wall_s": round(wall, 1),
        "admission_latency_s": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                                "max": round(latencies[-1], 1)},
        "gpu_hours": {t: round(v / 3600, 3) for t, v in gpu_s.items()},
        "gpu_share": {t: round(v / total, 3) for t, v in gpu_s.items()},
        "rss_mib_total_end": round(sum(rss.values())),
        "requested_gpu_hours": {t: round(sum(n * g * ms / 1000 for tt, _, n, g, ms in plan
                                             if tt == t) / 3600, 3) for t in gpu_s},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=50)
    args = parser.parse_args()
    if shutil.which("helm") is None:
        sys.exit("helm not on PATH (make tools; PATH=.tools/bin:$PATH)")
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    result = {"environment": environment(), "small": small_run(workdir, args.reps),
              "fleet": fleet_run(workdir, args.nodes, args.jobs)}  # fmt: skip
    print(json.dumps(result, indent=2))
    path = result_path("controlplane")
    path.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
