"""deploy/prometheus: promtool checks and tests the rules; every alert has a must-fire and a
must-not-fire case; every gpufleet metric a rule reads is one the exporter produces."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.metric_names import NAME, produced
from tests.support.paths import REPO

# promtool on every rule mutant: minutes in all, not `make check`'s.
pytestmark = pytest.mark.slow

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


RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/gpufleet/gpufleet/blob/main/docs/runbooks.md"


def test_every_alert_links_its_own_runbook_section() -> None:
    """runbook_url on every alert (issue 14), to a section of docs/runbooks.md that says what
    the alert means and what to do; no section for an alert that is gone."""
    text = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    alerts = [r for r in _rules() if "alert" in r]
    for rule in alerts:
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}", name
        assert "**Means:**" in sections[name] and "**Do:**" in sections[name], name
    assert set(sections) == {r["alert"] for r in alerts}


def test_every_alert_waits_or_holds_before_it_resolves() -> None:
    """`for:` where a condition can flap; event alerts (XID, ECC) keep firing instead, so they
    do not resolve themselves 10 minutes after the event."""
    for rule in _rules():
        if "alert" in rule:
            assert "for" in rule or "keep_firing_for" in rule, rule["alert"]


@needs_promtool
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_rule_mutant_that_changes_a_meaning_fails_a_test() -> None:
    """scripts/rule_mutants.py: each changed threshold, comparison, aggregation and for: of the
    rules makes some promtool test fail, but for the mutants it lists as equivalent, each with
    its reason; and each of those still survives (a stale excuse would hide a gap)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "rule_mutants.py"), "-o", "json"],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["kill_rate_of_non_equivalent"] == 1.0
    assert report["mutants"] >= 90 and report["equivalent"] <= 4
    assert all(survivor["equivalent"] for survivor in report["survivors"])
    assert report["stale_equivalents"] == []


def test_the_exporter_zeroes_exactly_the_codes_the_hardware_alert_names() -> None:
    """The exporter reports the hardware XID codes at 0 from its start, so their first event is
    an increase and the alert fires at once; a code the alert names that the exporter did not
    zero would page only 10 minutes after the exporter started."""
    from gpufleet.observe.devices import HARDWARE_XIDS

    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    (alert,) = [r for r in rules if r.get("alert") == "GpufleetGpuXidHardware"]
    named = re.search(r'xid=~"([0-9|]+)"', alert["expr"])
    assert named is not None
    assert sorted(int(code) for code in named.group(1).split("|")) == sorted(HARDWARE_XIDS)
