"""A running job's progress from its ranks' own metrics: the line ``gpufleet status`` adds to a
Running job. Each worker pod's launcher serves its workers' job metrics
(gpufleet.runtime.metrics) on the pod's ``metrics`` port; the client reads them through the
API server's pod proxy, so nothing on the user's machine has to reach the pods."""

from __future__ import annotations

from collections import defaultdict

from gpufleet.runtime.metrics import LAST_CHECKPOINT_STEP, SAMPLES, STEP, STEP_SECONDS, TOTAL_STEPS


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
    zero = ranks.get("0", {})
    if STEP not in zero:
        return None
    step, total = int(zero[STEP]), int(zero.get(TOTAL_STEPS, 0))
    parts = [f"step {step}/{total} ({100 * step // total} %)" if total else f"step {step}"]
    busy, count = zero.get(STEP_SECONDS + "_sum", 0.0), zero.get(STEP_SECONDS + "_count", 0.0)
    if busy > 0 and count:
        samples = sum(r.get(SAMPLES + "_total", 0.0) for r in ranks.values())
        parts.append(f"{samples / busy:,.0f} samples/s")
        if total > step:
            parts.append(f"about {duration((total - step) * busy / count)} to go")
    if zero.get(LAST_CHECKPOINT_STEP):
        parts.append(f"last checkpoint at step {int(zero[LAST_CHECKPOINT_STEP])}")
    return "progress: " + ", ".join(parts)
