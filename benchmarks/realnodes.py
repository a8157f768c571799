"""Real nodes (issue 28, item 4): `cluster up --real-nodes 2` to ready once built (images
already in the nodes' stores) and its memory; submit -> both pods Running through Kueue with
the image present (against the same job with no queue, in the same run); the digits job on 2
real nodes against the same spec run locally (ratio of wall times); and recovery from a killed
training process to the first step after the restart.

Needs root, the built components (make controlplane), helm (make tools) and the image (make
image). Writes benchmarks/results/realnodes_<hardware>_<date>.{json,md}.

    python benchmarks/realnodes.py [--reps 3] [--image ARCHIVE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import environment, environment_section, median, result_path
from controlplane import CHART, Api, helm, rss_mib, wait

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' package
from tests.support.realnodes import pod_processes

from gpufleet.devcluster import LocalCluster, NodeSpec
from gpufleet.devcluster.realnodes import RealNodes
from gpufleet.devcluster.realnodes.images import image_cache, names_in
from gpufleet.devcluster.realnodes.storage import STORAGE_CLASS

REPO = Path(__file__).resolve().parents[1]
LAB = CHART / "ci" / "lab-3node-a30-values.yaml"
WORKLOAD = {"name": "digits", "steps": 40, "batchSize": 32, "logEvery": 10}


def up(directory: Path, archive: Path) -> tuple[LocalCluster, float]:
    cluster = LocalCluster(directory, log=lambda _: None)
    pool = NodeSpec(count=2, gpus=4, prefix="real-a30-node",
                    labels=(("nvidia.com/gpu.product", "NVIDIA-A30"),))  # fmt: skip
    start = time.monotonic()
    cluster.up([RealNodes([pool], images=[archive])])
    return cluster, time.monotonic() - start


def job(name: str, ns: str, image: str, queue: str | None, steps: int = 40) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "image": image, "workload": {**WORKLOAD, "steps": steps}, "nodes": 2,
        "procsPerNode": 1, "resources": {"gpu": 1}, "maxRestarts": 2,
        "checkpoint": {"dir": f"/ckpt/{name}", "everySteps": 10},
        "volumes": [{"name": "ckpt", "mountPath": "/ckpt", "claimName": "ckpt"}],
    }  # fmt: skip
    if queue:
        spec["queue"] = queue
    return {"apiVersion": "gpufleet.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip


def submit(api: Api, doc: dict[str, Any]) -> None:
    from gpufleet.render import render
    from gpufleet.spec import validate_training_job

    api.cluster(doc["metadata"]["namespace"]).submit(render(validate_training_job(doc), "job"))


def running(api: Api, ns: str, name: str) -> bool:
    pods = api.pods(ns, name)
    return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)


def phase(api: Api, ns: str, name: str) -> str:
    return str(api.cluster(ns).status(name).phase)


def claim(api: Api, ns: str) -> None:
    api.core.create_namespaced_persistent_volume_claim(ns, {
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": STORAGE_CLASS,
                 "resources": {"requests": {"storage": "1Gi"}}}})  # fmt: skip


def local_wall(workdir: Path) -> float:
    spec = workdir / "local.yaml"
    doc = job("local", "default", "unused", None)
    doc["spec"] = {k: v for k, v in doc["spec"].items() if k in ("workload", "nodes",
                   "procsPerNode", "maxRestarts")}  # fmt: skip
    doc["spec"]["checkpoint"] = {"dir": str(workdir / "local-ckpt"), "everySteps": 10}
    spec.write_text(json.dumps(doc))
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "gpufleet.cli.main", "run", str(spec), "--fresh"],
                   check=True, capture_output=True, cwd=workdir)  # fmt: skip
    return time.monotonic() - start


def recovery(api: Api, image: str, volumes: Path, crash: str) -> float:
    """After the first checkpoint, kill pod 1's training process (``crash`` "worker") or its
    whole container ("container"); seconds until a step is logged again after the resume."""
    name = f"bench-crash-{crash}"
    doc = job(name, "research", image, "research", steps=3000)
    doc["spec"]["checkpoint"]["everySteps"] = 50
    submit(api, doc)
    cluster = api.cluster("research")
    wait(lambda: list(volumes.glob(f"pv-*/{name}/*/COMPLETE.json")), timeout=300)
    pod = next(p for p in api.pods("research", name) if p.metadata.name.startswith(f"{name}-1"))
    killed_at = time.monotonic()
    for pid in pod_processes(pod.metadata.uid, worker_only=crash == "worker"):
        os.kill(pid, signal.SIGKILL)
    logs = lambda: "\n".join(cluster.logs(name))  # noqa: E731
    wait(lambda: re.search(r"resumed from .*step \d+(?s:.*)step \d+/", logs()), timeout=300)
    return time.monotonic() - killed_at


def run_once(api: Api, doc: dict[str, Any]) -> tuple[float, float]:
    """Submit ``doc``: seconds to both pods Running, and to the job's end."""
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    start = time.monotonic()
    submit(api, doc)
    started = wait(lambda: running(api, ns, name)) - start
    done = wait(lambda: phase(api, ns, name) in ("Succeeded", "Failed")) - start
    return started, done


