"""Tiered checkpoints: what the training loop waits for, and how soon a checkpoint is durable.

Three ways to checkpoint the same state (``--mb`` MiB of tensors, a model and its optimizer's
size) every ``--interval`` seconds of simulated training (matrix products on one thread, so the
uploader competes for the CPU as it would with a data loader):

- ``fast``: the fast tier alone (a local directory);
- ``durable``: the object store alone (``s3://``: a real S3 server, versitygw on 127.0.0.1);
- ``tiers``: the fast tier, with the node's uploader (gpufleet.runtime.durable) copying each
  checkpoint to the object store in the background, as a launcher runs it;
- ``sealed``: ``tiers`` with the durable copies encrypted (spec.checkpoint.durable.encryption:
  AES-256-GCM on the node, gpufleet.runtime.sealed).

Saves are synchronous (the loop's worst case) and interleaved by round (fast, durable, tiers,
fast, ...), so machine noise hits all alike. Reported: median blocking per save and its ratio to
``fast`` (goal: tiers within 10 %), the time from commit to durable for ``tiers`` (goal: within
one checkpoint interval), and a resume's time (the newest checkpoint found, verified and
loaded) from the fast tier and from the durable one, plain and sealed (the cost of encryption:
``sealed`` against ``tiers``).

    python benchmarks/checkpoint_tiers.py [--mb 64] [--rounds 5] [--saves 4] [--interval 2]

Writes benchmarks/results/checkpoint-tiers_<hardware>_<date>.md (and .json beside it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import environment, environment_section, median, result_path

from gpufleet.runtime.checkpoint import Checkpointer
from gpufleet.runtime.durable import Uploader, UploadState, tiers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/
from tests.support.s3 import VERSITYGW, bucket_env

JOB = "bench"
KEY = bytes(range(32))  # the sealed configuration's key (a benchmark's: no secret)


def state(mb: int, step: int) -> dict[str, Any]:
    n = mb * 2**20 // 4 // 4  # four float32 tensors of mb/4 MiB each
    g = torch.Generator().manual_seed(step)
    return {"model": {f"w{i}": torch.randn(n, generator=g) for i in range(4)}}


def train_for(seconds: float) -> None:
    a = torch.randn(256, 256)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def run(kind: str, root: Path, bucket: str, args: argparse.Namespace) -> dict[str, Any]:
    """One round of ``kind``: blocking per save, and (tiers) seconds from commit to durable."""
    fast, durable = str(root / "fast"), f"{bucket}/{kind}-{root.name}"
    target = durable if kind == "durable" else fast
    ckpt = Checkpointer(target, keep=2, identity={"job": JOB})
    durable_at: dict[int, float] = {}  # when the uploader made each step durable

    def durable_now(st: UploadState) -> None:
        if st.newest_durable is not None:
            durable_at.setdefault(st.newest_durable, time.perf_counter())

    uploader = None
    if kind in ("tiers", "sealed"):
        key = KEY if kind == "sealed" else None
        uploader = Uploader(*tiers(fast, durable, JOB), keep=2, on_change=durable_now, key=key)
        uploader.start()
    commits: dict[int, float] = {}
    ckpt.on_commit = lambda step, *_: commits.setdefault(step, time.perf_counter())
    for i in range(1, args.saves + 1):
        train_for(args.interval)
        ckpt.save(i, state(args.mb, i))
    if uploader is not None:
        uploader.drain(120)
        uploader.stop()
    ckpt.close()
    lag = [durable_at[s] - commits[s] for s in durable_at if s in commits]
    return {"blocking": [ckpt.blocking[s] for s in sorted(ckpt.blocking)], "to_durable": lag,
            "durable": durable}  # fmt: skip


def resume_seconds(
    root: Path, durable: str, args: argparse.Namespace, key_file: str | None = None
) -> dict[str, float]:
    """A resume's time (find, verify, load) from the fast tier, then, wiped, the durable."""
    out = {}
    for tier in ("fast", "durable"):
        if tier == "durable":
            shutil.rmtree(root / "fast", ignore_errors=True)
        into = state(args.mb, 0)
        started = time.perf_counter()
        reader = Checkpointer(str(root / "fast"), identity={"job": JOB}, durable=durable,
                              key_file=key_file)  # fmt: skip
        ref = reader.load_latest(into)
        out[tier] = time.perf_counter() - started
        assert ref is not None and ref.tier == tier, ref
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--saves", type=int, default=4)
    p.add_argument("--interval", type=float, default=2.0)
    args = p.parse_args()
    if not VERSITYGW.is_file():
        sys.exit(f"versitygw not built at {VERSITYGW}: scripts/build-controlplane.sh versitygw")
    torch.set_num_threads(1)
    samples: dict[str, list[dict[str, Any]]] = {"fast": [], "durable": [], "tiers": [],
                                                 "sealed": []}  # fmt: skip
    resumes: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, bucket_env(Path(tmp), "bench") as s3:
        key_file = Path(tmp) / "key"
        key_file.write_bytes(KEY)
        for r in range(args.rounds):
            for kind in samples:
                root = Path(tmp) / f"{kind}-{r}"
                samples[kind].append(run(kind, root, "s3://bench", args))
            plain = resume_seconds(Path(tmp) / f"tiers-{r}", samples["tiers"][-1]["durable"], args)
            sealed = resume_seconds(Path(tmp) / f"sealed-{r}", samples["sealed"][-1]["durable"],
                                    args, str(key_file))  # fmt: skip
            resumes.append({**plain, "sealed": sealed["durable"]})
        server = s3.endpoint
    report(args, samples, resumes, server)


