"""The Zabbix templates (deploy/zabbix): generated from the metric catalogue and the alert rules,
every alert mirrored by a trigger (or said why not), every item reading a metric gpufleet really
exposes, every trigger reading items of its own template. The import into a real Zabbix and a
trigger firing: tests/integration/test_zabbix.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from gpufleet.observe.devices import APPLICATION_XIDS, HARDWARE_XIDS
from gpufleet.observe.exporter import METRICS
from gpufleet.observe.zabbix.export import (
    JOB_TEMPLATE,
    NODE_TEMPLATE,
    alerts_of,
    export,
    export_yaml,
)
from gpufleet.observe.zabbix.triggers import JOB_MACROS, MACROS, MIRRORS, NOT_MIRRORED
from tests.support.metric_names import NAME, produced
from tests.support.paths import REPO

RULES = yaml.safe_load((REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml").read_text())
ALERTS = alerts_of(RULES)
DOC = export(RULES)["zabbix_export"]
TEMPLATES = {t["template"]: t for t in DOC["templates"]}


def _items(template: dict[str, Any]) -> list[dict[str, Any]]:
    rules = template.get("discovery_rules", [])
    return [*template["items"], *(p for r in rules for p in r["item_prototypes"])]


def _triggers() -> list[dict[str, Any]]:
    protos = [p for t in DOC["templates"] for r in t.get("discovery_rules", [])
              for p in r.get("trigger_prototypes", [])]  # fmt: skip
    return [*DOC["triggers"], *protos]


def test_the_checked_in_file_is_current() -> None:
    path = REPO / "deploy" / "zabbix" / "gpufleet-templates.yaml"
    assert path.read_text() == export_yaml(RULES), "run python scripts/gen_zabbix_template.py"
    assert "&id" not in path.read_text()  # Zabbix's importer knows no YAML anchors


def test_every_alert_has_its_trigger_or_a_reason() -> None:
    mirrored = [m.alert for m in MIRRORS]
    assert len(mirrored) == len(set(mirrored))
    assert set(mirrored) | set(NOT_MIRRORED) == set(ALERTS)
    assert not set(mirrored) & set(NOT_MIRRORED)


def test_triggers_carry_the_alerts_severity_runbook_and_name() -> None:
    priority = {"critical": "HIGH", "warning": "WARNING"}
    triggers = _triggers()
    assert len(triggers) == len(MIRRORS)
    for trigger in triggers:
        tags = {t["tag"]: t["value"] for t in trigger["tags"]}
        rule = ALERTS[tags["alert"]]
        assert trigger["priority"] == priority[rule["labels"]["severity"]]
        assert trigger["url"] == rule["annotations"]["runbook_url"]
        assert "{{" not in trigger["description"]


def test_triggers_read_only_items_of_their_own_template() -> None:
    for trigger in _triggers():
        refs = re.findall(r"/([^/]+)/([^,)]+)", trigger["expression"])
        assert refs, trigger["expression"]
        for template, key in refs:
            assert key in {i["key"] for i in _items(TEMPLATES[template])}, (template, key)


def test_items_read_metrics_gpufleet_exposes() -> None:
    known = produced()
    steps = [s for t in DOC["templates"] for i in _items(t) for s in i.get("preprocessing", [])]
    patterns = [s["parameters"][0] for s in steps if s["type"] == "PROMETHEUS_PATTERN"]
    assert patterns
    for pattern in patterns:
        assert set(NAME.findall(pattern.split("{")[0])) <= known, pattern


def test_every_reading_of_the_exporter_is_collected_per_gpu() -> None:
    (gpus,) = TEMPLATES["gpufleet GPU node by HTTP"]["discovery_rules"]
    patterns = [p["preprocessing"][0]["parameters"][0] for p in gpus["item_prototypes"]]
    for metric, _, kind in METRICS.values():
        name = f"{metric}_total" if kind == "counter" else metric
        assert f'{name}{{gpu="{{#GPU}}"}}' in patterns, name


@pytest.mark.parametrize(
    ("alert", "codes"),
    [("GpufleetGpuXidHardware", HARDWARE_XIDS), ("GpufleetGpuXidApplication", APPLICATION_XIDS)],
)
def test_the_xid_items_count_the_codes_the_alerts_name(alert: str, codes: tuple[int, ...]) -> None:
    named = re.search(r'xid=~"([0-9|]+)"', ALERTS[alert]["expr"])
    assert named is not None
    assert sorted(int(c) for c in named.group(1).split("|")) == sorted(codes)
    (gpus,) = TEMPLATES["gpufleet GPU node by HTTP"]["discovery_rules"]
    patterns = {p["key"]: p["preprocessing"][0]["parameters"] for p in gpus["item_prototypes"]}
    kind = "hardware" if alert.endswith("Hardware") else "application"
    pattern, result, function = patterns[f"gpufleet.gpu.xid.{kind}[{{#GPU}}]"]
    # Anchored: Zabbix's =~ searches, so "13|31|43" alone would match XID 143.
    assert f'xid=~"^({"|".join(map(str, codes))})$"' in pattern
    assert (result, function) == ("function", "sum")


@pytest.mark.parametrize(("macro", "alert", "threshold", "template"), [
    ("{$GPUFLEET.GPU.TEMP.MAX}", "GpufleetGpuHighTemperature", r"> (\S+)$", NODE_TEMPLATE),
    ("{$GPUFLEET.GPU.IDLE.MAX}", "GpufleetGpuAllocatedIdle", r"< (\S+)$", NODE_TEMPLATE),
    ("{$GPUFLEET.DURABLE.LAG.MAX}", "GpufleetCheckpointNotDurable", r"> (\S+)$", JOB_TEMPLATE),
])  # fmt: skip
def test_threshold_macros_default_to_the_rules_numbers(
    macro: str, alert: str, threshold: str, template: str
) -> None:
    found = re.search(threshold, ALERTS[alert]["expr"].strip())
    assert found is not None
    default = {**MACROS, **JOB_MACROS}[macro][0]
    assert float(default) == float(found.group(1))
    macros = {m["macro"]: m["value"] for m in TEMPLATES[template]["macros"]}
    assert macros[macro] == default


def test_uuids_are_unique_version_4() -> None:
    text = export_yaml(RULES)
    uuids = re.findall(r"uuid: ([0-9a-f]+)", text)
    assert len(uuids) == len(set(uuids)) > 50
    assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", u) for u in uuids)


def test_the_exporter_is_down_after_the_rules_for() -> None:
    """nodata over {$GPUFLEET.EXPORTER.NODATA}, the rule's `for:`, on an item that keeps history
    (Zabbix evaluates nothing on the page item, which keeps none)."""
    assert MACROS["{$GPUFLEET.EXPORTER.NODATA}"][0] == ALERTS["GpufleetExporterDown"]["for"]
    (down,) = [t for t in DOC["triggers"] if "nodata(" in t["expression"]]
    key = re.search(r"nodata\(/[^/]+/([^,]+),", down["expression"])
    assert key is not None
    (item,) = [i for i in TEMPLATES["gpufleet GPU node by HTTP"]["items"] if i["key"] == key[1]]
    assert item.get("history", "90d") != "0"
