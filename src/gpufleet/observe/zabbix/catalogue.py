"""What the Zabbix templates collect: gpufleet's metric catalogue as Zabbix items.

Each template has one HTTP agent item that fetches a `/metrics` page (the exporter's, a job's,
a Triton server's) and dependent items that pick one value out of it with Zabbix's Prometheus
pattern preprocessing, as Zabbix's own Prometheus templates do: one request per interval, however
many items. The GPU gauges come from the exporter's own table (observe.exporter.METRICS), the job
series from runtime.metrics, so a metric added there is collected here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.observe.devices import APPLICATION_XIDS, HARDWARE_XIDS
from gpufleet.observe.exporter import METRICS
from gpufleet.runtime import metrics as job

GPU = "{#GPU}"
MODEL, VERSION = "{#MODEL}", "{#VERSION}"
# Units Zabbix scales and shows, by the Prometheus name's unit suffix (longest first).
UNITS = (
    ("_bytes_per_second", "Bps"),
    ("_bytes", "B"),
    ("_celsius", "°C"),
    ("_watts", "W"),
    ("_hertz", "Hz"),
    ("_seconds", "s"),
)


@dataclass(frozen=True)
class Item:
    """One value from the page: ``pattern`` selects series; ``result`` is "value" (exactly one
    series) or an aggregation over all that match (sum, max, count)."""

    key: str
    name: str
    pattern: str
    description: str
    result: str = "value"
    units: str = ""
    rate: bool = False  # a counter, stored per second
    # Stored when no series matches (an XID code never seen is 0 events); None: the value is
    # skipped (a lost GPU's gauges are gone, and the GPU's `up` item says so).
    default: str | None = None
    # JavaScript run on the value after the pattern (Zabbix's JAVASCRIPT preprocessing step).
    javascript: str | None = None
    value_type: str = "FLOAT"


def units(metric: str) -> str:
    return next((unit for suffix, unit in UNITS if metric.endswith(suffix)), "")


def _xids(match: str, codes: tuple[int, ...]) -> str:
    # Anchored: Zabbix searches (PCRE) where PromQL matches the whole value, so "13|31|43"
    # would take XID 143 for an application fault.
    return (
        f'gpufleet_gpu_xid_errors_total{{gpu="{GPU}",xid{match}"^({"|".join(map(str, codes))})$"}}'
    )


def gpu_items() -> list[Item]:
    """Per GPU (prototypes of the GPU discovery): every reading of the exporter's table, then
    health: readable, ECC and XID events, and whether a pod holds it."""
    items = []
    for metric, doc, kind in METRICS.values():
        short = metric.removeprefix("gpufleet_gpu_")
        if kind == "counter":
            items.append(Item(f"gpufleet.gpu.{short}.rate[{GPU}]", f"GPU {GPU}: {doc}",
                              f'{metric}_total{{gpu="{GPU}"}}', doc, units=f"{units(metric)}ps",
                              rate=True))  # fmt: skip
        else:
            items.append(Item(f"gpufleet.gpu.{short}[{GPU}]", f"GPU {GPU}: {doc}",
                              f'{metric}{{gpu="{GPU}"}}', doc, units=units(metric)))  # fmt: skip
    both = (*HARDWARE_XIDS, *APPLICATION_XIDS)
    return [
        *items,
        # No default: a GPU gone from the exporter's list (a driver reload, fewer GPUs) is
        # silent, as in Prometheus, rather than "unreadable" until discovery forgets it.
        Item(f"gpufleet.gpu.up[{GPU}]", f"GPU {GPU}: readable", f'gpufleet_gpu_up{{gpu="{GPU}"}}',
             "1 if the exporter's last read of this GPU succeeded."),
        Item(f"gpufleet.gpu.ecc.uncorrected[{GPU}]", f"GPU {GPU}: uncorrectable ECC errors",
             f'gpufleet_gpu_ecc_errors_total{{gpu="{GPU}",type="uncorrected"}}',
             "Volatile uncorrectable ECC errors (a counter).", result="sum", default="0"),
        Item(f"gpufleet.gpu.ecc.corrected[{GPU}]", f"GPU {GPU}: corrected ECC errors",
             f'gpufleet_gpu_ecc_errors_total{{gpu="{GPU}",type="corrected"}}',
             "Volatile corrected ECC errors (a counter).", result="sum", default="0"),
        Item(f"gpufleet.gpu.xid.hardware[{GPU}]", f"GPU {GPU}: hardware XID events",
             _xids("=~", HARDWARE_XIDS), "XID events that mean the GPU, its memory or links fail.",
             result="sum", default="0"),
        Item(f"gpufleet.gpu.xid.application[{GPU}]", f"GPU {GPU}: application XID events",
             _xids("=~", APPLICATION_XIDS), "XID events that are a program's fault.",
             result="sum", default="0"),
        Item(f"gpufleet.gpu.xid.other[{GPU}]", f"GPU {GPU}: other XID events",
             _xids("!~", both), "XID events gpufleet does not classify.", result="sum",
             default="0"),
        Item(f"gpufleet.gpu.allocated[{GPU}]", f"GPU {GPU}: held by pods",
             f'gpufleet_gpu_allocated{{gpu="{GPU}"}}',
             "Containers holding this GPU (kubelet pod-resources; 0: free).", result="count",
             default="0"),
    ]  # fmt: skip


def exporter_items() -> list[Item]:
    """The exporter's own state (one per node)."""
    return [
        Item("gpufleet.exporter.devices", "Exporter: GPUs read", "gpufleet_exporter_devices",
             "GPUs this exporter reads (0: NVML or the driver is broken)."),
        Item("gpufleet.exporter.pod_resources_up", "Exporter: kubelet pod-resources answered",
             "gpufleet_exporter_pod_resources_up",
             "1 if the kubelet told which pod holds each GPU.", default="1"),
        Item("gpufleet.exporter.scrape_duration", "Exporter: read time",
             "gpufleet_exporter_scrape_duration_seconds", "Time a scrape spent reading devices.",
             units="s"),
    ]  # fmt: skip


