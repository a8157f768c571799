"""The image's locks (docker/image.lock, docker/torch.lock: scripts/lock-image.sh), read."""

from __future__ import annotations

import re

from tests.support.paths import REPO

DOCKER = REPO / "docker"


def normalized(name: str) -> str:
    """A Python package's name as PyPI compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(name: str = "image.lock") -> dict[str, str]:
    """A lock's packages (normalized) and versions; each must carry at least one sha256."""
    text = (DOCKER / name).read_text()
    found = {}
    for entry in re.split(r"\n(?=\S)", text.strip()):
        head = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", entry)
        assert head and re.search(r"--hash=sha256:[0-9a-f]{64}", entry), entry[:200]
        found[normalized(head.group(1))] = head.group(2)
    return found
