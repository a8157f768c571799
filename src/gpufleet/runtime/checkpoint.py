"""Checkpoints with torch.distributed.checkpoint: one new directory per step, committed atomically.

Layout under the checkpoint root (a local directory or an fsspec URI such as ``s3://b/p``)::

    step_000000050-3f9a1c/      # DCP files (.metadata, __0_0.distcp, ...)
        COMPLETE.json           # the completion marker, written last, by rank 0
    step_000000100-a71e02/

A directory without ``COMPLETE.json`` is torn (its writer died) and is never loaded. Every save
goes to a directory name no earlier attempt used (a fresh random suffix), so a retry never writes
into a torn directory and never overwrites a complete one.

The marker records a SHA-256 of every file (gpufleet.runtime.integrity). Before a resume, rank 0
verifies the newest complete checkpoint in full; a mismatch or a missing file sets it aside
(renamed ``<dir>.corrupt``, never deleted) with a warning naming the file, and the next older one
is tried, so the resumed run still ends with an uninterrupted run's weights. Rank 0 checks every
file rather than each rank its own: the choice of checkpoint must be one decision for all ranks
(a rank that alone saw a bad shard would need a second agreement round), and a rank cannot know
which files it will read before DCP plans the load (at another world size it reads pieces of
other ranks' files). A resume is rare; one extra read of the checkpoint is its price.

Tiers: the loop saves to the fast tier (``root``) only. When the job has a durable tier too
(``durable``, filled by the node's uploader, gpufleet.runtime.durable), a resume takes the newest
step that verifies on either, the fast copy first: a lost node (its fast tier gone) or a corrupt
fast copy resumes from the durable one. A sealed (encrypted) copy is opened on each node first.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from gpufleet import torchapi
from gpufleet.errors import CheckpointError, CheckpointStorageError
from gpufleet.runtime import checkpoint_io, choose, faults, integrity
from gpufleet.runtime.checkpoint_io import model_fingerprint as model_fingerprint
from gpufleet.runtime.checkpoint_io import storage_error
from gpufleet.runtime.context import CHECKPOINT_DEFAULTS, node_id
from gpufleet.runtime.distributed import broadcast_from_main, gather_to_main
from gpufleet.runtime.integrity import MARKER
from gpufleet.runtime.opening import SealedCopies
from gpufleet.runtime.tier import DURABLE, FAST, Tier, is_local
from gpufleet.runtime.tier import CheckpointRef as CheckpointRef


@dataclass
class _Pending:
    future: Future[Any]  # the commit: DCP's upload, then the checksums and the marker
    path: str
    step: int
    started: float


class Checkpointer:
    """Saves and loads job state with DCP. Every rank constructs it at the same point (collective).

    ``async_save=True`` stages the state to CPU memory and writes it in background threads over
    a dedicated gloo group; ``save`` returns at once. Call ``wait_staged()`` before mutating the
    state (the copy may still run) and ``poll()`` at step boundaries to commit finished saves.

    It owns the save cadence (``every_steps``): ``should_save`` says which steps to save.
    """

    def __init__(
        self,
        root: str,
        *,
        keep: int = CHECKPOINT_DEFAULTS.keep,
        async_save: bool = CHECKPOINT_DEFAULTS.async_save,
        every_steps: int = CHECKPOINT_DEFAULTS.every_steps,
        log: Callable[[str], None] | None = None,
        identity: dict[str, str] | None = None,
        durable: str | None = None,
        key_file: str | None = None,
    ) -> None:
        # Who writes here: {"job": name, "workload": what it trains, "model": fingerprint}.
        # Recorded in every marker; a checkpoint of another job or model is never loaded, and
        # retention deletes only this job's checkpoints.
        self.identity = identity or {}
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.fast = Tier(root, name=FAST, identity=self.identity, log=self._log)
        # The durable tier is only read here (a resume); the node's uploader writes it.
        self.durable = (
            Tier(durable, name=DURABLE, identity=self.identity, log=self._log) if durable else None
        )
        self.root = self.fast.root
        self.keep = keep
        self.async_save = async_save
        self.every_steps = every_steps
        self._distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if self._distributed else 0
        world = dist.get_world_size() if self._distributed else 1
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world)) if self._distributed else 1
        self._nodes = max(1, world // max(1, local))  # torchrun's nodes (agents)
        self._local_rank = int(os.environ.get("LOCAL_RANK", 0)) if self._distributed else 0
        self._node = node_id()  # whose disk this process's fast tier is, in the marker
        self._purges_own = self._rank == 0  # a node whose fast tier only its ranks see purges
        # DCP's planning collectives get their own gloo group: an async save runs them in a
        # background thread, and collectives on one group must be issued in the same order on
        # every rank, which a thread racing the training loop cannot promise.
        self._pg = dist.new_group(backend="gloo") if self._distributed else None
        # Sealed durable copies, opened for a resume with the job's key (key_file)
        self._sealed = SealedCopies(self.root, self._node, key_file, self._rank,
                                    self._local_rank, self._pg)  # fmt: skip
        self._pending: _Pending | None = None
        self._staging: Future[None] | None = None
        self._default_stager: Any | None = None  # DCP's DefaultStager (torch 2.9+)
        # Commits of async saves (waiting for the upload, hashing every file, writing the
        # marker) run here, off the training thread.
        self._committer: ThreadPoolExecutor | None = None
        # Seconds the caller spent blocked on each step's checkpoint: the save call, the
        # staging fence and any wait for the upload. Benchmarks read it.
        self.blocking: dict[int, float] = {}
        # Called as on_commit(step, save_seconds, blocking_seconds) once a save is committed
        # (the Trainer feeds job metrics from it).
        self.on_commit: Callable[[int, float, float], None] | None = None
        if self._rank == 0:
            self.fast.makedirs()

    def should_save(self, step: int, *, final: bool = False, preempted: bool = False) -> bool:
        """Whether to checkpoint after ``step``: every ``every_steps`` steps, the last step
        (``final``) and the step all ranks agreed to stop at (``preempted``)."""
        return preempted or final or step % self.every_steps == 0

    # ---- listing -------------------------------------------------------------------------
    def list_dirs(self) -> list[tuple[int, str, bool]]:
        """Every step directory of the fast tier as (step, path, complete), oldest first."""
        return self.fast.list_dirs()

    def complete(self) -> list[CheckpointRef]:
        """Complete checkpoints of the fast tier, oldest first."""
        return self.fast.complete()

    def latest(self) -> CheckpointRef | None:
        """The newest complete checkpoint whose files all match their checksums, agreed by all
        ranks (rank 0 decides). Corrupt ones on the way are set aside with a warning. Raises
        NoUsableCheckpointError when checkpoints exist but none is usable: starting over from step 0
        is what ``--fresh`` does, never a silent fallback."""
        self.wait()  # its commit's collectives first, on the same group
        incomplete = self._incomplete_on_some_node() if self._nodes > 1 else frozenset()
        found: CheckpointRef | CheckpointError | None = None
        if self._rank == 0:
            try:
                found = choose.newest_usable(
                    self.fast, self.durable, self.identity, self._log, incomplete, self._sealed.open
                )
            except Exception as exc:  # every rank raises rank 0's verdict, or waits forever
                found = exc if isinstance(exc, CheckpointError) else CheckpointError(
                    f"choosing a checkpoint to resume from failed: {exc!r}")  # fmt: skip
        decided: CheckpointRef | CheckpointError | None = broadcast_from_main(found, self._pg)
        if isinstance(decided, CheckpointError):
            raise decided
        if decided is not None and decided.sealed and self.durable is not None:
            self._sealed.open_on_every_node(decided, self.durable)
        return decided

    def _incomplete_on_some_node(self) -> frozenset[str]:
        """The fast checkpoints some rank's view lacks a file of (every rank looks: a node's
        own disk holds only its ranks' files). Collective."""
        wanted = broadcast_from_main(
            choose.wanted(self.fast) if self._rank == 0 else None, self._pg
        )
        lacking = gather_to_main(choose.lacking(self.fast, wanted), self._pg)
        return frozenset().union(*lacking) if lacking else frozenset()

    # ---- saving --------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any], *, force_sync: bool = False) -> str:
        """Checkpoint ``state`` for ``step`` into a new directory; returns its path.

        Sync saves are committed when this returns. Async saves are committed by a later
        ``poll()`` or ``wait()``; at most one is in flight (a new save waits for the previous).
        """
        self.wait()
        # The name alone: every rank writes under its own root (the same place, or on a node's
        # own disk, the same path there).
        name: str = broadcast_from_main(self._new_dir(step) if self._rank == 0 else None, self._pg)
        path = self.fast.join(self.fast.root_path, name)
        started = time.perf_counter()
        writer = self._writer(path)
        if self.async_save and not force_sync:
            self._staging, upload = torchapi.async_save(state, writer, self._pg, self._stager())
            if self._committer is None:
                self._committer = ThreadPoolExecutor(1, thread_name_prefix="gpufleet-commit")
            commit = self._committer.submit(self._finish, upload, path, step, started)
            self._pending = _Pending(commit, path, step, started)
            self._blocked(step, time.perf_counter() - started)
        else:
            try:
                dcp_save(state, storage_writer=writer, process_group=self._pg)
                faults.maybe_fire("checkpoint_written", step)
                self._commit(path, step, started)
            except BaseException as exc:
                self._storage_failure(exc, path, step)
                raise
            self._blocked(step, time.perf_counter() - started)
            self._committed(step, started)
        return self.fast.url(path)

    def _finish(self, upload: Future[Any], path: str, step: int, started: float) -> None:
        """An async save's end, in the committer thread: the upload, then the commit."""
        upload.result()
        faults.maybe_fire("checkpoint_written", step)
        self._commit(path, step, started)

    def _storage_failure(self, exc: BaseException, path: str, step: int) -> None:
        """Raise CheckpointStorageError when ``exc`` is the storage refusing the save: the
        torn directory is removed (rank 0) and the message says where, why and how much
        space is left. Anything else returns (the caller re-raises it)."""
        error = storage_error(exc)
        if error is None:
            return
        if self._rank == 0:  # on failure retention removes it later (torn, older)
            self.fast.remove(path)
        try:  # every rank says the same: the first one to record the error is reported
            newest = [r.step for r in self.complete()]
        except OSError:
            newest = []
        raise CheckpointStorageError(
            checkpoint_io.storage_failure(step, self.root, error, newest, local=self.fast.local)
        ) from None

    def _committed(self, step: int, started: float) -> None:
        if self.on_commit is not None:
            self.on_commit(step, time.perf_counter() - started, self.blocking.get(step, 0.0))

    def _blocked(self, step: int, seconds: float) -> None:
        self.blocking[step] = self.blocking.get(step, 0.0) + seconds

    def _new_dir(self, step: int) -> str:
        # Checked before the name is shared: once it is, other ranks start writing into it.
        for _ in range(8):
            name = f"step_{step:09d}-{secrets.token_hex(3)}"
            if not self.fast.fs.exists(self.fast.join(self.fast.root_path, name)):
                return name
        raise CheckpointError(f"no unused checkpoint directory name for step {step} in {self.root}")

    def _stager(self) -> Any | None:
        # One stager for the Checkpointer's life: it keeps its CPU staging buffers (1x the
        # state) and reuses them, so a save copies into warm memory instead of faulting in
        # fresh pages every time.
        if self._default_stager is None:
            self._default_stager = torchapi.new_stager(cuda=torch.cuda.is_available())
        return self._default_stager

    def wait_staged(self) -> None:
        """Block until an in-flight async save has copied the state; call before mutating it
        (the Trainer calls it just before ``optimizer.step()``)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            started = time.perf_counter()
            staging.result()
            if self._pending is not None:
                self._blocked(self._pending.step, time.perf_counter() - started)

    def close(self) -> None:
        """Finish any in-flight save and free the staging buffers."""
        self.wait()
        if self._default_stager is not None:
            self._default_stager.close()
            self._default_stager = None
        if self._committer is not None:
            self._committer.shutdown()
            self._committer = None

    def poll(self) -> None:
        """Commit a finished async save, if any; raises if it failed. Cheap: call every step."""
        if self._pending is not None and self._pending.future.done():
            self.wait()

    def wait(self) -> None:
        """Block until an in-flight async save is written and committed."""
        self.wait_staged()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        started = time.perf_counter()
        try:
            pending.future.result()
        except BaseException as exc:
            self._storage_failure(exc, pending.path, pending.step)
            raise
        self._blocked(pending.step, time.perf_counter() - started)
        self._committed(pending.step, pending.started)

    def _commit(self, path: str, step: int, started: float) -> None:
        """Every rank hashes the files it wrote (at once, each on its own node's disk), rank 0
        writes the marker with all of them; on a node whose fast tier rank 0's marker is not
        on (its own disk), its first rank writes the same marker: that node's uploader and
        retention go by it. Collective, after DCP's finish step: every rank's data is on
        storage here."""
        files = integrity.file_digests(
            self.fast.fs, path, keep=lambda name: checkpoint_io.writer_rank(name) == self._rank
        )
        for entry in files.values():
            entry["host"] = self._node
        gathered = gather_to_main(files, self._pg)
        marker_path = self.fast.join(path, MARKER)
        data = b""
        if self._rank == 0:
            world = dist.get_world_size() if self._distributed else 1
            every = dict(sorted(kv for part in gathered for kv in part.items()))
            marker = {"step": step, "world_size": world, "seconds": time.perf_counter() - started,
                      "identity": self.identity, "host": self._node, "files": every,
                      "torch": torch.__version__}  # the torch that wrote it  # fmt: skip
            data = json.dumps(marker).encode()
            self.fast.write_atomic(marker_path, data)
        if self._nodes > 1:
            data = broadcast_from_main(data, self._pg)
            if self._local_rank == 0 and self._rank != 0 and not self.fast.fs.exists(marker_path):
                self.fast.write_atomic(marker_path, data)
                self._purges_own = True
        if self._purges_own:
            # Torn directories at or below the newest commit can never complete; newer ones
            # may belong to a save still being written, so they stay (Tier.purge).
            self.fast.purge(step, self.keep)

    # ---- loading -------------------------------------------------------------------------
    def load_latest(self, state: dict[str, Any]) -> CheckpointRef | None:
        """Load the newest complete checkpoint into ``state`` in place; None if there is none."""
        ref = self.latest()
        if ref is not None:
            self.load(ref, state)
        return ref

    def load(self, ref: CheckpointRef, state: dict[str, Any]) -> None:
        """Load ``ref`` into ``state`` in place (collective); every key must be in it. A
        sealed copy's plaintext is removed once every rank has loaded it."""
        try:
            dcp_load(state, storage_reader=self._reader(ref), process_group=self._pg)
        except BaseException:
            if ref.sealed and self._local_rank == 0:  # no plaintext left behind
                self._sealed.remove()
            raise
        if ref.sealed:
            if self._distributed:  # every rank has read its node's copy
                dist.barrier(group=self._pg)
            if self._local_rank == 0:
                self._sealed.remove()

    def has_key(self, ref: CheckpointRef, key: str) -> bool:
        """Whether ``ref`` holds ``key`` (a flattened name, ``job.progress.step``): read from
        its metadata, so a field added later can be left out of loading an older checkpoint."""
        return key in self._reader(ref).read_metadata().state_dict_metadata

    # ---- helpers -------------------------------------------------------------------------
    def _writer(self, path: str) -> StorageWriter:
        return checkpoint_io.storage_writer(path, self.fast.url(path), local=self.fast.local)

    def _reader(self, ref: CheckpointRef) -> StorageReader:
        """DCP's reader of a checkpoint on either tier (its URL says which storage), or of
        this node's opened copy of a sealed one."""
        if ref.sealed:
            url = self._sealed.path(ref)
            return checkpoint_io.storage_reader(url, url, local=True)
        return checkpoint_io.storage_reader(ref.path, ref.path, local=is_local(ref.path))
