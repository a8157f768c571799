"""A real Prometheus (the Debian package) for the tests: started on 127.0.0.1 with gpufleet's
rules and the given scrape jobs, queried over its HTTP API."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpufleet.net import free_port
from tests.support.paths import REPO
from tests.support.procs import stop_processes

RULES = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"
K = TypeVar("K", bound=Hashable)


def query(port: int, promql: str) -> list[dict[str, Any]]:
    """The result of an instant query (an empty list: no data)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


@contextmanager
def prometheus(
    directory: Path,
    scrape_configs: list[dict[str, Any]],
    alertmanager: int | None = None,
    rules: Path = RULES,
) -> Iterator[int]:
    """Prometheus scraping and evaluating gpufleet's rules (or ``rules``) every second, sending
    its alerts to the Alertmanager on 127.0.0.1:``alertmanager`` if given; yields its port."""
    port = free_port()
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrape_configs,
    }
    if alertmanager is not None:
        targets = [f"127.0.0.1:{alertmanager}"]
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": targets}]}]}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={directory / 'prometheus.yml'}",
         f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield port
    finally:
        stop_processes([proc])


def rules_pending_for(directory: Path, seconds: int) -> Path:
    """gpufleet's rules with every alert's ``for`` cut to ``seconds`` (written into
    ``directory``): for a live test of where alerts go, not of when they fire, which promtool's
    tests of deploy/prometheus/tests prove with the rules as they are."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{seconds}s"
    path = directory / "rules-short-for.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def static(job: str, target: str, **extra: Any) -> dict[str, Any]:
    """A scrape job of one target."""
    return {"job_name": job, "static_configs": [{"targets": [target]}], **extra}


def without_data(
    port: int, queries: dict[K, str], may_stay_empty: set[K], timeout: float
) -> dict[K, str]:
    """Query each of ``queries`` until it returns data; give up once only ``may_stay_empty``
    are left, or after ``timeout`` seconds. Returns those that never returned data."""
    empty = dict(queries)
    deadline = time.monotonic() + timeout
    while set(empty) - may_stay_empty and time.monotonic() < deadline:
        for key, expr in list(empty.items()):
            try:
                if query(port, expr):
                    del empty[key]
            except OSError:
                break  # Prometheus still starting
        time.sleep(1)
    return empty


def panel_queries(dashboards: list[Path]) -> dict[tuple[str, str, int], str]:
    """(dashboard file, panel title, target index) -> the target's query, with every variable
    set as Grafana's "All" sets it (`.*`) and ``$__range`` as 5m."""
    out = {}
    for path in dashboards:
        for panel in json.loads(path.read_text())["panels"]:
            for i, target in enumerate(panel.get("targets", [])):
                expr = re.sub(r"\$\{?__range\}?", "5m", target["expr"])
                out[(path.name, panel["title"], i)] = re.sub(r"\$\{?\w+\}?", ".*", expr)
    return out
