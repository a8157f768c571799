"""deploy/prometheus: promtool checks and tests the rules; every alert has a must-fire and a
must-not-fire case; every gpufleet metric a rule reads is one the exporter produces."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.metric_names import NAME, produced

RULES = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"
TESTS = sorted((REPO / "deploy" / "prometheus" / "tests").glob("*.test.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make tools)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_check_rules() -> None:
    proc = promtool("check", "rules", str(RULES), cwd=RULES.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
@pytest.mark.parametrize("test_file", TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(test_file: Path) -> None:
    proc = promtool("test", "rules", test_file.name, cwd=test_file.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _rules() -> list[dict[str, str]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_has_a_must_fire_and_a_must_not_fire_case() -> None:
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t["exp_alerts"] else quiet).add(t["alertname"])
    assert alerts, "no alerts found"
    assert alerts - fires == set(), "alerts without a must-fire test"
    assert alerts - quiet == set(), "alerts without a must-not-fire test"


def test_rules_read_only_metrics_that_exist() -> None:
    known = produced()
    for rule in _rules():
        used = set(NAME.findall(rule["expr"]))  # (the exporter-down alert reads only `up`)
        assert used <= known, (rule.get("alert") or rule.get("record"), sorted(used - known))
