"""Runtime overhead of gpufleet's Trainer against a hand-written DDP loop, checkpoint blocking
time (async vs sync), async staging memory, and crash-to-recovery time.

    python benchmarks/runtime_overhead.py [--rounds 5] [--steps 150]

One run, alternating: each round runs (a) a hand-written DDP loop, (b) the Trainer and (c) the
Trainer with async checkpoints every 50 steps, in a rotating order, on the same model, data and
steps, inside one 2-process gloo job started by gpufleet's local launcher. Ratios compare
configurations measured in the same run, so a noisy shared machine affects all alike.
Writes benchmarks/results/runtime-overhead_<hardware>_<date>.md (and .json beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, median, result_path

from gpufleet.launch.local import run_local
from gpufleet.runtime import CheckpointSettings, JobContext, Trainer, TrainerConfig, seed_everything
from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.distributed import init_distributed, shutdown_distributed
from gpufleet.runtime.files import read_json
from gpufleet.spec import validate_training_job
from gpufleet.workloads.synthetic import parameter_bytes, synthetic_dataset, synthetic_mlp

MODEL = {"input_size": 256, "hidden_size": 1024, "layers": 4}
BIG_MODEL = {"input_size": 1024, "hidden_size": 5120, "layers": 2}  # ~126 MB of fp32
BATCH = 64
CKPT_EVERY = 50
WARMUP = 5
MODES = ("sync", "async")
CKPT_GAP = 8


# ---- worker side ----------------------------------------------------------------------------
def _hand_written(steps: int, data: Any) -> list[float]:
    """(a) The loop a user writes by hand: DDP, DistributedSampler, AdamW."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seed_everything(0)
    model = synthetic_mlp(**MODEL)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    seed_everything(rank)
    times: list[float] = []
    epoch = 0
    mark = time.perf_counter()
    while len(times) < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            now = time.perf_counter()
            times.append(now - mark)
            mark = now
            if len(times) == steps:
                break
        epoch += 1
    return times


def _trainer(steps: int, data: Any, ckpt_dir: Path, every: int, use_async: bool) -> list[float]:
    """(b)/(c) gpufleet's Trainer on the same model, data and optimizer."""
    seed_everything(0)
    model = synthetic_mlp(**MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = JobContext(
        name="bench",
        run_dir=ckpt_dir,
        checkpoint=CheckpointSettings(
            dir=str(ckpt_dir / "ckpt"), every_steps=every, keep=2, async_save=use_async
        ),
        hang_timeout=600,
    )
    cfg = TrainerConfig(steps=steps, batch_size=BATCH, seed=0, log_every=10**9)
    trainer = Trainer(model, data, opt, config=cfg, context=ctx, log=lambda _m: None)
    result = trainer.fit()
    # The last step always ends in a synchronous final checkpoint; (a) has none, so drop it.
    return result.step_seconds[:-1]


def _rss_sampler(stop: threading.Event, out: list[int]) -> None:
    proc = psutil.Process()
    while not stop.is_set():
        out.append(proc.memory_info().rss)
        time.sleep(0.002)


def _checkpoint_blocking(root: Path, repeats: int) -> dict[str, Any]:
    """How long a checkpoint of a >= 100 MB model blocks training, sync vs async.

    Trains the big model with the Trainer and a checkpoint every CKPT_GAP steps. Blocking is
    what the Checkpointer measures the loop waiting (save call, staging fence, upload wait);
    "inflation" is the extra time of the saving step and the next over the median step, which
    also counts background work competing for the same CPU cores.
    """
    seed_everything(0)
    data = synthetic_dataset(1024, BIG_MODEL["input_size"], seed=0)
    out: dict[str, Any] = {"sync": [], "async": []}
    steps = CKPT_GAP * (repeats + 1)  # the last checkpoint is the final, always-sync one
    for i in range(2):  # round 0 warms up allocations and thread pools
        for mode in MODES:
            seed_everything(0)
            model = synthetic_mlp(**BIG_MODEL)
            out["state_bytes"] = parameter_bytes(model)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)  # stateless: state = the model
            ctx = JobContext(
                name="bench",
                run_dir=root / f"{mode}{i}",
                checkpoint=CheckpointSettings(
                    dir=str(root / f"{mode}{i}" / "ckpt"),
                    every_steps=CKPT_GAP,
                    keep=1,
                    async_save=mode == "async",
                ),
                hang_timeout=600,
            )
            cfg = TrainerConfig(steps=steps, batch_size=8, seed=0, log_every=10**9)
            t = Trainer(model, data, opt, config=cfg, context=ctx, log=lambda _m: None)
            times = t.fit().step_seconds
            if i == 0:
                continue
            saves = [k * CKPT_GAP for k in range(1, repeats + 1)]  # not the final, sync one
            out[mode] += [t.checkpointer.blocking[step] for step in saves]
            idx = [step - 1 for step in saves]  # 0-based index of the saving step
            plain = [x for j, x in enumerate(times[:-1]) if j not in idx and j - 1 not in idx]
            base = median(plain[2:])
            out[f"{mode}_inflation"] = [times[j] + times[j + 1] - 2 * base for j in idx]
            out[f"{mode}_step_median"] = base
    return out


