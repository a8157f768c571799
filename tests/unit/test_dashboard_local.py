"""`gpufleet dashboard` over local runs, in process (Starlette's TestClient): the runs page, a
run's page with its curves as SVG points, launches, checkpoints with their integrity and rank
0's log; the refresh's partial page; a missing run; the security headers."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpufleet.dashboard.app import create_app
from gpufleet.dashboard.curves import Curves
from tests.support.runs import restarted_run, step_lines


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    restarted_run(tmp_path)
    return TestClient(create_app(tmp_path), base_url="http://127.0.0.1:8465")


def test_the_runs_page_lists_each_run(client: TestClient) -> None:
    assert client.get("/", follow_redirects=False).headers["location"] == "/runs"
    page = client.get("/runs")
    assert page.status_code == 200
    assert 'data-name="digits"' in page.text and "Succeeded" in page.text and "100/100" in page.text
    assert "60m ago" in page.text


def test_a_runs_page_has_its_curves_checkpoints_and_log(client: TestClient) -> None:
    page = client.get("/runs/digits")
    assert page.status_code == 200
    loss = page.text[page.text.index('<g id="loss-points"') :]
    assert loss[: loss.index("</g>")].count("<use ") == 5  # steps 20 to 100: a point each
    assert ">step</text>" in page.text  # the axes' labels are text
    assert "Restarts went back to steps 40" in page.text
    rows = page.text[page.text.index('id="checkpoints"') :]
    assert rows.index("status-OK") < rows.index("status-CORRUPT") < rows.rindex("status-OK")
    log = page.text[page.text.index('id="log"') :]
    assert "step 100/100 loss 0.0100" in log and "resumed from step 40" in log


def test_the_refresh_gets_the_main_part_only(client: TestClient) -> None:
    part = client.get("/runs/digits?part=main")
    assert part.status_code == 200 and "<html" not in part.text and "Run digits" in part.text


def test_a_missing_run_is_404_and_headers_keep_the_page_to_itself(client: TestClient) -> None:
    missing = client.get("/runs/nope")
    assert missing.status_code == 404 and "no local run &#39;nope&#39;" in missing.text
    csp = client.get("/runs").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert client.get("/static/dashboard.js").status_code == 200
    # a page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets nothing
    rebound = client.get("/runs", headers={"host": "attacker.example:8465"})
    assert rebound.status_code == 400 and "digits" not in rebound.text


def test_curves_keep_the_latest_attempts_value_of_a_step() -> None:
    curves = (
        Curves().add(step_lines(10, 20).splitlines()).add(["x step 20/100 loss 9.0 5 samples/s"])
    )
    assert curves.points("loss") == [(10, 0.1), (20, 9.0)] and curves.restarts == [20]
    assert curves.points("throughput") == [(10, 1010.0), (20, 5.0)] and curves.steps == 100


def test_the_dashboard_command_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    port = CliRunner().invoke(app, ["dashboard", "--local", "--port", "70000"], env=env)
    assert port.exit_code == 2 and "--port" in port.stderr and "Traceback" not in port.output
    history = CliRunner().invoke(app, ["dashboard", "--local", "--history", "nosuch://x"], env=env)
    assert history.exit_code == 2 and "--history: nosuch://x: cannot be read" in history.stderr
    asked = CliRunner().invoke(app, ["dashboard", "-n", "team-a"], env=env)  # no kubeconfig
    assert asked.exit_code == 2 and "KUBECONFIG" in asked.stderr
