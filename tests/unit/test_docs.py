"""The documentation set (mkdocs.yml, `make docs`): it builds with no broken link or anchor;
a link to a repository file that does not exist fails the build (scripts/mkdocs_hooks.py);
the README stays a page a newcomer reads in minutes, its links resolve, and its tour's
commands are the getting-started pages' (which tests/integration/test_docs_local.py and
tests/cluster/test_docs_local_cluster.py run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from markdown_it import MarkdownIt

from tests.support.docpages import DOCS, Terminal, blocks, commands, groups
from tests.support.paths import REPO

README = REPO / "README.md"
README_LINES = 150  # "a README that a newcomer reads in five minutes" (issue 51)
# The keys of the chart's values schema that name a Secret (docs/security.md, "Sealed secrets").
SECRET_REFERENCES = ("existingSecret", "secretName", "secret", "tokenSecret")


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mkdocs", "build", "-f", str(config), "-d", str(site)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(REPO / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_documentation_set_builds_strict_with_every_page_in_its_nav(site: Path) -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["strict"] is True and config["validation"]["anchors"] == "warn"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    listed = set(re.findall(r"(\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M))
    assert pages == listed
    assert (site / "local-cluster" / "index.html").is_file()
    # a link out of docs/ points at the repository's file on the web
    page = (site / "local-cluster" / "index.html").read_text()
    assert f'href="{config["repo_url"]}/blob/main/examples/local-cluster/digits.yaml"' in page


def a_project(tmp: Path, page: str) -> Path:
    """A one-page project with the repository's mkdocs settings and hook, beside one file."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    config.update(nav=["index.md"], hooks=[str(REPO / "scripts" / "mkdocs_hooks.py")])
    (tmp / "docs").mkdir()
    (tmp / "docs" / "index.md").write_text(page)
    (tmp / "present.txt").write_text("here\n")
    (tmp / "mkdocs.yml").write_text(yaml.safe_dump(config))
    return tmp / "mkdocs.yml"


@pytest.mark.parametrize(("link", "says"), [
    ("[a](#nowhere)", "no such anchor"),
    ("[a](missing.md)", "not found among documentation files"),
    ("[a](../absent.txt)", "../absent.txt, which is not in the repository"),
])  # fmt: skip
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path, link: str, says: str) -> None:
    config = a_project(tmp_path, f"# Page\n\n## Here\n\n[ok](#here) [ok](../present.txt) {link}\n")
    done = build(config, tmp_path / "site")
    assert done.returncode == 1 and says in done.stderr, done.stderr


def test_a_link_to_a_repository_file_is_kept_working(tmp_path: Path) -> None:
    (tmp_path / "charts").mkdir()
    (tmp_path / "charts" / "a.svg").write_text("<svg/>")
    page = ("# Page\n\n[ok](../present.txt \"title\") [dir](../charts) ![chart](../charts/a.svg)"
            " [ref][r] `[code](../gone.txt)`\n\n```text\n[code](../gone.txt)\n```\n\n"
            "[r]: ../present.txt\n")  # fmt: skip
    done = build(a_project(tmp_path, page), tmp_path / "site")
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    web = "https://github.com/gpufleet/gpufleet"
    assert f'href="{web}/blob/main/present.txt" title="title"' in html  # a file: its page
    assert f'href="{web}/tree/main/charts"' in html  # a folder: its listing
    assert f'src="{web}/raw/main/charts/a.svg"' in html  # an image: its bytes
    assert html.count(f'href="{web}/blob/main/present.txt"') == 2  # the reference too
    assert html.count("../gone.txt") == 2  # code is left as written


def links(markdown: str) -> list[str]:
    tokens = MarkdownIt("commonmark").parse(markdown)
    inline = [c for t in tokens for c in (t.children or [])]
    return [str(c.attrs["href"]) for c in inline if c.type == "link_open"]


def test_the_readme_is_short_and_its_links_resolve(site: Path) -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES
    for href in links(text):
        if href.startswith("https://"):
            continue
        path, _, anchor = href.partition("#")
        assert (REPO / path).exists(), href
        if anchor:  # a page's anchor, as the built site names it
            built = site / Path(path).relative_to("docs").with_suffix("") / "index.html"
            assert f'id="{anchor}"' in built.read_text(), href


def test_the_readmes_tour_runs_the_getting_started_pages_commands() -> None:
    tokens = MarkdownIt("commonmark").parse(README.read_text())
    fences = [t.content for t in tokens if t.type == "fence" and t.info == "bash"]
    tour = [c for code in fences for c in commands(code)]
    run = {c for page in ("local.md", "local-cluster.md")
           for b in blocks(DOCS / page) for c in commands(b.code)}  # fmt: skip
    assert tour and {"make demo", "make test"} <= set(tour)
    assert not set(tour) - run - {"make demo", "make test"}


