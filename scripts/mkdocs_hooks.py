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
# [text](../path#anchor): the relative links that leave docs/ (the others are MkDocs').
OUTSIDE = re.compile(r"(\]\()(\.\./[^)\s#]+)(#[^)\s]*)?(\))")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    here = (docs / page.file.src_path).parent
    # edit_uri is "blob/<branch>/docs/": the repository's files are under "blob/<branch>/"
    base = f"{config['repo_url'].rstrip('/')}/{config['edit_uri'].removesuffix('docs/')}"

    def point(match: re.Match[str]) -> str:
        target = (here / match.group(2)).resolve()
        if target.is_relative_to(docs):
            return match.group(0)
        if not target.is_relative_to(repo) or not target.exists():
            log.warning("%s links to %s, which is not in the repository",
                        page.file.src_path, match.group(2))  # fmt: skip
            return match.group(0)
        url = base + target.relative_to(repo).as_posix() + (match.group(3) or "")
        return f"{match.group(1)}{url}{match.group(4)}"

    return OUTSIDE.sub(point, markdown)
