"""Finding workers' log files under a run directory (torchelastic's layout)."""

from __future__ import annotations

from pathlib import Path


def rank_log_files(node_log_dir: Path, local_rank: int) -> list[Path]:
    """stderr then stdout log of ``local_rank`` in the node's newest attempt, if any.

    torchelastic writes ``<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/{stdout,stderr}.log``;
    gpufleet gives each node its own ``log_dir`` (``<run dir>/logs/node<i>``).
    """
    attempts = sorted(
        node_log_dir.glob(f"*/attempt_*/{local_rank}"),
        key=lambda p: (p.stat().st_mtime, int(p.parent.name.removeprefix("attempt_"))),
    )
    if not attempts:
        return []
    newest = attempts[-1]
    return [f for f in (newest / "stderr.log", newest / "stdout.log") if f.exists()]


def last_lines_of_rank(
    node_log_dir: Path, local_rank: int, n: int = 20
) -> tuple[str, list[str]] | None:
    """(path, last ``n`` non-empty lines) of the rank's newest stderr log (stdout if empty)."""
    for path in rank_log_files(node_log_dir, local_rank):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        if lines:
            return str(path), lines[-n:]
    return None
