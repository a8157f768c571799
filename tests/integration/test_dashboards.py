"""Grafana dashboards: every panel query parses (promtool) and reads only metrics that the
exporter, the job metrics or the recording rules produce."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.metric_names import NAME, produced
from tests.support.paths import REPO

DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))


def queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            if panel["type"] == "text":  # notes, no queries
                continue
            assert panel["targets"], (path.name, panel["title"])
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out


def test_dashboards_exist_with_unique_uids() -> None:
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert {p.stem for p in DASHBOARDS} >= {
        "cluster-overview",
        "node-gpus",
        "training-job",
        "tenants-queues",
        "inference",
        "queues",
    }
    assert len(uids) == len(set(uids))
    assert all(panel_targets for *_, panel_targets in queries())


def test_queries_read_existing_metrics() -> None:
    known = produced()
    for dashboard, title, expr in queries():
        used = set(NAME.findall(expr))
        assert used, (dashboard, title, expr)
        assert used <= known, (dashboard, title, sorted(used - known))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make tools)")
def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as the expression of a recording rule (variables filled)."""
    rules: list[dict[str, Any]] = []
    for i, (_, _, expr) in enumerate(queries()):
        concrete = re.sub(r"\$\{?__range_s\}?", "3600", expr)  # Grafana's built-ins first
        concrete = re.sub(r"\$\{?__\w+\}?", "5m", concrete)
        concrete = re.sub(r"\$\{?\w+\}?", "x", concrete)
        rules.append({"record": f"dashboard:check_{i}", "expr": concrete})
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


GROUPING = re.compile(r"\b(?:by|on|without)\s*\(([^)]*)\)")


def test_every_grouping_by_job_name_keeps_the_namespace() -> None:
    """Job names are unique per namespace only: two teams may both run `train`. A rule or panel
    that groups by job_name alone lets a healthy job hide a stuck one and adds the two jobs'
    samples (issue 14)."""
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml").read_text())
    exprs = [
        (r.get("alert") or r["record"], r["expr"]) for g in rules["groups"] for r in g["rules"]
    ]
    exprs += [(f"{dashboard}: {title}", expr) for dashboard, title, expr in queries()]
    checked = 0
    for where, expr in exprs:
        for clause in GROUPING.findall(expr):
            labels = {label.strip() for label in clause.split(",")}
            if "job_name" in labels:
                checked += 1
                assert "namespace" in labels, (where, expr)
    assert checked >= 10  # the job rules and the training-job dashboard
