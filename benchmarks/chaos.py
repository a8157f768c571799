"""Fault-injection matrix: every fault class, counted trials, each ending exact or in a clear error.

    python benchmarks/chaos.py [--scale 1] [--seed N]

Each trial runs the digits job (2 workers, 40 steps, a checkpoint every 10) through the
`gpufleet run` CLI with one fault and checks how it ends: with the uninterrupted run's
``state_digest`` (bit-identical weights, after the documented extra run where the fault
stops the job: preemption, NaN, full disk), or with the documented exit code and one-line
message. Also counted: tracebacks shown to the user (``Traceback (most recent call last)`` in
gpufleet's output) and processes left behind. A silent wrong result is a trial that ends 0 with
another digest. ``--scale 2`` doubles every count. The test suite runs a few of these
(tests/chaos); this script runs the matrix. Writes benchmarks/results/chaos_<hw>_<date>.md/.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' job and helpers
from common import environment, result_path
from tests.support.disk import fill_disk
from tests.support.specs import digits_job as job  # the chaos tests' job: same reference digest

from gpufleet.errors import EXIT_NON_FINITE, EXIT_PREEMPTED, EXIT_STORAGE

STEPS = 40
COUNTS = {  # trials per fault class at --scale 1 (the minimums)
    "sigkill-random-rank-step": 10,
    "sigkill-during-checkpoint-write": 5,
    "sigterm-preemption": 5,
    "corrupt-newest-shard": 3,
    "truncated-newest-shard": 3,
    "deleted-newest-marker": 3,
    "full-disk": 2,
    "hang": 2,
    "nan-loss": 2,
}


@dataclass
class Trial:
    kind: str
    detail: str
    outcome: str = ""  # exact | clear-error | WRONG | FAILED
    exit_codes: list[int] = field(default_factory=list)
    tracebacks: int = 0
    orphans: int = 0
    seconds: float = 0.0
    note: str = ""


class Runner:
    """Runs `gpufleet run` in a trial's directory and keeps what the checks need."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.workdir, self.name = workdir, name
        self.stderr = ""

    def spec(self, doc: dict[str, Any], file: str = "job.yaml") -> Path:
        path = self.workdir / file
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def command(self, spec: Path) -> list[str]:
        return [sys.executable, "-m", "gpufleet.cli.main", "run", str(spec), "-o", "json"]

    def env(self, faults: str = "") -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("GPUFLEET_FAULTS", None)
        if faults:
            env["GPUFLEET_FAULTS"] = faults
        return env

    def run(self, spec: Path, faults: str = "") -> tuple[int, dict[str, Any]]:
        proc = subprocess.run(self.command(spec), cwd=self.workdir, env=self.env(faults),
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        return self._done(proc.returncode, proc.stdout, proc.stderr)

    def _done(self, code: int, stdout: str, stderr: str) -> tuple[int, dict[str, Any]]:
        self.stderr += stderr
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        return code, json.loads(lines[-1]) if lines else {}

    @property
    def checkpoints(self) -> Path:
        return self.workdir / ".gpufleet" / "runs" / self.name / "checkpoints"


def newest_step_dir(root: Path) -> Path:
    return max(p for p in root.iterdir() if p.name.startswith("step_"))


def largest_shard(step_dir: Path) -> Path:
    return max(step_dir.glob("*.distcp"), key=lambda p: p.stat().st_size)


def interrupted(r: Runner) -> Path:
    """The job stopped for good at step 35 (checkpoints 10, 20, 30 on disk); its spec, for a
    rerun with restarts allowed."""
    first = r.spec(job(r.name, maxRestarts=0), "first.yaml")
    code, _ = r.run(first, "exit@step=35,rank=0")
    assert code == 1, f"interrupting run ended {code}"
    return r.spec(job(r.name))


def run_trial(kind: str, rng: random.Random, workdir: Path, digest: str) -> Trial:
    r = Runner(workdir, "chaos")
    trial = Trial(kind, "")
    started = time.monotonic()

    def ok_digest(summary: dict[str, Any]) -> bool:
        return summary.get("state_digest") == digest

    try:
        if kind == "sigkill-random-rank-step":
            step, rank = rng.randint(1, STEPS - 1), rng.randint(0, 1)
            trial.detail = f"kill@step={step},rank={rank}"
            code, s = r.run(r.spec(job(r.name)), trial.detail)
            trial.exit_codes.append(code)
            trial.outcome = "exact" if code == 0 and ok_digest(s) else "WRONG"
        elif kind == "sigkill-during-checkpoint-write":
            step, rank = rng.choice([10, 20, 30]), rng.randint(0, 1)
            trial.detail = f"kill@checkpoint_written={step},rank={rank}"
            code, s = r.run(r.spec(job(r.name)), trial.detail)
            trial.exit_codes.append(code)
            trial.outcome = "exact" if code == 0 and ok_digest(s) else "WRONG"
        elif kind == "sigterm-preemption":
            at = rng.randint(5, 30)
            trial.detail = f"SIGTERM to gpufleet run once step >= {at}"
            spec = r.spec(job(r.name))
            proc = subprocess.Popen(r.command(spec), cwd=workdir, env=r.env(), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            progress = workdir / ".gpufleet" / "runs" / r.name / "progress.json"
            while proc.poll() is None:
                try:
                    if json.loads(progress.read_text())["step"] >= at:
                        proc.send_signal(signal.SIGTERM)
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.05)
            out, err = proc.communicate(timeout=300)
            code, _ = r._done(proc.returncode, out, err)
            trial.exit_codes.append(code)
            code2, s = r.run(spec)
            trial.exit_codes.append(code2)
            good = code in (EXIT_PREEMPTED, 0) and code2 == 0 and ok_digest(s)
            trial.outcome = "exact" if good else "WRONG"
        elif kind in ("corrupt-newest-shard", "truncated-newest-shard", "deleted-newest-marker"):
            spec = interrupted(r)
            newest = newest_step_dir(r.checkpoints)
            if kind == "deleted-newest-marker":
                (newest / "COMPLETE.json").unlink()
                trial.detail = f"{newest.name}/COMPLETE.json deleted"
            else:
                shard = largest_shard(newest)
                data = bytearray(shard.read_bytes())
                if kind == "corrupt-newest-shard":
                    mid = rng.randrange(len(data) - 64)
                    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])
                    trial.detail = f"64 bytes flipped at {mid} of {shard.name}"
                else:
                    cut = rng.randrange(1, len(data))
                    data = data[:cut]
                    trial.detail = f"{shard.name} truncated to {cut} bytes"
                shard.write_bytes(bytes(data))
            code, s = r.run(spec)
            trial.exit_codes.append(code)
            trial.outcome = "exact" if code == 0 and ok_digest(s) else "WRONG"
        elif kind == "full-disk":
            trial.detail = "checkpoint tmpfs of 4 MiB filled after step 10's checkpoint"
            trial.outcome, trial.exit_codes = full_disk(r, digest)
        elif kind == "hang":
            step, rank = rng.randint(1, STEPS - 1), rng.randint(0, 1)
            faults = f"hang@step={step},rank={rank}"
            trial.detail = f"{faults}, hangTimeout 4s"
            code, s = r.run(r.spec(job(r.name, hangTimeout="4s")), faults)
            trial.exit_codes.append(code)
            trial.outcome = "exact" if code == 0 and ok_digest(s) else "WRONG"
        elif kind == "nan-loss":
            step, rank = rng.randint(11, 29), rng.randint(0, 1)
            trial.detail = f"nan@step={step},rank={rank}"
            spec = r.spec(job(r.name))
            code, s = r.run(spec, trial.detail)
            trial.exit_codes.append(code)
            clear = code == EXIT_NON_FINITE and "became NaN or infinite" in s.get("message", "")
            code2, s2 = r.run(spec)
            trial.exit_codes.append(code2)
            trial.outcome = "exact" if clear and code2 == 0 and ok_digest(s2) else "WRONG"
        else:
            raise ValueError(kind)
    except Exception as exc:  # a trial that could not be judged counts as failed, loudly
        trial.outcome, trial.note = "FAILED", f"{type(exc).__name__}: {exc}"
    trial.tracebacks = r.stderr.count("Traceback (most recent call last)")
    left = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if str(workdir) in " ".join(p.info["cmdline"] or []) + " " + (p.info["cwd"] or ""):
            left.append(p)
    trial.orphans = len(left)
    for p in left:
        p.kill()
    trial.seconds = round(time.monotonic() - started, 1)
    return trial


