"""Cluster benchmarks through the CLI: real worker processes under gpufleet's launcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.bench.collectives import OPS
from tests.support.cli import cli_env, run_cli
from tests.support.specs import cluster_job, write_spec

# Runs the bench CLI's real workers and LoadGen: minutes in all, not `make check`'s.
pytestmark = pytest.mark.slow


def test_collectives_measure_and_check_every_op_mode_and_size(workdir: Path) -> None:
    out = workdir / "res"
    proc = run_cli(
        "bench",
        "collectives",
        "--quick",
        "--max-bytes",
        "64KiB",
        "--outdir",
        str(out),
        "-o",
        "json",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # stdout holds the JSON alone
    assert result == json.loads((out / "collectives.json").read_text())
    assert (out / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = result["rows"]
    want = {(o, m, 8 << k) for o in OPS for m in OPS[o].modes for k in range(14)}
    assert {(r["op"], r["mode"], 8 << k) for r in rows for k in range(14)
            if r["bytes"] == 8 << k} == want  # fmt: skip  # every op, mode and size
    assert result["ranks"] == 2 and result["backend"] == "gloo"
    for r in rows:
        assert r["correct"], r
        factor = OPS[r["op"]].bus_factor(2)
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
    system = result["system"]
    assert system["cores"] and system["torch"] and system["gpus"] == []


def test_collectives_print_a_table(workdir: Path) -> None:
    proc = run_cli(
        "bench",
        "collectives",
        "--quick",
        "--ops",
        "all_reduce",
        "--max-bytes",
        "1KiB",
        "--outdir",
        str(workdir / "res"),
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:4] == ["op", "mode", "size", "count"]
    assert [ln.split()[:4] for ln in lines[1:]] == [
        ["all_reduce", "in-place", str(8 << k), "B"] for k in range(7)
    ] + [["all_reduce", "in-place", "1", "KiB"]]
    assert all(ln.endswith("ok") for ln in lines[1:])
    # The collector reads a results directory (here this run's) into the same table.
    collected = run_cli("bench", "collect", str(workdir / "res"), cwd=workdir)
    assert collected.returncode == 0, collected.stderr[-2000:]
    assert collected.stdout == proc.stdout


def test_collectives_render_as_the_specs_cluster_job(workdir: Path) -> None:
    spec = write_spec(workdir, cluster_job(nodes=4, procsPerNode=8, resources={"gpu": 8}))
    proc = run_cli(
        "bench",
        "collectives",
        "--spec",
        str(spec),
        "--render",
        "jobset",
        "--ops",
        "all_reduce",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    objects = list(yaml.safe_load_all(proc.stdout))
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    assert jobset["metadata"]["name"] == "train-collectives"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    command = " ".join(pod["containers"][0]["command"] + pod["containers"][0].get("args", []))
    assert "-m gpufleet.bench.collectives --ops all_reduce" in command
    assert "--max-bytes 1073741824" in command  # the full sweep: memory is the nodes' to judge
    assert "--results /ckpt/run/bench-collectives" in command  # for `gpufleet bench collect`
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 4


def test_scaling_measures_splits_and_predicts(workdir: Path) -> None:
    out = workdir / "res"
    proc = run_cli("bench", "scaling", "--quick", "--outdir", str(out), "-o", "json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    points = {(p["mode"], p["world"]): p for p in result["points"]}
    assert set(points) == {(m, w) for m in ("strong", "weak") for w in (1, 2)}
    assert points["strong", 2]["global_batch"] == points["strong", 1]["global_batch"] == 256
    assert points["weak", 2]["global_batch"] == 2 * points["weak", 1]["global_batch"]
    for (mode, world), p in points.items():
        one = points[mode, 1]
        assert p["efficiency"] == pytest.approx(
            p["samples_per_second"] / (world * one["samples_per_second"])
        )
        assert p["compute_seconds"] > 0 and p["data_seconds"] > 0  # (timed apart: noise may
        # put a 1-worker compute above its step)
        parts = p["compute_seconds"] + p["data_seconds"] + p["communication_seconds"]
        assert parts == pytest.approx(p["step_seconds"]) or p["communication_seconds"] == 0
    analysis = result["analysis"]
    assert analysis["link"]["bandwidth_gbps"] > 0 and analysis["link"]["alpha_seconds"] >= 0
    for mode in ("strong", "weak"):
        m = analysis["modes"][mode]
        assert [c["world"] for c in m["checks"]] == [1, 2]
        assert m["checks"][0]["predicted"] == pytest.approx(1.0)
        assert set(m["predicted"]) == {"here", "nvlink", "infiniband-hdr", "25gbe"}
        assert all(0 < e <= 1 for effs in m["predicted"].values() for e in effs.values())
    assert result["system"]["torch"]


@pytest.mark.parametrize(
    ("command", "args", "want"),
    [
        ("collectives", ["--max-bytes", "4TiB"], "--max-bytes: must be a size like 8, 64KiB"),
        ("collectives", ["--max-bytes", "512GiB"], "--max-bytes: 512 GiB needs about 2048 GiB"),
        ("collectives", ["--ops", "all_reduce,gossip"], "--ops: unknown gossip; choose from"),
        ("collectives", ["--min-bytes", "1MiB", "--max-bytes", "1KiB"], "--min-bytes: 1 MiB is"),
        ("collectives", ["--procs", "0"], "--procs: Input should be greater than or equal to 1"),
        ("collectives", ["--render", "job"], "--render: needs --spec"),
        ("scaling", ["--workers", "2,4"], "--workers: must include 1"),
        ("scaling", ["--workers", "1,two"], "--workers: must be comma-separated numbers"),
        ("scaling", ["--mode", "sideways"], "--mode: must be strong, weak or both"),
        ("scaling", ["--batch", "255"], "--batch: strong scaling splits the global batch 255"),
        (
            "scaling",
            ["--workers", "1,3", "--per-node", "2", "--mode", "weak"],
            "--workers: 3 workers do not",
        ),
        ("scaling", ["--render", "job"], "--render: needs --spec"),
        (
            "coordinated",
            ["--urls", "h:1", "--model", "m", "--scenario", "Sideways"],
            "--scenario: 'Sideways': one of SingleStream, Server, Offline",
        ),
        (
            "coordinated",
            ["--urls", "h:1", "--model", "m", "--scenario", "Server"],
            "--target-qps: required for the Server scenario",
        ),
        ("coordinated", ["--urls", ",", "--model", "m"], "--urls: give at least one endpoint"),
        ("coordinated", ["--urls", "h:1", "--model", "m", "--render", "job"], "--render: needs"),
        ("training", ["--runs", "0"], "--runs: must be at least 1"),
        ("training", ["--strategy", "zero3"], "--strategy: must be ddp or fsdp, got 'zero3'"),
        ("training", ["--precision", "fp8"], "--precision: must be fp32 or bf16, got 'fp8'"),
        ("training", ["--lr", "0"], "--lr: must be positive"),
        ("training", ["--render", "job"], "--render: needs --spec"),
        ("collect", ["empty"], "RESULTS: empty: none of collectives.json, coordinated.json"),
    ],
)
def test_bad_input_is_one_error_and_exit_2_with_nothing_written(
    workdir: Path, command: str, args: list[str], want: str
) -> None:
    (workdir / "empty").mkdir()
    proc = run_cli("bench", command, *args, "--outdir", str(workdir / "res"), cwd=workdir)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()  # the CLI's field-error shape, no traceback
    assert len(lines) == 2 and lines[0] == "error: 1 error", proc.stderr
    assert lines[1].startswith(f"  - {want}"), proc.stderr
    assert not (workdir / "res").exists() and not (workdir / ".gpufleet").exists()


def test_coordinated_renders_one_pod_per_node_writing_to_the_shared_volume(workdir: Path) -> None:
    spec = write_spec(workdir, cluster_job(nodes=3, procsPerNode=1))
    urls = "triton-0.triton:8001,triton-1.triton:8001,triton-2.triton:8001"
    args = ["--urls", urls, "--model", "digits", "--scenario", "Server", "--target-qps", "100"]
    proc = run_cli("bench", "coordinated", "--spec", str(spec), "--render", "job", *args,
                   cwd=workdir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    objects = list(yaml.safe_load_all(proc.stdout))
    job = next(o for o in objects if o["kind"] == "Job")
    assert job["metadata"]["name"] == "train-coordinated"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    command = " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "-m gpufleet.bench.coordinated --urls " + urls in command
    assert "--outdir /ckpt/run/coordinated" in command  # the spec's checkpoint volume


def test_training_reaches_the_target_on_two_nodes_and_the_collector_agrees(workdir: Path) -> None:
    """Time to target on two "nodes" (one worker each, FSDP): every run's MLLOG log passes the
    compliance checker, each node's system is described, and `bench collect` on what the job
    published scores it the same."""
    out = workdir / "res"
    args = ["--quick", "--nodes", "2", "--procs", "1", "--strategy", "fsdp"]
    proc = run_cli("bench", "training", *args, "--outdir", str(out), "-o", "json", cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result == json.loads((out / "training.json").read_text())
    assert (out / "training.png").read_bytes()[:4] == b"\x89PNG"
    agg = result["aggregate"]
    assert agg["valid"] and agg["runs"] == agg["passed"] == 1
    (run,) = result["runs"]
    assert run["status"] == "success" and run["compliant"] and run["problems"] == []
    assert run["accuracy"] >= 0.97 and run["accuracy_history"][-1] == run["accuracy"]
    assert all(a < 0.97 for a in run["accuracy_history"][:-1])  # stopped at the first hit
    assert agg["score_minutes"] == pytest.approx(run["minutes"]) and run["minutes"] > 0
    assert result["nodes"] == 2 and result["world_size"] == 2 and result["global_batch"] == 64
    assert result["parallelism"]["strategy"] == "fsdp"
    assert [s["rank"] for s in result["systems"]] == [0, 1]  # one per node
    log = (out / "logs" / "result_0.txt").read_text()
    assert '"key": "number_of_nodes", "value": 2' in log
    assert log.count('"key": "eval_accuracy"') == run["epochs"]

    collected = run_cli("bench", "collect", str(out / "published"), "--outdir",
                        str(workdir / "coll"), "-o", "json", cwd=workdir)  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-3000:]
    again = json.loads(collected.stdout)
    assert again["aggregate"] == agg and again["runs"] == result["runs"]


def test_training_renders_to_publish_on_the_shared_volume(workdir: Path) -> None:
    doc = cluster_job(nodes=2, procsPerNode=4, parallelism={"strategy": "fsdp"})
    spec = write_spec(workdir, doc)
    proc = run_cli("bench", "training", "--spec", str(spec), "--render", "job", "--runs", "5",
                   cwd=workdir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    job = next(o for o in yaml.safe_load_all(proc.stdout) if o["kind"] == "Job")
    assert job["metadata"]["name"] == "train-training"
    container = job["spec"]["template"]["spec"]["containers"][0]
    command = " ".join(container["command"])
    assert "-m gpufleet.bench.training --runs 5" in command
    assert "--results /ckpt/run/bench-training" in command
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert json.loads(env["GPUFLEET_PARALLELISM"])["strategy"] == "fsdp"  # the spec's, kept


def test_scaling_spans_nodes_when_a_world_size_outgrows_one(workdir: Path) -> None:
    """--per-node 1: two workers are two "nodes" (two agents, one rendezvous)."""
    out = workdir / "res"
    proc = run_cli("bench", "scaling", "--quick", "--mode", "weak", "--per-node", "1",
                   "--outdir", str(out), "-o", "json", cwd=workdir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    points = {p["world"]: p for p in json.loads(proc.stdout)["points"]}
    assert {w: p["nodes"] for w, p in points.items()} == {1: 1, 2: 2}
    assert "weak, 2 worker(s) on 2 node(s)" in proc.stderr


def test_scaling_renders_a_job_per_point_and_the_collector_assembles_them(
    workdir: Path,
) -> None:
    spec = write_spec(workdir, cluster_job(nodes=2, procsPerNode=4, resources={"gpu": 4}))
    proc = run_cli("bench", "scaling", "--spec", str(spec), "--render", "jobset", "--workers",
                   "1,4,8", "--mode", "weak", cwd=workdir)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobsets = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "JobSet"]
    assert [j["metadata"]["name"] for j in jobsets] == [
        "train-scaling-weak-1", "train-scaling-weak-4", "train-scaling-weak-8"
    ]  # fmt: skip
    for js, nodes, fit in zip(jobsets, (1, 1, 2), (False, False, True), strict=True):
        replicated = js["spec"]["replicatedJobs"][0]["template"]["spec"]
        assert replicated["parallelism"] == nodes
        container = replicated["template"]["spec"]["containers"][0]
        command = " ".join(container["command"] + container.get("args", []))
        assert "-m gpufleet.bench.scaling" in command
        assert "--results /ckpt/run/bench-scaling" in command
        assert ("--fit" in command) == fit

    # What the pods publish, made here by the same worker (torchrun for the 2-rank point),
    # and the collector step on it.
    results = workdir / "published"
    worker = ["-m", "gpufleet.bench.scaling", "--mode", "weak", "--batch", "64", "--steps", "3",
              "--warmup", "1", "--input-size", "64", "--hidden-size", "256", "--layers", "2",
              "--results", str(results)]  # fmt: skip
    for launcher in ([], ["-m", "torch.distributed.run", "--nproc-per-node", "2"]):
        args = [*worker, "--fit"] if launcher else worker
        ran = subprocess.run([sys.executable, *launcher, *args], cwd=workdir, env=cli_env(),
                             capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-3000:]
    assert sorted(p.name for p in results.iterdir()) == [
        "point-weak-00001.json", "point-weak-00002.json"
    ]  # fmt: skip
    collected = run_cli("bench", "collect", str(results), "--outdir", str(workdir / "coll"),
                        "-o", "json", cwd=workdir)  # fmt: skip
    assert collected.returncode == 0, collected.stderr[-3000:]
    result = json.loads(collected.stdout)
    assert [p["world"] for p in result["points"]] == [1, 2]
    checks = result["analysis"]["modes"]["weak"]["checks"]
    assert [c["world"] for c in checks] == [1, 2] and result["allreduce"]["ranks"] == 2
    assert (workdir / "coll" / "scaling.png").is_file()