def measure(workdir: Path, archive: Path, reps: int) -> dict[str, Any]:
    (image,) = names_in(archive)
    ups = []
    for _ in range(reps):
        cluster, up_s = up(workdir / "c", archive)
        ups.append(up_s)
        cluster.down(quiet=True)
    cluster, _ = up(workdir / "c", archive)
    try:
        state = cluster.state_if_running()
        assert state is not None
        rss = rss_mib(state)
        api = Api(cluster.kubeconfig)
        helm(cluster.kubeconfig, "install", "lab", str(CHART), "-f", str(LAB), "-n",
             "gpufleet-system", "--set", "monitoring.exporter.enabled=false",
             "--create-namespace", "--wait")  # fmt: skip
        api.core.create_namespace({"metadata": {"name": "plain"}})
        for ns in ("research", "plain"):
            claim(api, ns)
        to_running: dict[str, list[float]] = {"queued": [], "plain": []}
        walls = []
        for i in range(reps):
            for ns, queue, key in (("research", "research", "queued"), ("plain", None, "plain")):
                started, done = run_once(api, job(f"bench-{key}-{i}", ns, image, queue))
                to_running[key].append(started)
                walls += [done] if key == "queued" else []
        local = [local_wall(workdir) for _ in range(reps)]
        volumes = cluster.dir / "volumes"
        recover_s = {c: recovery(api, image, volumes, c) for c in ("worker", "container")}
    finally:
        cluster.down(quiet=True)
    return {
        "up_to_ready_s": ups, "rss_mib": rss,
        "submit_to_running_s": to_running,
        "digits_real_wall_s": walls, "digits_local_wall_s": local,
        "recovery_kill_to_step_s": recover_s,
    }  # fmt: skip


def report(result: dict[str, Any], env: dict[str, str], out: Path) -> None:
    r = result
    nodes_rss = {k: v for k, v in r["rss_mib"].items() if "@" in k or k == "coredns"}
    queued, plain = (median(r["submit_to_running_s"][k]) for k in ("queued", "plain"))
    real, local = median(r["digits_real_wall_s"]), median(r["digits_local_wall_s"])
    ups = r["up_to_ready_s"]
    lines = [
        "# Real nodes: cluster up, Kueue to Running, digits on 2 nodes, recovery", "",
        f"- `cluster up --real-nodes 2` to ready, images present: median {median(ups):.1f} s "
        f"({', '.join(f'{x:.1f}' for x in ups)})",
        f"- the nodes' processes: {sum(nodes_rss.values()):.0f} MiB resident "
        f"({', '.join(f'{k} {v:.0f}' for k, v in sorted(nodes_rss.items()))})",
        f"- submit -> 2 pods Running: through Kueue median {queued:.2f} s, no queue "
        f"{plain:.2f} s (ratio {queued / plain:.2f})",
        f"- digits 2 x 1, 40 steps, submit -> Succeeded: median {real:.1f} s on real nodes, "
        f"{local:.1f} s locally (`gpufleet run`): ratio {real / local:.2f}",
        "- recovery, pod 1's training process killed -> a step logged after the resume: "
        f"{r['recovery_kill_to_step_s']['worker']:.1f} s; its whole container killed (the "
        f"Job's new pod joins): {r['recovery_kill_to_step_s']['container']:.1f} s",
        "", *environment_section(env),
    ]  # fmt: skip
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"env": env, **r}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--image", type=Path, default=image_cache() / "gpufleet-cpu.tar")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gf-realnodes-") as tmp:
        result = measure(Path(tmp), args.image.resolve(), args.reps)
    out = result_path("realnodes")
    report(result, environment(), out)
    print(out.read_text())


if __name__ == "__main__":
    main()
