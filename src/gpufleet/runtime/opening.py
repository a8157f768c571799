"""Opening sealed durable checkpoints for a resume, on every node (gpufleet.runtime.sealed does
one copy; this is the Checkpointer's side of it: which ranks open, what their errors become,
and that no plaintext outlives a failure).

Rank 0 opens the copy it chooses on its own node while choosing (``open``, choose.Opener);
then every other node's first rank opens its own (``open_on_every_node``), so that each node
reads a copy on its own disk; after the load each node removes its copy (``remove``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import CheckpointError, CheckpointKeyError, CheckpointStorageError
from gpufleet.runtime import integrity, sealed
from gpufleet.runtime.checkpoint_io import storage_error
from gpufleet.runtime.distributed import broadcast_from_main, gather_to_main
from gpufleet.runtime.tier import CheckpointRef, Tier


@dataclass
class SealedCopies:
    """The sealed copies this process's node opens under the fast tier ``root``."""

    root: str  # the fast tier's (a local path whenever there is a durable tier)
    node: str
    key_file: str | None  # the job's key (None: it has none)
    rank: int
    local_rank: int
    group: Any  # the Checkpointer's gloo group (None: not distributed)

    def path(self, ref: CheckpointRef) -> str:
        """Where this node reads the opened ``ref``."""
        return str(sealed.opened_dir(self.root, self.node, ref.path))

    def remove(self) -> None:
        sealed.remove_opened(self.root, self.node)

    def open(
        self, tier: Tier, ref: CheckpointRef, marker: dict[str, Any]
    ) -> list[integrity.Mismatch]:
        """Open the sealed ``ref`` on this node (choose.Opener): what does not verify. A job
        with a key refuses a plaintext durable copy; an open that fails leaves nothing."""
        if sealed.sealed_files(marker) is None:
            return sealed.refused_plaintext() if self.key_file else []
        self.remove()  # an earlier open's, never loaded
        into, path = sealed.opened_dir(self.root, self.node, ref.path), tier.fs_path(ref.path)
        try:
            key = sealed.read_key(self.key_file)
            return sealed.open_checkpoint(tier.fs, path, marker, key, into, tier.url(path))
        except OSError as exc:  # the fast tier full (fatal), the store unreachable (a retry)
            kind = CheckpointStorageError if storage_error(exc) else CheckpointError
            raise kind(f"cannot open {tier.url(path)} into {into}: {exc}") from None

    def open_on_every_node(self, ref: CheckpointRef, durable: Tier) -> None:
        """Each other node's first rank opens the sealed ``ref`` too. Collective: every rank
        raises the first error any node met (a key error stays one), and every node's copy is
        removed then."""
        error: tuple[bool, str] | None = None  # (a key error, what it says)
        if self.local_rank == 0 and self.rank != 0:
            try:
                marker = integrity.read_marker(durable.fs, durable.fs_path(ref.path))
                problems = "; ".join(map(str, self.open(durable, ref, marker)))
                error = (False, problems) if problems else None
            except Exception as exc:  # every rank must hear it, or the others wait forever
                error = (isinstance(exc, CheckpointKeyError), str(exc))
        errors = [e for e in gather_to_main(error, self.group) if e]
        verdict = broadcast_from_main(errors[0] if errors else None, self.group)
        if verdict:
            if self.local_rank == 0:
                self.remove()
            kind = CheckpointKeyError if verdict[0] else CheckpointError
            raise kind(f"a node could not open the durable checkpoint of step {ref.step} "
                       f"({ref.path}): {verdict[1]}")  # fmt: skip
