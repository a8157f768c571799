"""Zabbix triggers mirroring gpufleet's Prometheus alerts (deploy/prometheus/gpufleet-rules.yaml).

One trigger per alert, with the alert's name as its `alert` tag, its severity as the priority and
its runbook as the URL (both read from the rule file when the template is made). What Prometheus
says with `for:` Zabbix says with a function over the same window (min/max over 5m: true all 5
minutes). Zabbix judges such a window by the values it holds, so on a host added a minute ago a
5-minute condition can hold after one bad read (Prometheus would wait the 5 minutes).
`keep_firing_for` after a counter's event becomes "the counter is above its minimum over that
window". Thresholds are user macros, so a site tunes them per host. Two mirrors are near, not
exact: the slow-job trigger compares the rate between two reads (not over 5 minutes) with its
1-hour median, and a job host is one endpoint (one pod's ranks; the rule takes the whole job's).
"""

from __future__ import annotations

from dataclasses import dataclass

GPU, NODE, JOB = "gpu", "node", "job"  # where a trigger lives: the GPU discovery, or a template
# Prometheus severity label -> Zabbix trigger priority.
PRIORITY = {"critical": "HIGH", "warning": "WARNING", "info": "INFO"}
# Threshold macros and their defaults: the rules' own numbers (a test compares them).
MACROS = {
    "{$GPUFLEET.GPU.TEMP.MAX}": ("85", "°C above which a GPU is too hot (5 minutes)."),
    "{$GPUFLEET.GPU.IDLE.MAX}": ("0.05", "Utilization below which a held GPU is idle (30 min)."),
    "{$GPUFLEET.EXPORTER.NODATA}": ("5m", "No answer from the exporter this long: it is down."),
}
# The job template's.
JOB_MACROS = {
    "{$GPUFLEET.DURABLE.LAG.MAX}": ("900", "Seconds a committed checkpoint may wait for its "
                                    "durable copy (2 minutes over it: a problem)."),
}  # fmt: skip


@dataclass(frozen=True)
class Mirror:
    """``expression`` with ``{t}`` for the template's name (Zabbix 6.0 syntax)."""

    alert: str
    where: str
    name: str
    expression: str


def _counter_event(key: str, window: str) -> str:
    return f"last(/{{t}}/{key})>min(/{{t}}/{key},{window})"


MIRRORS = (
    Mirror("GpufleetGpuXidHardware", GPU, "GPU {#GPU} on {HOST.NAME}: hardware XID",
           _counter_event("gpufleet.gpu.xid.hardware[{#GPU}]", "1h")),
    Mirror("GpufleetGpuXidApplication", GPU,
           "GPU {#GPU} on {HOST.NAME}: a program faulted (application XID)",
           _counter_event("gpufleet.gpu.xid.application[{#GPU}]", "15m")),
    Mirror("GpufleetGpuXidOther", GPU, "GPU {#GPU} on {HOST.NAME}: unclassified XID",
           _counter_event("gpufleet.gpu.xid.other[{#GPU}]", "15m")),
    Mirror("GpufleetGpuUncorrectableEcc", GPU,
           "GPU {#GPU} on {HOST.NAME}: uncorrectable ECC errors",
           _counter_event("gpufleet.gpu.ecc.uncorrected[{#GPU}]", "1h")),
    Mirror("GpufleetGpuHighTemperature", GPU, "GPU {#GPU} on {HOST.NAME}: too hot",
           "min(/{t}/gpufleet.gpu.temperature_celsius[{#GPU}],5m)>{$GPUFLEET.GPU.TEMP.MAX}"),
    Mirror("GpufleetGpuUnreadable", GPU, "GPU {#GPU} on {HOST.NAME}: unreadable",
           "max(/{t}/gpufleet.gpu.up[{#GPU}],5m)=0"),
    Mirror("GpufleetGpuAllocatedIdle", GPU, "GPU {#GPU} on {HOST.NAME}: held but idle",
           "max(/{t}/gpufleet.gpu.utilization_ratio[{#GPU}],30m)<{$GPUFLEET.GPU.IDLE.MAX}"
           " and min(/{t}/gpufleet.gpu.allocated[{#GPU}],30m)>0"),
    Mirror("GpufleetExporterDown", NODE, "gpufleet exporter on {HOST.NAME}: down",
           # Not on the page item: Zabbix evaluates nothing on an item that keeps no history.
           "nodata(/{t}/gpufleet.exporter.devices,{$GPUFLEET.EXPORTER.NODATA})=1"),
    Mirror("GpufleetExporterSeesNoGpu", NODE, "gpufleet exporter on {HOST.NAME}: reads no GPU",
           "max(/{t}/gpufleet.exporter.devices,10m)=0"),
    Mirror("GpufleetExporterPodResourcesDown", NODE,
           "gpufleet exporter on {HOST.NAME}: kubelet pod-resources unreadable",
           "max(/{t}/gpufleet.exporter.pod_resources_up,10m)=0"),
    Mirror("GpufleetJobNoProgress", JOB,
           "Job {$GPUFLEET.JOB.NAMESPACE}/{$GPUFLEET.JOB.NAME}: no progress within its hangTimeout",
           "min(/{t}/gpufleet.job.since_progress,1m)>last(/{t}/gpufleet.job.hang_timeout)"
           " and last(/{t}/gpufleet.job.hang_timeout)>0"),
    # The rule compares the 5-minute rate with half its own 1-hour median, for 10 minutes.
    Mirror("GpufleetJobSlow", JOB,
           "Job {$GPUFLEET.JOB.NAMESPACE}/{$GPUFLEET.JOB.NAME}: under half its usual speed",
           "max(/{t}/gpufleet.job.samples.rate,10m)"
           "<0.5*percentile(/{t}/gpufleet.job.samples.rate,1h,50)"),
    Mirror("GpufleetCheckpointNotDurable", JOB,
           "Job {$GPUFLEET.JOB.NAMESPACE}/{$GPUFLEET.JOB.NAME}: a checkpoint not durable in 15 "
           "minutes",
           "min(/{t}/gpufleet.job.durable.lag_seconds,2m)>{$GPUFLEET.DURABLE.LAG.MAX}"),
)  # fmt: skip

# Alerts with no trigger, and why.
NOT_MIRRORED = {
    "GpufleetExporterScrapeErrors": "Zabbix records each failed fetch of the exporter's page "
    "as the HTTP item turning unsupported (its internal event); GpufleetExporterDown's mirror "
    "fires when it stays so.",
    "GpufleetExporterAbsent": "Prometheus-only: a scrape target gone from service discovery. In "
    "Zabbix the node is a host that stays; GpufleetExporterDown's mirror fires.",
}
