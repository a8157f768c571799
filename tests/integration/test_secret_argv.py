"""The argv shim: a child gets the secret in its argv while its process list shows the
placeholder (issue 13: Triton's access token was readable by every local user through ps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.serve.secret_argv import SECRET_ENV, Shim, build_shim, secret_environment

SECRET = "s3cr3t-token-value"
# The child reports what it was given and what other users can read of it.
REPORT = """
import json, os, sys
cmdline = open("/proc/self/cmdline", "rb").read().decode()
environ = open("/proc/self/environ", "rb").read().decode(errors="replace")
print(json.dumps({"argv": sys.argv[1:], "cmdline": cmdline, "environ": environ,
                  "env": {k: v for k, v in os.environ.items()
                          if k.startswith("GPUFLEET_ARGV") or k == "LD_PRELOAD"}}))
"""


@pytest.fixture
def shim(tmp_path: Path) -> Shim:
    built = build_shim(tmp_path)
    if isinstance(built, str):
        pytest.skip(f"cannot build the shim here: {built}")
    return built


def child(shim: Shim, *args: str) -> dict[str, Any]:
    with secret_environment(shim, SECRET):
        done = subprocess.run(
            [sys.executable, "-c", REPORT, *args], capture_output=True, text=True, check=True
        )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_child_gets_the_secret_and_its_process_list_shows_the_placeholder(
    shim: Shim,
) -> None:
    seen = child(shim, f"model-repository:triton-access-token={shim.placeholder}", "plain")
    assert seen["argv"] == [f"model-repository:triton-access-token={SECRET}", "plain"]
    assert SECRET not in seen["cmdline"]
    assert shim.placeholder in seen["cmdline"]
    assert SECRET not in seen["environ"]  # the bytes it started with, zeroed
    assert seen["env"] == {}  # nothing left for the child's own children


def test_a_users_own_preload_is_kept_for_the_childs_children(
    shim: Shim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_PRELOAD", "libm.so.6")
    seen = child(shim, shim.placeholder)
    assert seen["argv"] == [SECRET]
    assert seen["env"] == {"LD_PRELOAD": "libm.so.6"}
    assert os.environ["LD_PRELOAD"] == "libm.so.6"


def test_the_parent_environment_is_put_back(shim: Shim) -> None:
    before = dict(os.environ)
    with secret_environment(shim, SECRET):
        assert os.environ[SECRET_ENV] == SECRET
    assert dict(os.environ) == before


def test_no_compiler_is_said_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build_shim(tmp_path) == "no C compiler (cc or gcc) on PATH"
    monkeypatch.setenv("CC", "/bin/false")
    assert build_shim(tmp_path) == "/bin/false failed: no output"
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    missing = build_shim(tmp_path)
    assert isinstance(missing, str) and missing.startswith(f"{tmp_path}/missing-cc: "), missing