def report(args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]],
           resumes: list[dict[str, float]], server: str) -> None:  # fmt: skip
    block = {k: median([b for s in v for b in s["blocking"]]) for k, v in samples.items()}
    to_durable = [x for s in samples["tiers"] for x in s["to_durable"]]
    to_sealed = [x for s in samples["sealed"] for x in s["to_durable"]]
    interval = args.interval + block["tiers"]
    res = {t: median([r[t] for r in resumes]) for t in ("fast", "durable", "sealed")}
    summary = {
        "config": vars(args), "server": f"versitygw {server}", "blocking_s": block,
        "blocking_ratio": {k: block[k] / block["fast"] for k in block},
        "to_durable_s": {"median": median(to_durable), "max": max(to_durable)},
        "to_durable_sealed_s": {"median": median(to_sealed), "max": max(to_sealed)},
        "checkpoint_interval_s": interval, "resume_s": res, "environment": environment(),
    }  # fmt: skip
    sealed_lag = summary["to_durable_sealed_s"]["median"] / summary["to_durable_s"]["median"]
    ratio = summary["blocking_ratio"]
    lines = [
        "# Tiered checkpoints: blocking, time to durable, resume, encryption", "",
        f"{args.mb} MiB of state, a synchronous save every {args.interval:g} s of simulated "
        f"training, {args.saves} saves x {args.rounds} rounds per configuration, interleaved; "
        "durable tier: versitygw 1.8 on 127.0.0.1 (benchmarks/checkpoint_tiers.py).", "",
        "| configuration | blocking per save (median) | vs fast only |", "| --- | --- | --- |",
        *(f"| {k} | {block[k] * 1000:.0f} ms | {ratio[k]:.2f}x |" for k in block), "",
        f"- tiers vs fast only: {ratio['tiers']:.2f}x (goal: within 1.10x): "
        f"{'met' if ratio['tiers'] <= 1.10 else 'NOT met'}",
        f"- commit to durable (tiers): median {summary['to_durable_s']['median']:.2f} s, max "
        f"{summary['to_durable_s']['max']:.2f} s; checkpoint interval {interval:.2f} s (goal: "
        f"within one): {'met' if summary['to_durable_s']['max'] <= interval else 'NOT met'}",
        f"- resume (find, verify, load): fast tier {res['fast']:.2f} s, durable tier "
        f"{res['durable']:.2f} s ({res['durable'] / res['fast']:.1f}x)",
        f"- encrypted durable copies (sealed vs tiers): blocking "
        f"{ratio['sealed'] / ratio['tiers']:.2f}x, commit to durable {sealed_lag:.2f}x (median "
        f"{summary['to_durable_sealed_s']['median']:.2f} s, max "
        f"{summary['to_durable_sealed_s']['max']:.2f} s), resume from the durable tier "
        f"{res['sealed']:.2f} s ({res['sealed'] / res['durable']:.2f}x: verify, open, load)", "",
        *environment_section(summary["environment"]),
    ]  # fmt: skip
    out = result_path("checkpoint-tiers")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({**summary, "samples": samples}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