def job_items() -> list[Item]:
    """A training job's endpoint (all ranks of a pod, or `gpufleet run`'s): job-wide values."""
    return [
        Item("gpufleet.job.step", "Job: step", job.STEP, "Last completed step (highest rank).",
             result="max"),
        Item("gpufleet.job.total_steps", "Job: total steps", job.TOTAL_STEPS,
             "Steps the job trains in all (0: not known).", result="max"),
        Item("gpufleet.job.last_checkpoint_step", "Job: last checkpoint step",
             job.LAST_CHECKPOINT_STEP, "Step of the last committed checkpoint.", result="max"),
        Item("gpufleet.job.samples.rate", "Job: samples per second", f"{job.SAMPLES}_total",
             "Training throughput, all ranks.", result="sum", units="sps", rate=True),
        Item("gpufleet.job.restarts", "Job: restarts", job.RESTARTS,
             "Worker-group restarts so far.", result="max"),
        Item("gpufleet.job.hang_timeout", "Job: hang timeout", job.HANG_TIMEOUT,
             "The job's hangTimeout (0: no watchdog).", result="max", units="s"),
        Item("gpufleet.job.since_progress", "Job: time since the last step",
             job.LAST_PROGRESS,
             "Seconds since any rank completed a step, at collection time.", result="max",
             units="s", javascript="return Math.floor(Date.now() / 1000) - Number(value);"),
        # The durable tier's (spec.checkpoint.durable); a job without one has no lag.
        Item("gpufleet.job.durable.step", "Job: newest durable checkpoint step",
             job.DURABLE_STEP, "Newest step verified on the durable tier.", result="max"),
        Item("gpufleet.job.durable.lag_steps", "Job: durable tier lag (steps)",
             job.DURABLE_LAG_STEPS, "Steps between the newest committed checkpoint and the "
             "newest durable one.", result="max", default="0"),
        Item("gpufleet.job.durable.lag_seconds", "Job: durable tier lag",
             job.DURABLE_LAG_SECONDS, "Seconds the oldest committed checkpoint not yet durable "
             "has waited.", result="max", units="s", default="0"),
        Item("gpufleet.job.durable.upload_failures", "Job: failed uploads per second",
             f"{job.UPLOAD_FAILURES}_total", "Failed uploads to the durable tier.",
             result="sum", rate=True, default="0"),
    ]  # fmt: skip


def serving_items() -> list[Item]:
    """Per model and version of a Triton server (prototypes of the model discovery): the series
    the inference dashboard and the autoscaler read."""
    sel = f'{{model="{MODEL}",version="{VERSION}"}}'
    name = f"Triton {MODEL} v{VERSION}"
    counters = (
        ("request_success", "successful requests per second", "rps"),
        ("request_failure", "failed requests per second", "rps"),
        ("count", "inferences per second", "ips"),
        ("exec_count", "model executions per second", "eps"),
        ("request_duration_us", "request time per second (µs/s)", ""),
        ("queue_duration_us", "queue time per second (µs/s)", ""),
    )
    return [
        Item(f"gpufleet.triton.{short}.rate[{MODEL},{VERSION}]", f"{name}: {what}",
             f"nv_inference_{short}{sel}", f"Triton's nv_inference_{short}, per second.",
             result="sum", units=unit, rate=True, default="0")
        for short, what, unit in counters
    ]  # fmt: skip