def _async_staging_memory(root: Path) -> dict[str, Any]:
    """Peak extra RSS while the first async checkpoint of the big model stages and writes."""
    seed_everything(0)
    model = synthetic_mlp(**BIG_MODEL)
    state = {"model": model.state_dict()}
    ckpt = Checkpointer(str(root / "mem"), keep=1, async_save=True)
    dist.barrier()
    samples: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_rss_sampler, args=(stop, samples))
    base = psutil.Process().memory_info().rss
    sampler.start()
    ckpt.save(1, state)
    ckpt.wait()
    stop.set()
    sampler.join()
    ckpt.close()
    return {"extra_rss_bytes": max(samples) - base, "state_bytes": parameter_bytes(model)}


def worker(args: argparse.Namespace) -> None:
    """Runs inside each of the 2 workers; rank 0 writes the measurements."""
    info = init_distributed()
    data = synthetic_dataset(8192, MODEL["input_size"], seed=0)
    root = Path(args.scratch)
    times: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    order = ["a", "b", "c"]
    for r in range(args.rounds):
        for cfg in order[r % 3 :] + order[: r % 3]:  # rotate so no config always goes first
            d = root / f"r{r}{cfg}"
            if cfg == "a":
                t = _hand_written(args.steps, data)[:-1]
            elif cfg == "b":
                t = _trainer(args.steps, data, d, every=10**9, use_async=False)
            else:
                t = _trainer(args.steps, data, d, every=CKPT_EVERY, use_async=True)
            times[cfg] += t[WARMUP:]
    blocking = _checkpoint_blocking(root / "big", args.ckpt_repeats)
    memory = _async_staging_memory(root / "big")
    if info.is_main:
        result = {"times": times, "blocking": blocking, "memory": memory}
        Path(args.out).write_text(json.dumps(result))
    shutdown_distributed()


# ---- driver side ----------------------------------------------------------------------------
def _job(name: str, command: list[str], **spec: Any) -> Any:
    doc = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"nodes": 1, "procsPerNode": 2, "maxRestarts": 0, "hangTimeout": "10m", **spec},
    }
    doc["spec"]["command" if command else "workload"] = command or spec.pop("workload")
    return validate_training_job(doc)


