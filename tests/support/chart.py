"""The platform chart and helm, for the tests that render it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import REPO

CHART = REPO / "deploy" / "helm" / "gpufleet"
HELM = shutil.which("helm")
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not on PATH (make test fetches it: scripts/get-helm.sh)"
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, check=False)


def template(values: Path | None = None) -> list[dict[str, Any]]:
    """The chart's objects rendered as release "gpufleet" in gpufleet-system."""
    args = ["template", "gpufleet", str(CHART), "--namespace", "gpufleet-system"]
    proc = helm(*args, *(["-f", str(values)] if values else []))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def expected_namespaces(values: Path) -> list[str]:
    """The namespaces a values file puts objects in that the chart does not create (its
    Alertmanager's, its checkpoint mirror's): a cluster that installs it must have them."""
    v = yaml.safe_load(values.read_text()) or {}
    alerting = (v.get("monitoring") or {}).get("alerting") or {}
    mirror = (v.get("storage") or {}).get("mirror") or {}
    names = [alerting.get("namespace") if alerting.get("enabled") else None,
             mirror.get("namespace") if mirror.get("enabled") else None]  # fmt: skip
    return sorted({n for n in names if n})
