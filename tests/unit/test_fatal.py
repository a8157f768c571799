"""The first fatal error of a run, recorded once (gpufleet.launch.fatal): what the launcher
reports and exits with, and what stops torchelastic's restarts."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpufleet.launch.fatal import FATAL_FILE, no_restart_after_fatal, read_fatal, write_fatal


def test_the_first_fatal_error_is_recorded_whole_and_kept(tmp_path: Path) -> None:
    assert write_fatal(tmp_path, 4, "every checkpoint is corrupt", 1) is True
    path = tmp_path / FATAL_FILE
    assert json.loads(path.read_text()) == {
        "exit_code": 4, "message": "every checkpoint is corrupt", "rank": 1,
    }  # fmt: skip
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    # Another rank's error, later: refused, the first one stays as it was.
    assert write_fatal(tmp_path, 2, "another", 0) is False
    assert read_fatal(tmp_path) == {"exit_code": 4, "message": "every checkpoint is corrupt",
                                    "rank": 1}  # fmt: skip


def test_a_fatal_error_without_a_rank_is_recorded_with_none(tmp_path: Path) -> None:
    assert write_fatal(tmp_path, 6, "disk full", None)
    assert read_fatal(tmp_path) == {"exit_code": 6, "message": "disk full", "rank": None}


@pytest.mark.parametrize(
    "content",
    [
        '{"exit_code": 4, "mess',  # half-written
        '["exit_code", 4]',  # not an object
        '{"message": "no code"}',
        '{"exit_code": "4", "message": "a string code"}',
        "",
    ],
)
def test_a_fatal_file_without_an_integer_code_counts_as_none(tmp_path: Path, content: str) -> None:
    (tmp_path / FATAL_FILE).write_text(content)
    assert read_fatal(tmp_path) is None


def test_no_fatal_file_reads_as_none(tmp_path: Path) -> None:
    assert read_fatal(tmp_path) is None
    assert read_fatal(tmp_path / "missing-dir") is None


def test_the_launchers_agent_is_swapped_only_while_active(tmp_path: Path) -> None:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    assert launcher_api.LocalElasticAgent is LocalElasticAgent
    with no_restart_after_fatal(tmp_path):
        swapped = launcher_api.LocalElasticAgent
        assert swapped is not LocalElasticAgent and issubclass(swapped, LocalElasticAgent)
    assert launcher_api.LocalElasticAgent is LocalElasticAgent