def measure_overhead(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    out = scratch / "overhead.json"
    cmd = [
        str(Path(__file__).resolve()), "--worker", "--out", str(out), "--scratch", str(scratch),
        "--rounds", str(args.rounds), "--steps", str(args.steps),
        "--ckpt-repeats", str(args.ckpt_repeats),
    ]  # fmt: skip
    summary = run_local(_job("bench-overhead", cmd), run_root=scratch / "runs", fresh=True)
    if summary.exit_code != 0:
        raise SystemExit(f"benchmark job failed: {summary.message}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _find_workers(cwd: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if "gpufleet.launch.shim" in " ".join(p.info["cmdline"] or []) and p.info["cwd"] == str(
            cwd
        ):
            found.append(p)
    return found


def measure_recovery(scratch: Path, repeats: int) -> list[float]:
    """Seconds from a worker's SIGKILL to the first completed step after the restart."""
    spec = {
        "apiVersion": "gpufleet.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "recover"},
        "spec": {
            "workload": {"name": "digits", "steps": 100000, "logEvery": 1},
            "procsPerNode": 2,
            "checkpoint": {"everySteps": 10},
            "maxRestarts": 1,
        },
    }
    results = []
    for i in range(repeats):
        wd = scratch / f"recover{i}"
        wd.mkdir()
        (wd / "job.yaml").write_text(json.dumps(spec))
        launcher = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.cli.main", "run", "job.yaml"],
            cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        progress_file = wd / ".gpufleet/runs/recover/progress.json"
        try:
            while (read_json(progress_file) or {}).get("step", 0) < 25:
                time.sleep(0.05)
            victim = _find_workers(wd)[-1]
            killed = time.time()
            victim.send_signal(signal.SIGKILL)
            while (read_json(progress_file) or {}).get("restart_count", 0) < 1:
                time.sleep(0.02)
            results.append(float(read_json(progress_file)["time"]) - killed)
        finally:
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(timeout=120)
    return results


def report(data: dict[str, Any], recovery: list[float], args: argparse.Namespace) -> str:
    t = data["times"]
    a, b, c = (median(t[k]) for k in "abc")
    mean = {k: sum(v) / len(v) for k, v in t.items()}
    blk = data["blocking"]
    sync_blk, async_blk = median(blk["sync"]), median(blk["async"])
    sync_inf, async_inf = median(blk["sync_inflation"]), median(blk["async_inflation"])
    mem = data["memory"]
    staged = mem["extra_rss_bytes"] / mem["state_bytes"]
    rows = [
        ("median step time ratio b/a (Trainer / hand-written)", f"{b / a:.3f}", "<= 1.03"),
        ("median step time ratio c/a (+ async ckpt every 50)", f"{c / a:.3f}", "<= 1.05"),
        ("mean step time ratio b/a", f"{mean['b'] / mean['a']:.3f}", ""),
        ("mean step time ratio c/a (ckpt cost included)", f"{mean['c'] / mean['a']:.3f}", ""),
        ("checkpoint blocking, sync (s)", f"{sync_blk:.3f}", ""),
        ("checkpoint blocking, async (s)", f"{async_blk:.3f}", ""),
        ("async / sync blocking", f"{async_blk / sync_blk:.3f}", "<= 0.10"),
        ("step-time inflation per checkpoint, sync (s)", f"{sync_inf:.3f}", ""),
        ("step-time inflation per checkpoint, async (s)", f"{async_inf:.3f}", ""),
        ("async staging peak extra RSS / state", f"{staged:.3f}", "<= 1.0"),
        ("SIGKILL -> first step after restart (s), median", f"{median(recovery):.2f}", "<= 10"),
    ]  # fmt: skip
    env = environment()
    lines = [
        f"# Runtime overhead ({env['date']})",
        "",
        "Produced by `python benchmarks/runtime_overhead.py"
        f" --rounds {args.rounds} --steps {args.steps} --ckpt-repeats {args.ckpt_repeats}"
        f" --recovery-repeats {args.recovery_repeats}`.",
        "",
        "| measure | value | goal |",
        "| --- | --- | --- |",
        *(f"| {m} | {v} | {g} |" for m, v, g in rows),
        "",
        "## Config",
        "",
        f"- 2 worker processes (gloo, CPU), one job started by gpufleet's local launcher; "
        f"{args.rounds} rounds x {args.steps} steps per configuration, rotating order, "
        f"first {WARMUP} steps of each round and the last (final checkpoint) dropped.",
        f"- Overhead model: synthetic MLP {MODEL}, AdamW, batch {BATCH} per process; step time"
        " measured boundary to boundary (data, compute, checkpoint blocking).",
        f"- Medians over {len(t['a'])} steps per configuration: a={a * 1e3:.2f} ms, "
        f"b={b * 1e3:.2f} ms, c={c * 1e3:.2f} ms.",
        f"- Checkpoint model: synthetic MLP {BIG_MODEL} = {blk['state_bytes'] / 1e6:.0f} MB fp32,"
        f" SGD (no optimizer state), batch 8, trained by the Trainer with a checkpoint every"
        f" {CKPT_GAP} steps, {args.ckpt_repeats} checkpoints per mode after a warm-up run;"
        " blocking = time the loop waits on the checkpoint (save call, staging fence, upload"
        " wait); inflation = (step that saves + next step) - 2 x median step"
        f" (sync {blk['sync_step_median'] * 1e3:.0f} ms,"
        f" async {blk['async_step_median'] * 1e3:.0f} ms)."
        " Async staging buffers (1x state) are kept and reused between checkpoints.",
        f"- Recovery: digits job (2 workers, checkpoint every 10 steps), SIGKILL of one worker"
        f" after step 25; {len(recovery)} runs: {', '.join(f'{x:.2f}' for x in recovery)} s.",
        "",
        "## Reading",
        "",
        _reading(sync_inf, async_inf),
        "",
        "## Environment",
        "",
        *(f"- {k}: {v}" for k, v in env.items()),
        "",
    ]
    return "\n".join(lines)


def _reading(sync_inf: float, async_inf: float) -> str:
    base = (
        "Blocking is the time the training loop waits on a checkpoint. Step-time inflation also"
        " counts the background copy and write of an async save competing for the same two"
        " cores that both CPU ranks keep busy, so it is noisy on this machine"
    )
    if async_inf < 0.5 * sync_inf:
        return base + "; in this run async also cut it. On GPU nodes the host CPU is free."
    return (
        base + "; in this run async did not cut it much: the background work needs the cores"
        " training uses. On GPU nodes training runs on the GPU and the host CPU is free."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--ckpt-repeats", type=int, default=3)
    parser.add_argument("--recovery-repeats", type=int, default=3)
    parser.add_argument("--render", metavar="JSON", help="re-render the .md from a saved .json")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        Path(args.render).with_suffix(".md").write_text(
            report(saved["raw"], saved["recovery"], args)
        )
        return
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        scratch = Path(tmp)
        data = measure_overhead(args, scratch)
        recovery = measure_recovery(scratch, args.recovery_repeats)
        text = report(data, recovery, args)
    path = result_path("runtime-overhead")
    path.write_text(text)
    path.with_suffix(".json").write_text(json.dumps({"raw": data, "recovery": recovery}))
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
