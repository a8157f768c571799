"""gpufleet's Zabbix templates as a Zabbix 6.0 (LTS) export: three templates in one file.

- "gpufleet GPU node by HTTP": a GPU node (host) runs `gpufleet exporter`; its GPUs are found by
  low-level discovery, each with its readings, health items and the GPU alerts' mirrors.
- "gpufleet job by HTTP": a training job's metrics endpoint (`metrics.port`), job-wide values and
  the job alerts' mirrors; the job and its namespace are macros, and tags.
- "gpufleet Triton by HTTP": a Triton server's metrics, per discovered model and version.

UUIDs (which Zabbix 6.0 requires, as version 4) are derived from each element's name, so the
file is the same every time it is made and an import updates rather than duplicates.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import yaml

from gpufleet.observe.exporter import EXPORTER_PORT
from gpufleet.observe.zabbix import catalogue
from gpufleet.observe.zabbix.catalogue import Item
from gpufleet.observe.zabbix.triggers import (
    GPU,
    JOB,
    JOB_MACROS,
    MACROS,
    MIRRORS,
    NODE,
    PRIORITY,
    Mirror,
)
from gpufleet.render.serving import METRICS as TRITON_METRICS_PORT

GROUP = "Templates/gpufleet"
NODE_TEMPLATE = "gpufleet GPU node by HTTP"
JOB_TEMPLATE = "gpufleet job by HTTP"
TRITON_TEMPLATE = "gpufleet Triton by HTTP"
INTERVAL = ("{$GPUFLEET.INTERVAL}", "30s", "How often the metrics page is read.")
# The job's metrics.port: docs/observability.md's example (a spec sets its own; set the
# macro to it).
JOB_METRICS_PORT = 9410


def uuid_of(*names: str) -> str:
    digest = hashlib.sha256("\0".join(names).encode()).digest()
    return uuid.UUID(bytes=digest[:16], version=4).hex


def _tags(**tags: str) -> list[dict[str, str]]:
    return [{"tag": k, "value": v} for k, v in tags.items()]


def _master(template: str, key: str, what: str, port_macro: str) -> dict[str, Any]:
    """The one HTTP request per interval; the dependent items parse its text."""
    return {
        "uuid": uuid_of(template, key),
        "name": f"{what}: metrics page",
        "type": "HTTP_AGENT",
        "key": key,
        "delay": INTERVAL[0],
        "history": "0",
        "trends": "0",
        "value_type": "TEXT",
        "url": f"{{$GPUFLEET.SCHEME}}://{{HOST.CONN}}:{port_macro}/metrics",
        "description": f"The {what}'s Prometheus text; the other items are read from it.",
        "tags": _tags(component="raw"),
    }


def _steps(item: Item) -> list[dict[str, Any]]:
    result = ["value", ""] if item.result == "value" else ["function", item.result]
    pattern: dict[str, Any] = {"type": "PROMETHEUS_PATTERN", "parameters": [item.pattern, *result]}
    if item.default is None:
        pattern |= {"error_handler": "DISCARD_VALUE"}
    else:
        pattern |= {"error_handler": "CUSTOM_VALUE", "error_handler_params": item.default}
    steps = [pattern]
    if item.javascript:
        steps.append({"type": "JAVASCRIPT", "parameters": [item.javascript]})
    if item.rate:
        steps.append({"type": "CHANGE_PER_SECOND", "parameters": [""]})
    return steps


def _item(template: str, item: Item, master: str, tags: list[dict[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uuid": uuid_of(template, item.key),
        "name": item.name,
        "type": "DEPENDENT",
        "key": item.key,
        "delay": "0",
        "value_type": item.value_type,
        "description": item.description,
        "preprocessing": _steps(item),
        "master_item": {"key": master},
        "tags": tags,
    }
    if item.units:
        out["units"] = item.units
    return out


def _description(alert: str, rule: dict[str, Any]) -> str:
    """The alert's own description, its label references as the trigger's macros."""
    names = {"gpu": "{#GPU}", "node": "{HOST.NAME}", "namespace": "{$GPUFLEET.JOB.NAMESPACE}",
             "job_name": "{$GPUFLEET.JOB.NAME}"}  # fmt: skip
    text = rule["annotations"].get("description", "")
    text = re.sub(r"\{\{ *\$labels\.(\w+) *\}\}", lambda m: names.get(m[1], f"<{m[1]}>"), text)
    text = re.sub(r"\{\{.*?\}\}", "", text)  # Prometheus's template conditionals
    return f"Mirrors the Prometheus alert {alert}. {text}"


def _trigger(template: str, mirror: Mirror, rules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rule = rules[mirror.alert]
    return {
        "uuid": uuid_of(template, mirror.alert),
        "expression": mirror.expression.replace("{t}", template),
        "name": mirror.name,
        "priority": PRIORITY[rule["labels"]["severity"]],
        "description": _description(mirror.alert, rule),
        "url": rule["annotations"]["runbook_url"],
        "tags": _tags(alert=mirror.alert, severity=rule["labels"]["severity"]),
    }


def _macros(*macros: tuple[str, str, str]) -> list[dict[str, str]]:
    return [{"macro": m, "value": v, "description": d} for m, v, d in macros]


def _template(name: str, description: str, **parts: Any) -> dict[str, Any]:
    return {"uuid": uuid_of(name), "template": name, "name": name, "description": description,
            "groups": [{"name": GROUP}], **parts}  # fmt: skip


def _triggers(where: str, template: str, rules: dict[str, dict[str, Any]]) -> list[Any]:
    return [_trigger(template, m, rules) for m in MIRRORS if m.where == where]


def _discovery(
    template: str,
    key: str,
    name: str,
    master: str,
    metric: str,
    labels: tuple[str, ...],
    prototypes: list[dict[str, Any]],
    triggers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A dependent low-level discovery rule: one entity per series of ``metric`` on the page,
    a macro per label ({#GPU} from label gpu)."""
    return {
        "uuid": uuid_of(template, key), "name": name, "type": "DEPENDENT", "key": key,
        "delay": "0", "lifetime": "7d", "master_item": {"key": master},
        "item_prototypes": prototypes, **({"trigger_prototypes": triggers} if triggers else {}),
        "lld_macro_paths": [{"lld_macro": f"{{#{label.upper()}}}", "path": f"$.labels.{label}"}
                            for label in labels],
        "preprocessing": [{"type": "PROMETHEUS_TO_JSON", "parameters": [metric]}],
    }  # fmt: skip


