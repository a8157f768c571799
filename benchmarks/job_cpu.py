"""What one job costs the machine in CPU, by kind (issue 50, item 1): the unit prices behind the
suite's table (benchmarks/suite_durations.py), which sees a test's own process and the children
it reaped only, not a cluster's daemons, the real nodes' containers, nor the forkserver's workers.

- a local digits run (`gpufleet run`, 1 node x 2 processes, 40 steps): each process's CPU,
  followed while it lives (psutil), beside the whole machine's busy time (/proc/stat);
- a real-node digits job (2 pods x 1 process, 40 steps, through Kueue, one per target, one after
  another, on the suite's cluster: tests/support/realnodes.py): the machine's busy time, the
  pods' (the nodes' cgroups, cpuacct), this process's (the kubernetes client's polls, the CLI
  calls), and each daemon's (/proc);
- the same cluster idle: what it costs while nothing runs.

Needs root, the built components (make controlplane), helm (make tools) and the image (make
image) for the real nodes; run it on an otherwise quiet machine. Writes
benchmarks/results/job-cpu_<hardware>_<date>.{md,json}.

    python benchmarks/job_cpu.py [--targets job,pytorchjob,job] [--local-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from common import environment, environment_section, machine_busy, result_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the tests' package: the suite's cluster, job and spec
from tests.support.specs import digits_job, write_spec  # noqa: E402

PODS_CGROUP = Path("/sys/fs/cgroup/cpuacct/gpufleet/cpuacct.usage")  # the nodes' (cgroup v1)
IDLE_S = 30
Snapshot = dict[int, tuple[str, float]]  # pid: (name, CPU-seconds so far)


def daemons() -> Snapshot:
    """Every process's name and CPU-seconds so far."""
    out = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is not None:
            out[proc.pid] = (proc.info["name"], times.user + times.system)
    return out


def by_name(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU-seconds per process name between two ``daemons()``, of the processes alive in both."""
    use: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        if pid in before:
            use[name] = use.get(name, 0.0) + cpu - before[pid][1]
    return {k: round(v, 1) for k, v in sorted(use.items(), key=lambda x: -x[1])[:8]}


def own_cpu() -> float:
    """This process's CPU-seconds and its reaped children's."""
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def local_role(proc: psutil.Process, cli: int, cli_line: str) -> str:
    """A local run's process by what it is: the workers by their name (gpufleet-rank<N>), the
    forkserver by being the agent's fork (its command line the agent's: launch/zygote.py) or
    the stdlib's (``multiprocessing.forkserver`` on its command line), the resource tracker."""
    line = " ".join(proc.cmdline())
    if proc.pid == cli:
        return "gpufleet run (the CLI and the node agent)"
    if proc.name().startswith("gpufleet-rank"):
        return "the workers"
    if "forkserver" in line or line == cli_line:
        return "the forkserver"
    return "others (multiprocessing's resource tracker)"


def local_run() -> dict[str, Any]:
    """`gpufleet run` of the digits job: each process's CPU (its role by its command line)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_spec(Path(tmp), digits_job("cost"))
        busy, started = machine_busy(), time.monotonic()
        cli = subprocess.Popen([sys.executable, "-m", "gpufleet.cli.main", "run", str(spec),
                                "-o", "json"], cwd=tmp, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
        seen: Snapshot = {}
        root = psutil.Process(cli.pid)
        cli_line = " ".join(root.cmdline())
        while cli.poll() is None:
            for proc in [root, *root.children(recursive=True)]:
                try:
                    role, times = local_role(proc, cli.pid, cli_line), proc.cpu_times()
                except psutil.Error:
                    continue
                seen[proc.pid] = (role, times.user + times.system)
            time.sleep(0.05)
        assert cli.returncode == 0, f"the local run failed ({cli.returncode})"
    roles: dict[str, float] = {}
    for role, cpu in seen.values():
        roles[role] = round(roles.get(role, 0.0) + cpu, 1)
    return {"wall_s": round(time.monotonic() - started, 1),
            "machine_cpu_s": round(machine_busy() - busy, 1), "by_role": roles}  # fmt: skip


class Factory:
    """What the suite's cluster fixtures ask of pytest's TempPathFactory: a new directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def getbasetemp(self) -> Path:
        return self.root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path


