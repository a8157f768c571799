"""The Checkpointer's storage side (gpufleet.runtime.checkpoint): DCP readers and writers for
local paths and fsspec URIs, the staging buffers of async saves, storage
errors a restart cannot fix, and whose checkpoint is whose (model fingerprint, identity)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

from gpufleet import torchapi

# Errors of the storage itself, which a restart cannot fix (a transient object store error is
# not among them and keeps its retries).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def model_fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a model's state dict keys, shapes and dtypes: two models with the same
    fingerprint can load each other's checkpoints."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()[:16]


def storage_error(exc: BaseException) -> OSError | None:
    """The storage OSError behind ``exc``, if any: through causes, contexts and the per-rank
    failures of DCP's CheckpointException."""
    stack, seen = [exc], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e
        if isinstance(e, CheckpointException):
            failures: list[Any] = list(e.failures.values())  # (exception, traceback) pairs
            stack.extend(f[0] if isinstance(f, tuple) else f for f in failures)
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def storage_failure(step: int, root: str, error: OSError, newest: list[int], *, local: bool) -> str:
    """What CheckpointStorageError says when the storage refused the save of ``step``: where,
    why, how much space is left (locally) and which checkpoint stays loadable."""
    free = ""
    if local:
        with contextlib.suppress(OSError):
            usage = shutil.disk_usage(root)
            free = f"; {usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB"
    kept = f"newest: step {newest[-1]}" if newest else "none yet"
    return (
        f"the checkpoint of step {step} could not be written to {root}: "
        f"[Errno {error.errno}] {os.strerror(error.errno or 0)}{free}; its torn directory "
        f"was removed and the complete checkpoints stay loadable ({kept}): free space or "
        "fix the permissions, then run again to resume"
    )


_WRITER = re.compile(r"^__(\d+)_")


def writer_rank(name: str) -> int:
    """The rank that wrote a checkpoint file: DCP's file writers name each rank's data files
    ``__<rank>_<n>.distcp``; anything else (``.metadata``, DCP's coordinator's) is rank 0's."""
    match = _WRITER.match(name)
    return int(match.group(1)) if match else 0


def storage_writer(path: str, url: str, *, local: bool) -> StorageWriter:
    """DCP's writer for a checkpoint directory: the file system's (fsynced) or fsspec's."""
    if local:
        return FileSystemWriter(path, sync_files=True)
    writer: StorageWriter = torchapi.fsspec_filesystem().FsspecWriter(url, sync_files=False)
    return writer


def storage_reader(path: str, url: str, *, local: bool) -> StorageReader:
    """DCP's reader for a checkpoint directory: the file system's or fsspec's."""
    if local:
        return FileSystemReader(path)
    reader: StorageReader = torchapi.fsspec_filesystem().FsspecReader(url)
    return reader
