"""Which work unit a test belongs to, and the priority the workers beside the control plane's
unit take (tests/support/units.py)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import REPO
from tests.support.units import CONTROL_PLANE, JOINED, OTHERS_NICE, work_unit

# A process's niceness before and after a test of the control plane's unit, then of another
# unit, then of another again (in a process of its own: the change cannot be undone).
NICENESS = """
import json, os, sys
from tests.support.units import yield_to_control_plane
seen = [os.getpriority(os.PRIO_PROCESS, 0)]
for nodeid in sys.argv[1:]:
    yield_to_control_plane(nodeid)
    seen.append(os.getpriority(os.PRIO_PROCESS, 0))
print(json.dumps(seen))
"""


def test_the_control_planes_modules_are_one_unit_and_joined_modules_share_one() -> None:
    assert work_unit("tests/cluster/test_realnodes.py::t") == CONTROL_PLANE
    assert work_unit("tests/cluster/test_devcluster.py::t[x]") == CONTROL_PLANE
    assert work_unit("tests/unit/test_spec.py::t") == "tests/unit/test_spec.py"
    for module, joins in JOINED.items():
        assert work_unit(f"{module}::t") == joins


def test_a_worker_yields_the_cpu_from_its_first_test_outside_the_control_plane() -> None:
    nodeids = ["tests/cluster/test_devcluster.py::t", "tests/unit/test_spec.py::t",
               "tests/chaos/test_resume.py::t"]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", NICENESS, *nodeids], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    start, cluster, other, again = json.loads(done.stdout)
    assert cluster == start  # the control plane's tests keep the default
    assert other == again == max(start, OTHERS_NICE)