def pods_cpu() -> float:
    return int(PODS_CGROUP.read_text()) / 1e9 if PODS_CGROUP.exists() else 0.0


def real_node_jobs(targets: list[str], root: Path) -> dict[str, Any]:
    """The suite's real-node cluster with the lab's chart; one digits job per target, one after
    another, each measured from its submit to its cancel; then the cluster idle."""
    from tests.support.realnodes import TENANT, real_job, session_lab, session_real_cluster

    os.environ["PATH"] = f"{REPO / '.tools' / 'bin'}:{os.environ['PATH']}"  # helm, as make's
    cluster_up = session_real_cluster(Factory(root))  # type: ignore[arg-type]
    fixtures = [cluster_up]
    jobs = []
    try:  # the fixtures' ends run here, while ``root`` (the cluster's state) still exists
        cluster = next(cluster_up)
        fixtures.insert(0, session_lab(cluster))
        cluster = next(fixtures[0])
        time.sleep(5)  # the chart's pods settle
        for index, target in enumerate(targets):
            name = f"cost-{index}-{target}"
            path = write_spec(cluster.root, real_job(name, 2, 1), f"{name}.yaml")
            before, busy, pods, own = daemons(), machine_busy(), pods_cpu(), own_cpu()
            started = time.monotonic()
            submit = cluster.gpufleet("submit", str(path), "--target", target)
            assert submit.returncode == 0, submit.stderr[-2000:]
            phase, _ = cluster.run_to_end(name, TENANT, timeout=600)
            assert phase == "Succeeded", f"{name}: {phase}"
            cluster.gpufleet("cancel", name, "-n", TENANT)
            jobs.append({"target": target, "wall_s": round(time.monotonic() - started, 1),
                         "machine_cpu_s": round(machine_busy() - busy, 1),
                         "pods_cpu_s": round(pods_cpu() - pods, 1),
                         "this_process_cpu_s": round(own_cpu() - own, 1),
                         "daemons_cpu_s": by_name(before, daemons())})  # fmt: skip
        time.sleep(IDLE_S)  # the job's pods go
        before, busy = daemons(), machine_busy()
        time.sleep(IDLE_S)
        idle = {"seconds": IDLE_S, "machine_cpu_s": round(machine_busy() - busy, 1),
                "daemons_cpu_s": by_name(before, daemons())}  # fmt: skip
    finally:
        for fixture in fixtures:
            next(fixture, None)
    return {"jobs": jobs, "idle": idle}


def report(result: dict[str, Any]) -> list[str]:
    local = result["local"]
    lines = ["# What one job costs the machine in CPU (benchmarks/job_cpu.py)", "",
             "## A local digits run (1 node x 2 processes, 40 steps)", "",
             f"Wall {local['wall_s']} s, the machine busy {local['machine_cpu_s']} CPU-s.", "",
             "| process | CPU-s |", "|---|---:|",
             *[f"| {k} | {v} |" for k, v in local["by_role"].items()], ""]  # fmt: skip
    real = result.get("real")
    if real:
        lines += ["## Real-node digits jobs (2 pods x 1 process, 40 steps, through Kueue)", "",
                  "| target | wall (s) | machine CPU-s | pods' CPU-s | this process's CPU-s |"
                  " daemons' CPU-s (largest) |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for job in real["jobs"]:
            top = ", ".join(f"{k} {v}" for k, v in job["daemons_cpu_s"].items())
            cells = [job["target"], job["wall_s"], job["machine_cpu_s"], job["pods_cpu_s"],
                     job["this_process_cpu_s"], top]  # fmt: skip
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        idle = real["idle"]
        top = ", ".join(f"{k} {v}" for k, v in idle["daemons_cpu_s"].items())
        lines += ["", f"The cluster idle for {idle['seconds']} s: {idle['machine_cpu_s']} CPU-s "
                  f"({top}).", ""]  # fmt: skip
    return [*lines, *environment_section(result["environment"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="job,pytorchjob,job")
    parser.add_argument("--local-only", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"environment": environment(), "local": local_run()}
    if not args.local_only:
        with tempfile.TemporaryDirectory(prefix="job-cpu-") as tmp:
            result["real"] = real_node_jobs(args.targets.split(","), Path(tmp))
    out = result_path("job-cpu")
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.write_text("\n".join(report(result)) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
