"""Work units: what one pytest-xdist worker runs whole, one after the other (a test module, the
modules JOINED to it, or all of tests/cluster/), and the order the workers take them in
(tests/conftest.py's collection hook and scheduler; benchmarks/suite_durations.py --units)."""

from __future__ import annotations

import json
from pathlib import Path

# The modules that use the control plane (the devcluster fixture, marker
# `controlplane`) live here, beside the live-cluster tests (marker `cluster`).
CONTROL_PLANE = "tests/cluster"
# Modules that share a costly fixture (tests/support/sharing.py) run as one work unit, in one
# worker, one after the other: module -> the module whose unit it joins.
JOINED = {
    "tests/integration/test_serving_cli.py": "tests/integration/test_serving.py",
    "tests/integration/test_serving_dashboard.py": "tests/integration/test_serving.py",
    "tests/integration/test_serving_tls.py": "tests/integration/test_serving.py",
}


# Each work unit's seconds in a measured run of the suite (`benchmarks/suite_durations.py
# --units`): the workers take the longest first, so that they finish close together; a unit not
# measured yet counts as UNMEASURED_SLOW seconds when it has `slow` tests, else as none.
DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
UNMEASURED_SLOW = 60.0


def unit_seconds() -> dict[str, float]:
    """The measured seconds per work unit (DURATIONS), {} when there are none."""
    try:
        units = json.loads(DURATIONS.read_text())["units"]
    except (OSError, ValueError, KeyError):
        return {}
    return {str(unit): float(seconds) for unit, seconds in units.items()}


def work_unit(nodeid: str) -> str:
    """What runs whole, in one process: a test module (its module fixtures are set up once) with
    the modules JOINED to it, or all of tests/cluster/ (one control plane per process: a second
    would cost a minute to start, and the MPI operator's fixed port allows only one; the
    live-cluster tests beside it are skipped without KUBECONFIG).

    In one process the control plane's modules run last: it runs from their first test to the
    end of the session, and its processes would otherwise run beside every test after them.
    Under pytest-xdist (`make test`: ``-n auto``, tests/conftest.py's scheduler) a worker takes
    the next unit when it is done, in this order: the control plane's first (mostly waiting on
    controllers, it runs beside the rest), then the others by their measured seconds, longest
    first (DURATIONS)."""
    module = nodeid.split("::")[0]
    return CONTROL_PLANE if module.startswith(CONTROL_PLANE + "/") else JOINED.get(module, module)
