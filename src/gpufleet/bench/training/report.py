"""What ``gpufleet bench training`` reports, and the collector of its runs. The benchmark:
train the digits CNN with
the Trainer until its test accuracy reaches the target, on every node of the job at once, and
log the run in MLLOG lines with mlperf-logging's own logger, as MLPerf Training submissions do.

One job, ``--runs`` runs (seeds ``seed``, ``seed+1``, ...), one ``result_<i>.txt`` each. The
score is MLPerf's: minutes from ``run_start`` to ``run_stop``, averaged over the runs with the
fastest and the slowest dropped when there are at least three (olympic average). Rank 0 logs;
every node's system description is gathered to it. Results are published with fsspec to
``--results`` (a directory on the shared checkpoint volume, or an S3 URI), where
``gpufleet bench collect`` reads them, checks each log with mlperf-logging's compliance
checker (against gpufleet's ruleset, gpufleet.bench.mlperf) and prints the aggregate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.bench.training.config import RESULT_JSON
from gpufleet.errors import EXIT_FAILED


def olympic_minutes(minutes: list[float], runs: int) -> float | None:
    """MLPerf's score of ``runs`` runs of which ``minutes`` passed (converged and compliant),
    as mlperf_logging.result_summarizer scores them (its olympic average is private there).
    From three runs on, the fastest and the slowest are dropped and the rest averaged; a run
    that failed counts as the dropped slowest, and more than one failed gives no score. Below
    three runs every run must pass and all count."""
    most_dropped = 1 if runs >= 3 else 0
    dropped = runs - len(minutes)
    if dropped > most_dropped or not minutes:
        return None
    ordered = sorted(minutes)
    countable = ordered[most_dropped : len(ordered) - (most_dropped - dropped)]
    return sum(countable) / len(countable) if countable else None


def collect(results: str, workdir: Path) -> dict[str, Any]:
    """Fetch a run's files from ``results`` (a directory or an fsspec URI) into ``workdir``,
    check every run's log with mlperf-logging's compliance checker, and score the set: the
    collector step of a cluster run, and the end of a local one. Raises FileNotFoundError when
    ``results`` holds no training.json."""
    import fsspec

    from gpufleet.bench.mlperf import check, run_minutes
    from gpufleet.runtime.files import read_json

    fs, root = fsspec.core.url_to_fs(results)
    local = workdir / "logs"
    local.mkdir(parents=True, exist_ok=True)
    if not fs.isfile(f"{root.rstrip('/')}/{RESULT_JSON}"):
        raise FileNotFoundError(f"{results}: no {RESULT_JSON} (has the benchmark finished?)")
    for entry in fs.ls(root, detail=False):
        name = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if name == RESULT_JSON or (name.startswith("result_") and name.endswith(".txt")):
            fs.get_file(entry, str(local / name))
    summary: dict[str, Any] = read_json(local / RESULT_JSON) or {}
    passed = []
    for run in summary["runs"]:
        log = local / run["result_file"]
        verdict = check(log, workdir / "compliance")
        run["minutes"] = run_minutes(log) if log.is_file() else None
        run["compliant"], run["problems"] = verdict.valid, verdict.problems
        if verdict.valid and run["status"] == "success" and run["minutes"] is not None:
            passed.append(run["minutes"])
    score = olympic_minutes(passed, len(summary["runs"]))
    summary["aggregate"] = {
        "runs": len(summary["runs"]),
        "passed": len(passed),
        "score_minutes": score,
        "valid": score is not None,
        "ruleset": "gpufleet_digits on mlperf-logging training 6.1.0 common rules",
    }
    summary["logs"] = str(local)
    return summary


def table(summary: dict[str, Any]) -> list[str]:
    """Per-run rows and the score, as text lines."""
    lines = [
        f"{'run':<5}{'seed':>5}  {'status':<9}{'epochs':>7}{'accuracy':>10}{'minutes':>10}"
        f"  compliance"
    ]
    for r in summary["runs"]:
        acc = f"{r['accuracy']:.4f}" if r["accuracy"] is not None else "-"
        mins = f"{r['minutes']:.4f}" if r["minutes"] is not None else "-"
        verdict = "ok" if r["compliant"] else "; ".join(r["problems"][:2]) or "failed"
        lines.append(
            f"{r['run']:<5}{r['seed']:>5}  {r['status']:<9}{r['epochs']:>7}{acc:>10}"
            f"{mins:>10}  {verdict}"
        )
    agg = summary["aggregate"]
    score = f"{agg['score_minutes']:.4f} min" if agg["score_minutes"] is not None else "none"
    verdict = "VALID" if agg["valid"] else "INVALID"
    lines.append(
        f"time to {summary['target_accuracy']:.0%} ({summary['benchmark']}, "
        f"{summary['nodes']} node(s), {summary['world_size']} worker(s), global batch "
        f"{summary['global_batch']}): {score}, {agg['passed']}/{agg['runs']} runs passed, "
        f"{verdict}"
    )
    return lines


def plot(summary: dict[str, Any], path: Path) -> None:
    """Test accuracy per epoch of every run, and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in summary["runs"]:
        history = r["accuracy_history"]
        ax.plot(range(1, len(history) + 1), history, marker="o", label=f"run {r['run']}")
    ax.axhline(summary["target_accuracy"], color="k", linestyle="--", label="target")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1.0)
    ax.set_title(f"{summary['benchmark']}: {summary['world_size']} workers")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def record(results: str, outdir: Path, as_json: bool) -> int:
    """Collect the runs published at ``results`` into ``outdir``, write training.json and
    the plot, print the table or the JSON; the exit code: 1 unless the result is valid."""
    from gpufleet.bench import runner
    from gpufleet.bench.system import describe

    need_mlperf_logging()
    try:
        summary = collect(results, outdir)
    except FileNotFoundError as exc:
        runner.bad("RESULTS", str(exc))
    summary["collector"] = describe()
    runner.write_result(outdir, "training", summary, lambda png: plot(summary, png))
    if as_json:
        runner.print_json(summary)
    else:
        print("\n".join(table(summary)))
        runner.say(f"results: {outdir}/training.json, training.png, logs in {outdir}/logs")
    return 0 if summary["aggregate"]["valid"] else EXIT_FAILED


def need_mlperf_logging() -> None:
    """The optional mlperf-logging package, or exit 2 with its install line (nothing ran)."""
    import importlib.util

    from gpufleet.extras import missing

    if importlib.util.find_spec("mlperf_logging") is None:
        raise missing("bench", "mlperf-logging", "bench training")
