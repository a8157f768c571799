"""Which work unit a test belongs to (tests/support/units.py): all of tests/cluster/ is one,
a module JOINED to another shares that one's, every other module is its own."""

from __future__ import annotations

from tests.support.units import CONTROL_PLANE, JOINED, work_unit


def test_the_control_planes_modules_are_one_unit_and_joined_modules_share_one() -> None:
    assert work_unit("tests/cluster/test_realnodes.py::t") == CONTROL_PLANE
    assert work_unit("tests/cluster/test_devcluster.py::t[x]") == CONTROL_PLANE
    assert work_unit("tests/unit/test_spec.py::t") == "tests/unit/test_spec.py"
    for module, joins in JOINED.items():
        assert work_unit(f"{module}::t") == joins