def _node(rules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    t, master = NODE_TEMPLATE, "gpufleet.exporter.get"
    gpu_tags = _tags(component="gpu", gpu="{#GPU}", uuid="{#UUID}", node="{HOST.NAME}")
    gpus = _discovery(
        t,
        "gpufleet.gpu.discovery",
        "GPUs",
        master,
        "gpufleet_gpu_up",
        ("gpu", "uuid", "model"),
        [_item(t, i, master, gpu_tags) for i in catalogue.gpu_items()],
        _triggers(GPU, t, rules),
    )
    tags = _tags(component="exporter", node="{HOST.NAME}")
    return _template(
        t, "A GPU node running `gpufleet exporter` (the chart's DaemonSet): its GPUs found by "
        "discovery, readings, ECC and XID events, who holds each GPU, and the GPU and exporter "
        "alerts of gpufleet's Prometheus rules as triggers.",
        items=[_master(t, master, "exporter", "{$GPUFLEET.EXPORTER.PORT}"),
               *(_item(t, i, master, tags) for i in catalogue.exporter_items())],
        discovery_rules=[gpus],
        macros=_macros(INTERVAL, ("{$GPUFLEET.SCHEME}", "http", "http or https."),
                       ("{$GPUFLEET.EXPORTER.PORT}", str(EXPORTER_PORT), "The exporter's port."),
                       *((m, v, d) for m, (v, d) in MACROS.items())),
        tags=[{"tag": "class", "value": "hardware"}, {"tag": "target", "value": "gpufleet"}],
    )  # fmt: skip


def _job(rules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    t, master = JOB_TEMPLATE, "gpufleet.job.get"
    tags = _tags(component="job", job="{$GPUFLEET.JOB.NAME}",
                 namespace="{$GPUFLEET.JOB.NAMESPACE}")  # fmt: skip
    return _template(
        t, "A gpufleet training job's metrics endpoint (spec metrics.port; `gpufleet run` or a "
        "worker pod): step, throughput, checkpoints, restarts, time since progress, and the job "
        "alerts of gpufleet's Prometheus rules as triggers. One host per job endpoint.",
        items=[_master(t, master, "job", "{$GPUFLEET.JOB.PORT}"),
               *(_item(t, i, master, tags) for i in catalogue.job_items())],
        macros=_macros(INTERVAL, ("{$GPUFLEET.SCHEME}", "http", "http or https."),
                       ("{$GPUFLEET.JOB.PORT}", str(JOB_METRICS_PORT), "The spec's metrics.port."),
                       ("{$GPUFLEET.JOB.NAME}", "", "The job's name (tags, trigger names)."),
                       ("{$GPUFLEET.JOB.NAMESPACE}", "", "The job's namespace (tenant)."),
                       *((m, v, d) for m, (v, d) in JOB_MACROS.items())),
        tags=[{"tag": "class", "value": "application"}, {"tag": "target", "value": "gpufleet"}],
    )  # fmt: skip


def _triton() -> dict[str, Any]:
    t, master = TRITON_TEMPLATE, "gpufleet.triton.get"
    tags = _tags(component="serving", model="{#MODEL}", version="{#VERSION}", node="{HOST.NAME}")
    models = _discovery(
        t,
        "gpufleet.triton.discovery",
        "Models",
        master,
        "nv_inference_request_success",
        ("model", "version"),
        [_item(t, i, master, tags) for i in catalogue.serving_items()],
    )
    return _template(
        t, "A Triton server of a gpufleet InferenceService (or `gpufleet serve`): requests, "
        "failures, inferences, executions, request and queue time per model and version.",
        items=[_master(t, master, "Triton server", "{$GPUFLEET.TRITON.PORT}")],
        discovery_rules=[models],
        macros=_macros(INTERVAL, ("{$GPUFLEET.SCHEME}", "http", "http or https."),
                       ("{$GPUFLEET.TRITON.PORT}", str(TRITON_METRICS_PORT),
                        "Triton's metrics port.")),
        tags=[{"tag": "class", "value": "application"}, {"tag": "target", "value": "gpufleet"}],
    )  # fmt: skip


def alerts_of(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The alerting rules of a Prometheus rule file, by alert name."""
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def export(rules: dict[str, Any]) -> dict[str, Any]:
    """The Zabbix 6.0 export document, given gpufleet's Prometheus rule file (parsed)."""
    alerts = alerts_of(rules)
    job = _job(alerts)
    return {
        "zabbix_export": {
            "version": "6.0",
            "groups": [{"uuid": uuid_of(GROUP), "name": GROUP}],
            "templates": [_node(alerts), job, _triton()],
            # Template-level triggers sit beside the templates (those of the GPU discovery are
            # prototypes, inside it).
            "triggers": [
                *_triggers(NODE, NODE_TEMPLATE, alerts),
                *_triggers(JOB, JOB_TEMPLATE, alerts),
            ],
        }
    }


class _Dumper(yaml.SafeDumper):
    """Every element written out in full: Zabbix's importer knows no YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def export_yaml(rules: dict[str, Any]) -> str:
    header = (
        "# Generated from gpufleet's metric catalogue and deploy/prometheus/gpufleet-rules.yaml\n"
        "# by scripts/gen_zabbix_template.py; `make lint` checks it is current. Import it in\n"
        "# Zabbix 6.0 or newer: Configuration > Templates > Import.\n"
    )
    body = yaml.dump(export(rules), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return header + body
