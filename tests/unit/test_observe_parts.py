"""The exporter's parts in this process: where to listen, a lost simulated GPU, and GPUs that
lack some readings. The integration tests reach the same code through the CLI in a subprocess
(tests/integration/test_exporter.py), which `make test` does not measure
(tests/support/coverage.py); these keep the package's coverage floor independent of them."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest

from gpufleet.errors import MetricsPortError
from gpufleet.observe.devices import Reading, SimulatedDevice
from gpufleet.observe.exporter import GpuCollector
from gpufleet.observe.http import check_listen


@pytest.mark.parametrize(
    ("address", "port", "option", "want"),
    [
        ("127.0.0.1", 65536, "--port", "must be 0..65535, got 65536"),
        ("127.0.0.1", -1, "--port", "must be 0..65535, got -1"),
        ("999.1.1.1", 0, "--address", "not an IP address or host name: '999.1.1.1'"),
        ("no such host", 0, "--address", "not an IP address or host name"),
        ("", 0, "--address", "not an IP address or host name: ''"),
    ],
)
def test_a_bad_address_or_port_names_its_option(
    address: str, port: int, option: str, want: str
) -> None:
    with pytest.raises(MetricsPortError) as caught:
        check_listen(address, port)
    assert caught.value.option == option  # type: ignore[attr-defined]
    assert want in str(caught.value)


def test_a_host_name_is_resolved_to_the_address_to_bind() -> None:
    family, host = check_listen("localhost", 0)
    assert family in (socket.AF_INET, socket.AF_INET6)
    assert host in ("127.0.0.1", "::1")
    assert check_listen("::1", 9400)[0] == socket.AF_INET6


def test_a_simulated_gpu_that_fails_answers_no_reads_and_counts_its_xid() -> None:
    gpu = SimulatedDevice(0, xids=((13, 1.0),))
    assert gpu.read().memory_total_bytes > 0
    gpu.fail(79)
    gpu.fail(79)
    with pytest.raises(RuntimeError, match="GPU_IS_LOST"):
        gpu.read()
    assert gpu.xid_errors() == ((13, 1.0), (79, 2.0))


@dataclass
class PlainGpu:
    """A GPU that reports only what every GPU has: no temperature, power, links or ECC, and no
    XID counting (xid_errors None)."""

    index: int
    model: str = "Plain GPU"

    @property
    def uuid(self) -> str:
        return f"GPU-plain-{self.index}"

    def read(self) -> Reading:
        return Reading(0.25, 1.0e9, 8.0e9)

    def xid_errors(self) -> tuple[tuple[int, float], ...] | None:
        return None


def test_a_gpu_without_some_readings_has_no_series_for_them() -> None:
    """Readings a GPU does not have are left out, not exported as 0 (a 0 W GPU or 0 ECC errors
    would be a claim): the simulated GPU has them all, the plain one only the three."""
    collector = GpuCollector([PlainGpu(0), SimulatedDevice(1)], node="n")  # type: ignore[list-item]
    gpus: dict[str, set[str]] = {}
    for family in collector.collect():
        for sample in family.samples:
            if "gpu" in sample.labels:  # not the exporter's own (gpufleet_exporter_*)
                gpus.setdefault(sample.labels["gpu"], set()).add(sample.name)
    plain, simulated = gpus["0"], gpus["1"]
    assert {"gpufleet_gpu_up", "gpufleet_gpu_utilization_ratio"} <= plain
    assert not {n for n in plain if "power" in n or "ecc" in n or "xid" in n or "nvlink" in n}
    assert {n for n in simulated if "power" in n} and {n for n in simulated if "xid" in n}
    assert {n for n in simulated if "ecc" in n}