def test_the_getting_started_pages_have_their_groups_in_order() -> None:
    assert groups(DOCS / "local.md") == ["tour"]
    assert groups(DOCS / "local-cluster.md") == [
        "cluster",
        "platform",
        "sealed",
        "job",
        "cancel",
        "down",
    ]


def test_a_run_mark_must_precede_a_bash_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# P\n\n<!-- run: tour -->\n```text\nnot a command\n```\n")
    with pytest.raises(AssertionError, match=r"page\.md:3: a run mark must precede"):
        blocks(page)
    page.write_text("# P\n\n<!-- run: tour -->\n```bash\necho one\n```\n\n```bash\nnot run\n```\n")
    (only,) = blocks(page)
    assert only.group == "tour" and only.line == 5 and only.code == "echo one\n"
    page.write_text("# P\n\n<!-- run tour -->\n```bash\necho one\n```\n")
    with pytest.raises(AssertionError, match=r"page\.md:3: a run mark is <!-- run: GROUP -->"):
        blocks(page)


def test_a_group_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    page = tmp_path / "page.md"
    page.write_text(f"# P\n\n<!-- run: slow -->\n```bash\nsleep 300 &\necho $! > {pid_file}\n"
                    "wait\n```\n")  # fmt: skip
    with pytest.raises(subprocess.TimeoutExpired):
        Terminal(cwd=tmp_path).run(page, "slow", timeout=2)
    child = int(pid_file.read_text())
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_the_two_lines_for_your_own_image_are_the_ones_the_real_node_test_builds() -> None:
    """docs/images.md's Dockerfile is examples/own-image/Dockerfile's, which
    scripts/build-image.sh own builds and tests/cluster/test_realnodes_own_image.py runs: the
    page's RUN and USER lines are the file's (its ARG GPUFLEET in place of the package)."""
    (shown,) = [t.content for t in MarkdownIt("commonmark").parse((DOCS / "images.md").read_text())
                if t.type == "fence" and t.info.strip() == "dockerfile"]  # fmt: skip
    built = (REPO / "examples" / "own-image" / "Dockerfile").read_text()
    run = re.search(r"^RUN .*?^USER .*?$", built, re.S | re.M)
    assert run is not None
    lines = run.group(0).replace('"$GPUFLEET"', '"gpufleet[digits]"').splitlines()
    comment, source, *page = shown.splitlines()
    assert [line for line in lines if not line.startswith("#")] == page, page
    assert 'ARG GPUFLEET="gpufleet[digits]"' in built and comment.startswith("# ")
    base = re.search(r"^ARG BASE=(\S+)$", built, re.M)  # the page's FROM: the file's default
    assert base is not None and source == f"FROM {base.group(1)}", source


def table_rows(page: Path) -> list[list[str]]:
    """The cells of a page's first table, its header first, footnote marks left out."""
    rows = [ln for ln in page.read_text().splitlines() if ln.startswith("| ")]
    return [[re.sub("[¹²³⁴⁵⁶⁷⁸⁹⁰]", "", c).strip() for c in r.strip("|").split("|")] for r in rows]


def test_the_readmes_frameworks_table_is_the_frameworks_pages_and_the_renderers() -> None:
    """Every cell of the table (README and docs/frameworks.md alike): "refused" exactly where
    gpufleet.render refuses the framework's job on that target."""
    from gpufleet.render import FRAMEWORK_TARGETS

    readme, page = table_rows(README), table_rows(DOCS / "frameworks.md")
    assert readme == page
    header, rows = readme[0], readme[2:]
    names = {"PyTorch": "pytorch", "TensorFlow": "tensorflow", "Ray": "ray", "Horovod": "horovod"}
    assert sorted(names[r[0]] for r in rows) == sorted(FRAMEWORK_TARGETS)
    for row in rows:
        targets = FRAMEWORK_TARGETS[names[row[0]]]
        assert row[1].startswith("runs"), row  # every framework runs on this machine
        for target, cell in zip(header[2:], row[2:], strict=True):
            assert (cell == "refused") == (target not in targets), (row[0], target, cell)


def test_the_security_pages_table_names_every_secret_the_charts_values_refer_to() -> None:
    """docs/security.md, "Sealed secrets": each Secret reference of the chart's values schema
    (existingSecret, secretName, secret, tokenSecret), by its value path, and nothing else."""
    schema = json.loads((REPO / "deploy" / "helm" / "gpufleet" / "values.schema.json").read_text())
    found: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if key in SECRET_REFERENCES:
                found.append(f"{path}{key}")
            walk(sub, f"{path}{key}.")
        if "items" in node:
            walk(node["items"], f"{path[:-1]}[].")

    walk(schema, "")
    section = (DOCS / "security.md").read_text().split("### Sealed secrets", 1)[1]
    table = re.findall(r"^\| `([^`]+)` \|", section.split("\n#", 1)[0], re.M)
    assert len(found) >= 9 and sorted(table) == sorted(found), (table, found)
