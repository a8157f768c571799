"""The durable tier's uploader: copies a job's committed checkpoints from its fast tier (node-local
NVMe, an emptyDir, tmpfs) to its durable tier (a PVC path or ``s3://``), in the background.

One per node, in the process that outlives worker restarts (``gpufleet run`` locally, the pod's
launcher in a pod), so a worker crash neither stops nor repeats an upload, and the training loop
never waits for the durable tier: it blocks only for the fast tier's save.

What makes a durable copy trustworthy:

- Only a committed fast checkpoint (its ``COMPLETE.json`` written) is uploaded, file by file,
  each file read back from the durable tier and its SHA-256 compared with the marker's; a
  mismatch uploads that file again.
- The marker is written last, so a half-uploaded checkpoint (the uploader killed mid-file, the
  bucket gone) is torn on the durable tier, never loaded, and removed by a later retention pass.
- Each file gets ``ATTEMPTS`` tries with doubling backoff (``BACKOFF``); then the checkpoint
  waits for the next pass (every ``RETRY_AFTER`` seconds at most), and the failure is kept for
  the metrics, ``gpufleet status`` and the run's summary. A failing upload never stops training.
- Newest first: when a newer checkpoint is committed before an older one is durable, the older
  one is superseded (listed as never durable), so the durable tier's lag stays one upload.
- Durable retention keeps ``keep`` of this job's complete checkpoints, and runs only after a
  verified upload, so it never deletes the newest verified durable copy.

Encrypted (spec.checkpoint.durable.encryption): each file is sealed on its way
(gpufleet.runtime.sealed) and the uploaded ciphertext verified against the digest taken while
sealing; the durable marker adds every node's ciphertext digests and the key's id.

A job on several nodes: the marker names the node (``host``, gpufleet.runtime.context.node_id)
whose ranks wrote each file. Each node's uploader copies its own node's files, from its own disk
or from a fast tier all nodes share, and then writes ``.parts/<node>.json`` beside them on the
durable tier; the uploader of the node that wrote the marker (rank 0's) writes the durable
marker once every node's part is there. A node that never uploads its part (lost with its
disk) leaves that checkpoint incomplete on the durable tier, its lag growing, until a newer
checkpoint is uploaded whole.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.runtime import integrity, sealed
from gpufleet.runtime.context import node_dir_name, node_id
from gpufleet.runtime.integrity import MARKER
from gpufleet.runtime.tier import DURABLE, FAST, CheckpointRef, Tier

ATTEMPTS = 4  # tries per file within one pass
BACKOFF = (0.5, 8.0)  # the first retry's delay and the cap, doubling in between (seconds)
RETRY_AFTER = 5.0  # seconds before a failed checkpoint is tried again in a later pass
POLL = 0.5  # seconds between looks at the fast tier
PARTS = ".parts"  # in a durable checkpoint directory: each node's record of its files uploaded


class UploadError(Exception):
    """A checkpoint could not be made durable in this pass (the message says why)."""


class Waiting(Exception):
    """This node's part is up; the checkpoint waits for other nodes' (not a failure)."""


@dataclass
class UploadState:
    """What the uploader has done; JSON-able (the run's summary, ``gpufleet status``)."""

    newest_fast: int | None = None  # newest committed step seen on the fast tier
    newest_durable: int | None = None  # newest step verified on the durable tier
    pending_since: float | None = None  # when the oldest not-yet-durable commit was first seen
    uploaded: list[int] = field(default_factory=list)  # steps this uploader made durable
    never_durable: list[int] = field(default_factory=list)  # superseded or failed for good
    failures: int = 0  # failed passes, in total
    error: str | None = None  # the last failure's reason, None once a later upload worked
    waiting: str | None = None  # what the newest checkpoint waits for (other nodes' files)
    upload_seconds: float = 0.0  # the last upload's duration, verification included

    def lag_steps(self) -> int:
        if self.newest_fast is None:
            return 0
        return self.newest_fast - (self.newest_durable or 0)

    def lag_seconds(self, now: float | None = None) -> float:
        if self.pending_since is None:
            return 0.0
        return max(0.0, (now or time.time()) - self.pending_since)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lag_steps": self.lag_steps(), "lag_seconds": self.lag_seconds()}


class Uploader:
    """Uploads ``fast``'s committed checkpoints to ``durable``; ``start()`` runs it in a
    thread, ``drain(timeout)`` waits for the newest, ``stop()`` ends it."""

    def __init__(
        self,
        fast: Tier,
        durable: Tier,
        *,
        keep: int,
        on_change: Callable[[UploadState], None] | None = None,
        node: str | None = None,
        key: bytes | None = None,
    ) -> None:
        self.fast, self.durable, self.keep, self.key = fast, durable, keep, key
        self.node = node or node_id()  # whose files this uploader copies
        self.state = UploadState()
        self._on_change = on_change
        self._seen: set[int] = set()  # committed steps seen on the fast tier
        self._durable: set[int] | None = None  # steps known durable (listed at the first pass)
        self._failed_at: dict[str, float] = {}  # directory name -> when its last pass failed
        self._parts: set[str] = set()  # directories whose part this node has uploaded
        self._owned: dict[str, bool] = {}  # fast directory name -> whether it is this job's
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.log = fast.log

    # ---- the loop ------------------------------------------------------------------------
    def start(self) -> Uploader:
        self._thread = threading.Thread(target=self._loop, name="gpufleet-upload", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.pass_once()
            except Exception as exc:  # a bug here must not end the uploads (nor training)
                self._failed(f"uploader pass failed: {exc!r}")
            self._stop.wait(POLL)

    def pass_once(self) -> CheckpointRef | None:
        """Make the newest committed fast checkpoint durable, if it is not; returns it once it
        is durable (None: nothing to do, or it failed this pass)."""
        listed = self.fast.complete()
        self._forget_all_but({_name(r.path) for r in listed})
        committed = [r for r in listed if self._mine(r)]
        if not committed:
            return None
        newest = committed[-1]
        if self._durable is None:
            self._durable = {r.step for r in self.durable.complete()}
        self._note_commits([r.step for r in committed])
        name = _name(newest.path)
        if self._is_durable(name):
            self._done(newest.step, uploaded=False)
            return newest
        if time.monotonic() - self._failed_at.get(name, -RETRY_AFTER) < RETRY_AFTER:
            return None
        started = time.monotonic()
        try:
            if not self.upload(newest):
                return None  # this node's part is up; the marker is another node's to write
        except Waiting as exc:
            self.state.waiting = str(exc)
            return None
        # Any error of the object store's client (botocore's are not OSErrors): a failed
        # upload is retried and reported, never allowed to end the uploads or the training.
        except Exception as exc:
            self._failed_at[name] = time.monotonic()
            self._failed(f"step {newest.step} to {self.durable.root}: {exc}")
            return None
        self.state.upload_seconds = time.monotonic() - started
        self._done(newest.step, uploaded=True)
        return newest

    def _mine(self, ref: CheckpointRef) -> bool:
        """Whether ``ref`` is this job's: read from its marker once per directory (a
        directory's marker never changes), not on every pass."""
        name = _name(ref.path)
        if name not in self._owned:
            self._owned[name] = self.fast.mine(self.fast.fs_path(ref.path))
        return self._owned[name]

    def _forget_all_but(self, names: set[str]) -> None:
        """Keep what is remembered per checkpoint directory (its owner, its last failure,
        its part uploaded) only for the directories the fast tier still lists: retention removes
        the others, and a job's life of checkpoints would otherwise grow these by one each."""
        for memo in (self._owned, self._failed_at):
            for gone in memo.keys() - names:
                del memo[gone]
        self._parts &= names

    # ---- one checkpoint ------------------------------------------------------------------
    def upload(self, ref: CheckpointRef) -> bool:
        """Copy this node's files of ``ref`` to the durable tier, each verified, then its part
        record; on the marker's node, once every node's part is there, the marker. True when
        the marker is written; Waiting while other nodes' parts are missing."""
        src = self.fast.fs_path(ref.path)
        name = _name(src)
        try:
            marker_bytes = self.fast.fs.cat_file(self.fast.join(src, MARKER))
        except FileNotFoundError:
            raise UploadError("its fast copy was removed (retention) before upload") from None
        marker = json.loads(marker_bytes)
        files = marker.get("files")
        if not isinstance(files, dict):
            raise UploadError("its marker has no checksums (written before gpufleet had them)")
        writer = str(marker.get("host") or self.node)  # no hosts: one node's, this one's
        hosts = {str(f.get("host") or writer) for f in files.values()}
        dst = self.durable.join(self.durable.root_path, name)
        if name not in self._parts and not self.durable.fs.exists(self._part(dst, self.node)):
            self.durable.fs.makedirs(dst, exist_ok=True)  # a directory tier's; no-op on S3
            mine = sorted(n for n, f in files.items() if str(f.get("host") or writer) == self.node)
            uploaded = {file: self._copy_verified(self.fast.join(src, file),
                                                  self.durable.join(dst, file), files[file])
                        for file in mine}  # fmt: skip
            self.durable.fs.makedirs(self.durable.join(dst, PARTS), exist_ok=True)
            self.durable.write_atomic(self._part(dst, self.node), sealed.part(uploaded, self.key))
        self._parts.add(name)
        if self.node != writer:
            return False
        missing = sorted(h for h in hosts if not self.durable.fs.exists(self._part(dst, h)))
        if missing:
            raise Waiting(f"step {ref.step} waits for the files of node {', '.join(missing)}")
        if self.key is not None:
            parts = [self.durable.fs.cat_file(self._part(dst, h)) for h in sorted(hosts)]
            marker_bytes = sealed.sealed_marker(marker_bytes, parts, self.key)
        self.durable.write_atomic(self.durable.join(dst, MARKER), marker_bytes)
        self.durable.purge(ref.step, self.keep)
        return True

    def _part(self, directory: str, node: str) -> str:
        name = f"{node_dir_name(node)}.json"
        return self.durable.join(self.durable.join(directory, PARTS), name)

    def _copy_verified(self, src: str, dst: str, want: dict[str, Any]) -> dict[str, Any]:
        """Copy ``src`` to ``dst`` until the copy verifies; its digest (the ciphertext's when
        sealed, else ``want``)."""
        delay, last = BACKOFF[0], ""
        for attempt in range(ATTEMPTS):
            if self._stop.is_set():
                raise UploadError(f"stopped while uploading {_name(src)}")
            if attempt:
                self._stop.wait(delay)  # a stop ends the waiting, not the attempts
                delay = min(delay * 2, BACKOFF[1])
            try:
                stored = self._copy(src, dst, want)
                size = int(self.durable.fs.size(dst))
                got = integrity.sha256_of(self.durable.fs, dst)
            except FileNotFoundError as exc:
                if not self.fast.fs.exists(src):
                    raise UploadError(f"{_name(src)} is not on the fast tier") from exc
                last = f"{_name(dst)}: {exc}"
                continue
            except Exception as exc:  # the store's client errors, as in pass_once
                last = f"{_name(dst)}: {exc}"
                continue
            if size == stored["size"] and got == stored["sha256"]:
                return stored
            last = f"{_name(dst)}: uploaded copy has sha256 {got[:16]} ({size} bytes)"
            if integrity.sha256_of(self.fast.fs, src) != want["sha256"]:
                raise UploadError(f"the fast copy of {_name(src)} does not match its marker")
        raise UploadError(f"{ATTEMPTS} attempts failed, the last: {last}")

    def _copy(self, src: str, dst: str, want: dict[str, Any]) -> dict[str, Any]:
        """Copy (or seal) ``src`` to ``dst``; the digest the stored copy must have."""
        if self.key is not None:
            plain, stored = sealed.seal(self.fast.fs, src, self.durable.fs, dst, self.key,
                                        fsync=self.durable.local)  # fmt: skip
            if plain != {"size": want["size"], "sha256": want["sha256"]}:
                raise UploadError(f"the fast copy of {_name(src)} does not match its marker")
            return stored
        if self.fast.local and not self.durable.local:
            self.durable.fs.put_file(src, dst)  # multipart for large files (s3fs)
            return want
        with self.fast.fs.open(src, "rb") as fin, self.durable.fs.open(dst, "wb") as fout:
            while chunk := fin.read(8 << 20):
                fout.write(chunk)
            if self.durable.local:  # on disk before the marker says it is (its rename and
                fout.flush()  # directory fsync follow in write_atomic)
                os.fsync(fout.fileno())
        return want

    def _is_durable(self, name: str) -> bool:
        path = self.durable.join(self.durable.join(self.durable.root_path, name), MARKER)
        try:
            return bool(self.durable.fs.exists(path))
        except Exception:  # unreachable (the store's client errors): not known durable
            return False

    # ---- state ---------------------------------------------------------------------------
    def _note_commits(self, steps: list[int]) -> None:
        new = [s for s in steps if s not in self._seen]
        if not new:
            return
        with self._changed:  # stop() may note commits while the loop's thread still runs
            self._seen.update(new)
            if self.state.pending_since is None:
                self.state.pending_since = time.time()
            self.state.newest_fast = max(self._seen)
        self._notify()

    def _done(self, step: int, *, uploaded: bool) -> None:
        with self._changed:
            fresh = step != self.state.newest_durable
            self.state.newest_durable = step
            known = self._durable = (self._durable or set()) | {step}
            if uploaded:
                self.state.uploaded.append(step)
                self.state.error = None
            self.state.waiting = None
            self.state.never_durable = sorted(s for s in self._seen - known if s < step)
            if step == self.state.newest_fast:
                self.state.pending_since = None
            self._changed.notify_all()
        if fresh:
            self._notify()

    def _failed(self, reason: str) -> None:
        with self._changed:
            self.state.failures += 1
            self.state.error = reason
            self._changed.notify_all()
        self.log(f"gpufleet: WARNING durable tier: {reason}; training goes on, retrying")
        self._notify()

    def _notify(self) -> None:
        if self._on_change is not None:
            self._on_change(self.state)

    # ---- the end -------------------------------------------------------------------------
    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the newest committed fast checkpoint is
        durable; True when it is (or there is none)."""
        deadline = time.monotonic() + timeout
        while self._thread is None and time.monotonic() < deadline:  # not started: pass here
            if self.pass_once() is not None or self._newest_committed() is None:
                break
            time.sleep(POLL)
        with self._changed:
            while True:
                newest = self._newest_committed()
                if newest is None or newest == self.state.newest_durable:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, POLL))

    def _newest_committed(self) -> int | None:
        steps = [r.step for r in self.fast.complete()]
        return steps[-1] if steps else None

    def stop(self, join: float = 2.0) -> UploadState:
        """End the loop, waiting up to ``join`` seconds for an upload in progress to give up
        (a request to a store that does not answer can take longer: the thread is a daemon,
        and the process's exit ends it); the state, every commit never made durable listed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(join)
            self._thread = None
        # The fast tier is this node's disk: listed once more, a commit the loop has not seen
        # (the preemption checkpoint, while it retries an upload) is named too. What is durable
        # is what it knows (listed at its first pass, and its own uploads): no request to the
        # store, which may be the reason it stops.
        try:
            self._note_commits([r.step for r in self.fast.complete()
                                if self.fast.mine(self.fast.fs_path(r.path))])  # fmt: skip
        except OSError as exc:
            self.log(f"gpufleet: WARNING could not list the fast tier at the end: {exc}")
        with self._changed:
            self.state.never_durable = sorted(self._seen - (self._durable or set()))
        return self.state


_name = integrity.base_name


def tiers(
    fast_root: str, durable_root: str, job: str, log: Callable[[str], None] | None = None
) -> tuple[Tier, Tier]:
    """The fast and durable tiers of job ``job`` (their retention touches only its own)."""
    identity = {"job": job}
    return (
        Tier(fast_root, name=FAST, identity=identity, log=log),
        Tier(durable_root, name=DURABLE, identity=identity, log=log),
    )
