"""MkDocs hook (mkdocs.yml's `hooks`): a page's links to the repository's files outside docs/
(`../benchmarks/results/...`, `../deploy/...`), which MkDocs cannot resolve, point at the
repository on the web (mkdocs.yml's repo_url and edit_uri's branch); a link to a path that does
not exist is a warning, which the strict build (`make docs`) turns into a failure. MkDocs has
no setting for this: its link validation only knows the pages' own files."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.gpufleet")
# Code (fenced blocks, then inline spans) is matched first and left as written; then the
# relative links that leave docs/ (the others are MkDocs'): inline `[text](../path#a "title")`,
# images `![alt](../path)` and reference definitions `[id]: ../path`.
LINKS = re.compile(
    r"(?P<code>^[ \t]*(?P<fence>```|~~~).*?^[ \t]*(?P=fence)|`[^`\n]*`)"
    r"|(?P<bang>!?)(?P<open>\[[^\[\]]*\]\(|^\[[^\]\n]+\]:[ \t]*)"
    r"(?P<path>\.\./[^)\s#]+)(?P<anchor>#[^)\s]*)?",
    re.DOTALL | re.MULTILINE,
)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    here = (docs / page.file.src_path).parent
    # edit_uri is "blob/<branch>/docs/": files are under "blob/<branch>/", folders under
    # "tree/<branch>/", and an image's bytes under "raw/<branch>/" (a blob page is HTML).
    branch = config["edit_uri"].removeprefix("blob/").removesuffix("docs/")
    web = config["repo_url"].rstrip("/")

    def point(match: re.Match[str]) -> str:
        if match.group("code"):
            return match.group(0)
        target = (here / match.group("path")).resolve()
        if target.is_relative_to(docs):
            return match.group(0)
        if not target.is_relative_to(repo) or not target.exists():
            log.warning("%s links to %s, which is not in the repository",
                        page.file.src_path, match.group("path"))  # fmt: skip
            return match.group(0)
        kind = "tree" if target.is_dir() else "raw" if match.group("bang") else "blob"
        url = f"{web}/{kind}/{branch}{target.relative_to(repo).as_posix()}"
        return f"{match.group('bang')}{match.group('open')}{url}{match.group('anchor') or ''}"

    return LINKS.sub(point, markdown)
