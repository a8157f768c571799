"""The names real nodes give images imported with no registry (devcluster/realnodes/images.py)."""

from __future__ import annotations

from gpufleet.devcluster.realnodes.images import stable_name


def test_each_build_of_the_project_image_has_a_stable_name_and_no_other_image_does() -> None:
    """The name every real node gives the project's image beside its build's (issue 51): what
    job specs and the chart's values for the local cluster name."""
    assert stable_name("localhost/gpufleet:cpu-0375e6860aa5") == "localhost/gpufleet:cpu"
    assert stable_name("localhost/gpufleet:cuda-0375e6860aa5") == "localhost/gpufleet:cuda"
    for other in ("localhost/gpufleet:cpu", "registry.k8s.io/pause:3.10",
                  "localhost/gpufleet-base:bookworm", "ghcr.io/x/gpufleet:cpu-0375e6860aa5",
                  "localhost/gpufleet:cpu-0375e6860aa5-build"):  # fmt: skip
        assert stable_name(other) is None, other
