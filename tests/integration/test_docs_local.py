"""docs/local.md, getting started on this machine, run as a reader runs it: every runnable block
of the page, from the page, in order, in one shell from the repository's root
(tests/support/docpages.py). A changed flag or a broken step fails here; so does a page whose
runs stop agreeing with what it says: the resumed run, and the same job on two "nodes" of one
process each, end with the weights of the first run (the two-node check was
test_local_run.py's test_two_local_nodes_match_one_node_of_two, merged here)."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.docpages import DOCS, Terminal, blocks, by_block, failed
from tests.support.paths import REPO

PAGE = DOCS / "local.md"
DIGEST = re.compile(r"\[rank0\]: gpufleet: (\d+) steps; state digest ([0-9a-f]{64})")

# Six digits runs and a torchrun script: 30 s here alone, 60 s beside the cluster tests.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def block_line(text: str) -> int:
    """The first line of the page's one runnable block that holds ``text``."""
    (line,) = [b.line for b in blocks(PAGE) if text in b.code]
    return line


def test_getting_started_on_this_machine_runs_as_written() -> None:
    script_result = REPO / ".gpufleet" / "torchrun_script_result.json"
    script_result.unlink(missing_ok=True)
    done = Terminal().run(PAGE, "tour", timeout=540)
    assert done.returncode == 0, failed(done)
    wrote = by_block(done.stderr, PAGE)
    assert sorted(wrote) == [b.line for b in blocks(PAGE)]  # every block ran
    summary = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("{")))
    assert summary["status"] == "Succeeded" and summary["steps"] == 300
    first = ("300", summary["state_digest"])
    again = DIGEST.findall(wrote[block_line("gpufleet run examples/digits.yaml\n")])
    assert again == [first]
    assert "resumed from step 300" in wrote[block_line("gpufleet run examples/digits.yaml\n")]
    two_nodes = DIGEST.findall(wrote[block_line("--set spec.nodes=2")])
    assert two_nodes == [first], "two nodes of one process trained other weights than one of two"
    assert re.search(r"^ *300 +OK ", done.stdout, re.M) and "CORRUPT" not in done.stdout
    assert re.search(r"^digits +Succeeded +300/300 ", done.stdout, re.M)  # gpufleet jobs
    script = json.loads(script_result.read_text())
    assert script["world"] == 2 and script["env"]["WORLD_SIZE"] == "2"
    assert "kind: JobSet" in done.stdout
