"""A running job's progress from its ranks' own metrics: the line ``gpufleet status`` adds to a
Running job. Each worker pod's launcher serves its workers' job metrics
(gpufleet.runtime.metrics) on the pod's ``metrics`` port; the client reads them through the
API server's pod proxy, so nothing on the user's machine has to reach the pods."""

from __future__ import annotations

from collections import defaultdict

from gpufleet.runtime.metrics import (
    DURABLE_LAG_SECONDS,
    DURABLE_LAG_STEPS,
    DURABLE_STEP,
    HANG_TIMEOUT,
    HUNG_AT,
    LAST_CHECKPOINT_STEP,
    RESTARTS,
    RESUMED_FROM,
    SAMPLES,
    STEP,
    STEP_SECONDS,
    TOTAL_STEPS,
    UPLOAD_FAILURES,
)


def by_rank(texts: list[str]) -> dict[str, dict[str, float]]:
    """Each rank's samples (name -> value) in the Prometheus text of every pod."""
    from prometheus_client.parser import text_string_to_metric_families

    ranks: dict[str, dict[str, float]] = defaultdict(dict)
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                rank = sample.labels.get("rank")
                if rank is not None and "le" not in sample.labels:
                    ranks[rank][sample.name] = sample.value
    return ranks


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``: how long, roughly."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def progress_line(texts: list[str]) -> str | None:
    """``progress: step 340/1500 (22 %), 2,310 samples/s, about 1 min to go, last checkpoint
    at step 300`` from rank 0 (samples/s from every rank's samples over rank 0's step time);
    None when no pod has reported a step yet."""
    ranks = by_rank(texts)
    numbers = progress_numbers(ranks)
    if numbers is None:
        return None
    zero, (step, total, left) = ranks["0"], numbers
    parts = [f"step {step}/{total} ({100 * step // total} %)" if total else f"step {step}"]
    busy = zero.get(STEP_SECONDS + "_sum", 0.0)
    if busy > 0 and zero.get(STEP_SECONDS + "_count", 0.0):
        samples = sum(r.get(SAMPLES + "_total", 0.0) for r in ranks.values())
        parts.append(f"{samples / busy:,.0f} samples/s")
    if left is not None:
        parts.append(f"about {duration(left)} to go")
    if zero.get(LAST_CHECKPOINT_STEP):
        parts.append(f"last checkpoint at step {int(zero[LAST_CHECKPOINT_STEP])}")
    if durable := durable_note(texts):
        parts.append(durable)
    note = restart_note(ranks)
    return "progress: " + ", ".join(parts) + (f"; {note}" if note else "")


def progress_numbers(ranks: dict[str, dict[str, float]]) -> tuple[int, int, float | None] | None:
    """Rank 0's ``(step, total steps, seconds to go)``: total 0 when unknown, seconds None
    when no step was timed or none is left; None before rank 0 reported a step."""
    zero = ranks.get("0", {})
    if STEP not in zero:
        return None
    step, total = int(zero[STEP]), int(zero.get(TOTAL_STEPS, 0))
    busy, count = zero.get(STEP_SECONDS + "_sum", 0.0), zero.get(STEP_SECONDS + "_count", 0.0)
    left = (total - step) * busy / count if busy > 0 and count and total > step else None
    return step, total, left


def durable_note(texts: list[str]) -> str | None:
    """``durable at step 300 (1 checkpoint behind: 50 steps, 4 min; 3 failed uploads)``
    from the pods' uploaders (spec.checkpoint.durable): the job's durable step is the one every
    node has reached (the least), its lag the worst; None without a durable tier."""
    from prometheus_client.parser import text_string_to_metric_families

    nodes: list[dict[str, float]] = []
    for text in texts:
        values = {s.name: s.value for f in text_string_to_metric_families(text)
                  for s in f.samples if "rank" not in s.labels}  # fmt: skip
        if DURABLE_LAG_STEPS in values:
            nodes.append(values)
    if not nodes:
        return None
    steps = [n[DURABLE_STEP] for n in nodes if DURABLE_STEP in n]
    where = f"durable at step {int(min(steps))}" if steps else "nothing durable yet"
    behind = max(n[DURABLE_LAG_STEPS] for n in nodes)
    late = max(n.get(DURABLE_LAG_SECONDS, 0.0) for n in nodes)
    failed = int(sum(n.get(UPLOAD_FAILURES + "_total", 0.0) for n in nodes))
    lag = [f"{int(behind)} steps behind, {duration(late)}"] if behind or late else []
    lag += [f"{failed} failed upload{'s' if failed != 1 else ''}"] if failed else []
    return where + (f" ({'; '.join(lag)})" if lag else "")


def restart_note(ranks: dict[str, dict[str, float]]) -> str | None:
    """What the last restart was, as the ranks recorded it: ``restarted: 1 worker restart,
    ranks 0, 1 hung after step 412 (no step within hangTimeout 10 s), resumed from step 400``;
    None for a job that has not restarted. A restart of the pods themselves starts their
    counts again; the resume still says it."""
    zero = ranks.get("0", {})
    restarts = int(max((r.get(RESTARTS, 0.0) for r in ranks.values()), default=0.0))
    hung: dict[int, list[str]] = defaultdict(list)
    for rank, samples in sorted(ranks.items(), key=lambda item: int(item[0])):
        if HUNG_AT in samples:
            hung[int(samples[HUNG_AT])].append(rank)
    parts = [f"{restarts} worker restart{'s' if restarts != 1 else ''}"] if restarts else []
    if hung:
        step = max(hung)
        who = ", ".join(hung[step])
        timeout = max((r.get(HANG_TIMEOUT, 0.0) for r in ranks.values()), default=0.0)
        parts.append(f"rank{'s' if len(hung[step]) > 1 else ''} {who} hung after step {step} "
                     f"(no step within hangTimeout {timeout:g} s)")  # fmt: skip
    if RESUMED_FROM in zero:
        parts.append(f"resumed from step {int(zero[RESUMED_FROM])}")
    return "restarted: " + ", ".join(parts) if parts else None
