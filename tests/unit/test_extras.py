"""A missing optional package (an extra) is one clear line with its install command and exit
code 2 (nothing was started), whichever command needs it."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.extras import install_hint, require


def test_require_names_the_missing_package_and_its_extra() -> None:
    with pytest.raises(UserInputError) as caught:
        require("cluster", "json", "gpufleet_no_such_module", what="the cluster commands")
    error = caught.value
    assert error.exit_code == EXIT_BAD_INPUT
    assert [(e.path, e.message) for e in error.errors] == [
        ("gpufleet_no_such_module", "the cluster commands needs: pip install 'gpufleet[cluster]'")
    ]
    assert [m.__name__ for m in require("serve", "json")] == ["json"]
    assert install_hint("s3") == "pip install 'gpufleet[s3]'"


def test_bench_training_without_mlperf_logging_exits_2_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It used to print its own error and exit 1, unlike every other missing extra."""
    monkeypatch.setitem(sys.modules, "mlperf_logging", None)  # as if it were not installed
    result = CliRunner().invoke(app, ["bench", "training", "--quick"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "mlperf-logging" in result.output
    assert "pip install 'gpufleet[bench]'" in result.output
    assert "Traceback" not in result.output
