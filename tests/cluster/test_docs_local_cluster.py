"""docs/local-cluster.md run as a reader runs it, from the page (tests/support/docpages.py): the
session's real-node cluster is the page's own (its group "cluster", tests/support/realnodes.py)
with the chart installed by its group "platform" (the fixture ``reallab``); here its group "job"
submits the digits job, waits for it and reads its status and logs in that shell, and its group
"cancel" deletes it; the fixture runs "down" after the package's last test. Beyond the
commands' exit codes: the job ran on both real nodes, in pods that carry spec.nodeLossTimeout,
wrote its checkpoints on the claim as UID 1000, and its logs end with the local run's weights
(this was test_realnodes_training's jobset 2x1 case, merged here). Once it is cancelled, the
dashboard's history shows its page from what it kept on the claim (issue 53)."""

from __future__ import annotations

import re

import pytest

from tests.support.browser import chromium, dashboard, needs_browser, screenshot
from tests.support.devcluster import DevCluster
from tests.support.docpages import by_block, failed
from tests.support.procs import poll_until
from tests.support.realnodes import DIGEST, LOCAL_CLUSTER_PAGE, TENANT
from tests.support.references import local_digest

pytestmark = [pytest.mark.slow, pytest.mark.controlplane, pytest.mark.realnodes,
              pytest.mark.timeout(900)]  # fmt: skip
NAME = "digits"  # examples/local-cluster/digits.yaml


def test_the_local_cluster_page_runs_a_job_on_the_real_nodes(reallab: DevCluster) -> None:
    assert reallab.terminal is not None
    done = reallab.terminal.run(LOCAL_CLUSTER_PAGE, "job", timeout=720)
    assert done.returncode == 0, failed(done)
    assert len(by_block(done.stderr, LOCAL_CLUSTER_PAGE)) == 1
    assert re.search(rf"^{NAME} \(JobSet\): Succeeded", done.stdout, re.M), done.stdout
    assert re.search(rf"^{NAME} +jobset +{TENANT} +Succeeded ", done.stdout, re.M)  # jobs
    pods = reallab.pods(TENANT, NAME)
    placed = {p["spec"]["nodeName"] for p in pods}
    assert len(placed) == 2 and all(n.startswith("real-") for n in placed), placed
    assert all(f" on {node}: Succeeded" in done.stdout for node in placed), done.stdout  # --pods
    lost = [{t.get("tolerationSeconds") for t in p["spec"]["tolerations"] if t.get("key") in
             ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")}
            for p in pods]  # fmt: skip
    assert all(seconds == {30} for seconds in lost), lost
    assert DIGEST.findall(done.stdout) == [local_digest(reallab.root, 2, 1)]
    written = list((reallab.dir / "volumes").glob(f"pv-*/{NAME}/*"))
    assert written, "no checkpoint on the shared volume"
    assert all(p.stat().st_uid == 1000 for p in written), [(p, p.stat().st_uid) for p in written]

    cancel = reallab.terminal.run(LOCAL_CLUSTER_PAGE, "cancel", timeout=120)
    assert cancel.returncode == 0, failed(cancel)
    poll_until(lambda: not reallab.pods(TENANT, NAME), what=f"{NAME}'s pods gone", timeout=60)


@needs_browser
def test_a_cancelled_jobs_page_stays_in_the_dashboards_history(reallab: DevCluster) -> None:
    """The job above is cancelled, its objects gone: the dashboard's history shows its page
    from what it kept on the claim (its checkpoints, rank 0's kept log lines, its pods)."""
    (kept,) = {p.parent for p in (reallab.dir / "volumes").glob(f"pv-*/{NAME}/step_*")}
    assert not reallab.pods(TENANT, NAME)
    with chromium() as browser, dashboard("--local", "--history", str(kept),
                                          cwd=reallab.root) as url:  # fmt: skip
        page = browser.new_page()
        page.goto(f"{url}/history")
        page.click(f'#history tr a[href*="{NAME}"]')
        page.wait_for_url(re.compile(r"/history/job\?at="))  # its value holds slashes
        assert page.locator("g#loss-points use").count() >= 2  # rank 0's kept step lines
        integrity = page.locator("#checkpoints tbody td:nth-child(2)").all_inner_texts()
        assert integrity and set(integrity) == {"OK"}, integrity
        assert page.locator("#pods tbody tr").count() >= 2  # a launcher on each node, at least
        screenshot(page, "history")
