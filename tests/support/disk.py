"""Faults on disk: a full file system."""

from __future__ import annotations

from pathlib import Path


def fill_disk(disk: Path) -> Path:
    """Write a file into ``disk`` until it is full (ENOSPC); returns the file."""
    filler = disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler
