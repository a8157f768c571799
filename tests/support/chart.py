"""The platform chart and helm, for the tests that render it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.paths import REPO

CHART = REPO / "deploy" / "helm" / "gpufleet"
HELM = shutil.which("helm")
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not on PATH (make test fetches it: scripts/get-helm.sh)"
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120, check=False)
