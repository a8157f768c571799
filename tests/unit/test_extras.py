"""A missing optional package (an extra) is one clear line with its install command and exit
code 2 (nothing was started), whichever command needs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet.errors import EXIT_BAD_INPUT, UserInputError
from gpufleet.extras import install_hint, require
from tests.support.cli import cli_env


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


@pytest.mark.parametrize(
    ("blocked", "args", "says"),
    [
        ("pynvml", [], "pynvml: gpufleet exporter needs: pip install 'gpufleet[exporter]'"),
        ("grpc", ["--simulate", "1", "--pod-resources", "/nonexistent.sock"],
         "grpc: gpufleet exporter needs: pip install 'gpufleet[exporter]'"),
    ],
)  # fmt: skip
def test_the_exporter_without_its_extra_says_which_in_one_line(
    blocked: str, args: list[str], says: str
) -> None:
    # A module set to None in sys.modules is one that cannot be imported (as if not installed).
    code = (f"import sys; sys.modules[{blocked!r}] = None; "
            f"sys.argv = ['gpufleet', 'exporter', '--port', '0', *{args!r}]; "
            "from gpufleet.cli.main import main; main()")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=cli_env())  # fmt: skip
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