def full_disk(r: Runner, digest: str) -> tuple[str, list[int]]:
    disk = r.workdir / "tiny"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:  # not root: the trial cannot run here
        return f"SKIPPED (cannot mount a tmpfs: {mounted.stderr.strip()})", []
    try:
        ckpt = {"dir": str(disk / "ckpt"), "everySteps": 10}
        first = r.spec(job(r.name, maxRestarts=0, checkpoint=ckpt), "first.yaml")
        assert r.run(first, "exit@step=15,rank=0")[0] == 1
        filler = fill_disk(disk)
        spec = r.spec(job(r.name, checkpoint=ckpt))
        code, s = r.run(spec)
        clear = code == EXIT_STORAGE and "No space left on device" in s.get("message", "")
        filler.unlink()
        code2, s2 = r.run(spec)
        exact = code2 == 0 and s2.get("state_digest") == digest
        return ("exact" if clear and exact else "WRONG"), [code, code2]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="multiply every trial count")
    parser.add_argument("--seed", type=int, default=random.randrange(1_000_000))
    parser.add_argument("--only", help="run only these fault classes (comma-separated)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = args.only.split(",") if args.only else list(COUNTS)
    scratch = Path(tempfile.mkdtemp(prefix="gpufleet-chaos-"))
    base = Runner(scratch / "baseline", "chaos")
    base.workdir.mkdir()
    code, summary = base.run(base.spec(job("chaos")))
    assert code == 0, base.stderr[-3000:]
    digest = summary["state_digest"]
    trials: list[Trial] = []
    for kind in kinds:
        for i in range(COUNTS[kind] * args.scale):
            workdir = scratch / f"{kind}-{i}"
            workdir.mkdir()
            trial = run_trial(kind, rng, workdir, digest)
            trials.append(trial)
            print(f"{kind} #{i}: {trial.outcome} ({trial.detail}; exits {trial.exit_codes}; "
                  f"{trial.seconds}s) {trial.note}", flush=True)  # fmt: skip
    write_report(trials, args, digest)


def write_report(trials: list[Trial], args: argparse.Namespace, digest: str) -> None:
    rows = []
    totals = {"trials": 0, "exact": 0, "wrong": 0, "failed": 0, "tracebacks": 0, "orphans": 0}
    for kind in dict.fromkeys(t.kind for t in trials):
        ts = [t for t in trials if t.kind == kind]
        counts = {
            o: sum(t.outcome == o for t in ts) for o in ("exact", "WRONG", "FAILED", "SKIPPED")
        }
        rows.append(f"| {kind} | {len(ts)} | {counts['exact']} | {counts['WRONG']} | "
                    f"{counts['FAILED'] + counts['SKIPPED']} | {sum(t.tracebacks for t in ts)} | "
                    f"{sum(t.orphans for t in ts)} |")  # fmt: skip
        totals["trials"] += len(ts)
        totals["exact"] += counts["exact"]
        totals["wrong"] += counts["WRONG"]
        totals["failed"] += counts["FAILED"] + counts["SKIPPED"]
        totals["tracebacks"] += sum(t.tracebacks for t in ts)
        totals["orphans"] += sum(t.orphans for t in ts)
    env = environment()
    env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True, check=False).stdout.strip() or "unknown"  # fmt: skip
    md = [
        f"# Chaos matrix ({env['date']})",
        "",
        f"Produced by `python benchmarks/chaos.py --scale {args.scale} --seed {args.seed}`.",
        "",
        "| fault | trials | exact | silent wrong | not judged | tracebacks shown | orphans |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        f"| **all** | {totals['trials']} | {totals['exact']} | {totals['wrong']} | "
        f"{totals['failed']} | {totals['tracebacks']} | {totals['orphans']} |",
        "",
        "## Config",
        "",
        f"- digits job, 2 workers (gloo, CPU), {STEPS} steps, a checkpoint every 10, keep 3, "
        "maxRestarts 2; reference digest of an uninterrupted run: " + f"`{digest}`.",
        "- exact: the trial ended with the reference digest, after the extra run the fault "
        "requires (preemption: exit 75 then a rerun; NaN: exit 5 with its message, then a rerun "
        "without the fault; full disk: exit 6 with its message, space freed, a rerun); the "
        "corrupt/truncated/deleted cases first stop the job at step 35 (checkpoints 10, 20, 30), "
        "damage the newest, then rerun.",
        "- tracebacks shown: `Traceback (most recent call last)` in gpufleet run's output; "
        "orphans: processes mentioning the trial directory after it ended.",
        "",
        "## Trials",
        "",
        "| fault | detail | outcome | exit codes | seconds |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {t.kind} | {t.detail} | {t.outcome} {t.note} | {t.exit_codes} | {t.seconds} |"
            for t in trials
        ),
        "",
        "## Environment",
        "",
        *(f"- {k}: {v}" for k, v in env.items()),
        "",
    ]
    path = result_path("chaos")
    path.write_text("\n".join(md))
    path.with_suffix(".json").write_text(json.dumps({
        "config": {"scale": args.scale, "seed": args.seed, "steps": STEPS, "digest": digest},
        "totals": totals, "trials": [asdict(t) for t in trials], "environment": env,
    }, indent=2))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
