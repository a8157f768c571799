"""`gpufleet dashboard` as a person uses it (issue 53, item 5): started from the CLI, driven in
Debian's headless Chromium through Playwright. Local runs here; what is asserted is what the
browser displays: the run's state, a curve with its points, the checkpoints' integrity, the
log, and the page updating itself when a run appears. Each page's screenshot is kept
(tests/support/browser.ARTIFACTS)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import chromium, dashboard, needs_browser, screenshot
from tests.support.runs import restarted_run, run_dir

pytestmark = [pytest.mark.slow, needs_browser]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as started:
        yield started


def test_the_local_pages_show_a_run_and_update_themselves(browser: Any, workdir: Path) -> None:
    runs = workdir / "runs"
    restarted_run(runs)
    with dashboard("--local", "--run-root", str(runs), "--refresh", "0.5", cwd=workdir) as url:
        page = browser.new_page()
        page.goto(url)  # redirected to the local runs
        row = page.locator('#runs tr[data-name="digits"]')
        assert row.locator("td").nth(1).inner_text() == "Succeeded"
        assert row.locator("td").nth(2).inner_text() == "100/100"
        screenshot(page, "runs")
        run_dir(runs, "second", launches=[{"started": 1.0, "status": "Failed", "restarts": 3}])
        page.locator('#runs tr[data-name="second"]').wait_for(timeout=10_000)  # no reload
        assert page.evaluate("document.querySelector('main').dataset.updated") is not None

        page.goto(f"{url}/runs/digits")
        assert page.locator("#summary").inner_text().startswith("Succeeded, step 100/100")
        assert page.locator("g#loss-points use").count() == 5  # steps 20 to 100
        assert page.locator("g#throughput-points use").count() == 5
        integrity = page.locator("#checkpoints tbody tr td:nth-child(3)").all_inner_texts()
        assert integrity == ["OK", "CORRUPT", "OK"]
        assert "step 100/100 loss 0.0100" in page.locator("#log").inner_text()
        screenshot(page, "run")
        page.goto(f"{url}/runs/nope")
        assert "no local run 'nope'" in page.locator("#missing").inner_text()
