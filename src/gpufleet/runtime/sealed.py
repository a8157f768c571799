"""Encrypted durable copies (spec.checkpoint.durable.encryption, issue 55): the node's uploader
seals each file of a checkpoint on its way to the durable tier, and a resume from the durable
tier opens the files into node-local plaintext that DCP loads. The cipher is
gpufleet.runtime.encryption's (AES-256-GCM, from ``cryptography``).

A sealed checkpoint's marker is its fast marker (``files``: the plaintext's sizes and SHA-256)
plus ``encryption``: the algorithm, the key's id (never the key) and the ciphertext's
``files``. So:

- ``integrity.verify`` checks the ciphertext without the key (a resume's first look, ``gpufleet
  checkpoints verify``): a changed file is corrupt, set aside, and an older checkpoint tried.
- Opening checks each chunk's tag, then each file's plaintext digest against the marker: a
  file changed together with the marker's ciphertext digests is refused in the same way.
- A missing or wrong key stops the job (CheckpointKeyError) naming the ids: falling back to an
  older checkpoint would throw progress away where the fix is to give the job its key.

Opened copies go to ``<fast root>/.opened/<node>/<step dir>``: on the node's fast tier (its own
disk; STEP_DIR never matches, so listing, retention and the uploader skip them), one per node
(a fast tier several nodes share holds each node's), removed once loaded.

Imports no torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from gpufleet.errors import CheckpointKeyError
from gpufleet.runtime import encryption, integrity
from gpufleet.runtime.encryption import ALGORITHM, EncryptionError, Hashed, Tampered, WrongKey
from gpufleet.runtime.integrity import ENCRYPTION

OPENED = ".opened"  # under the fast tier's root


def read_key(path: str | None) -> bytes | None:
    """The key in the file at ``path`` (None: the job encrypts nothing); CheckpointKeyError
    when it cannot be read or is not a key."""
    if path is None:
        return None
    try:
        return encryption.load_key(Path(path).read_bytes, path)
    except OSError as exc:
        raise CheckpointKeyError(f"spec.checkpoint.durable.encryption: cannot read the key "
                                 f"file {path}: {exc.strerror or exc}") from None  # fmt: skip
    except ValueError as exc:
        raise CheckpointKeyError(f"spec.checkpoint.durable.encryption: {exc}") from None


def sealed_files(marker: dict[str, Any]) -> dict[str, Any] | None:
    """The ciphertext's ``{name: {"size", "sha256"}}`` of a sealed checkpoint's marker (None:
    not sealed)."""
    sealed = marker.get(ENCRYPTION)
    files = sealed.get("files") if isinstance(sealed, dict) else None
    return files if isinstance(files, dict) else None


def seal(src_fs: Any, src: str, dst_fs: Any, dst: str, key: bytes, *, fsync: bool) -> tuple[
        dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Encrypt file ``src`` into ``dst`` (streamed: an object store's multipart upload); the
    plaintext's digest and the ciphertext's, taken in that one pass."""
    with src_fs.open(src, "rb") as fin, dst_fs.open(dst, "wb") as fout:
        plain, sealed = Hashed(fin), Hashed(fout)
        encryption.encrypt(plain, sealed, key)
        if fsync:  # on disk before the marker says it is
            fout.flush()
            os.fsync(fout.fileno())
    return plain.digest(), sealed.digest()


def part(files: dict[str, dict[str, Any]], key: bytes | None) -> bytes:
    """A node's part record: the names of the files it uploaded, and sealed, their ciphertext
    digests under its key's id."""
    if key is None:
        return json.dumps(sorted(files)).encode()
    return json.dumps({"key_id": encryption.key_id(key), "files": files}).encode()


def sealed_marker(marker_bytes: bytes, parts: list[bytes]) -> bytes:
    """The durable marker of a sealed checkpoint: the fast marker and every node's ciphertext
    digests (ValueError when the nodes sealed with different keys)."""
    records = [json.loads(p) for p in parts]
    ids = {r.get("key_id") for r in records if isinstance(r, dict)}
    if len(ids) != 1 or not all(isinstance(r, dict) for r in records):
        raise ValueError(
            f"the nodes' parts were sealed with different keys ({sorted(map(str, ids))})"
        )
    files = dict(sorted(kv for r in records for kv in r["files"].items()))
    marker = json.loads(marker_bytes)
    marker[ENCRYPTION] = {"algorithm": ALGORITHM, "key_id": ids.pop(), "files": files}
    return json.dumps(marker).encode()


def opened_root(fast_root: str, node: str) -> Path:
    """Where ``node`` opens sealed checkpoints (the fast tier is a local path whenever there
    is a durable one: spec.checkpoint's rule)."""
    return Path(fast_root) / OPENED / re.sub(r"[^A-Za-z0-9._-]", "_", node)


def opened_dir(fast_root: str, node: str, url: str) -> Path:
    """Where ``node`` opens the sealed checkpoint at ``url``."""
    return opened_root(fast_root, node) / url.rstrip("/").rsplit("/", 1)[-1]


def open_checkpoint(
    fs: Any, directory: str, marker: dict[str, Any], key: bytes | None, into: Path, url: str
) -> list[integrity.Mismatch]:
    """Decrypt every file of the sealed checkpoint at ``directory`` (``url``, as messages name
    it) into ``into``, each checked against the marker's plaintext digest; the files that do not
    verify ([]: all do). CheckpointKeyError without the key it was sealed with."""
    sealed = marker[ENCRYPTION]
    want = str(sealed.get("key_id"))
    where = f"the durable checkpoint of step {marker.get('step')} ({url})"
    if key is None:
        raise CheckpointKeyError(f"{where} is encrypted with key {want}, and this job has no key: "
                                 "set spec.checkpoint.durable.encryption")  # fmt: skip
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    problems = []
    for name, digest in marker["files"].items():
        with (
            fs.open(integrity.join(directory, name), "rb") as fin,
            (into / name).open("wb") as fout,
        ):
            plain = Hashed(fout)
            try:
                encryption.decrypt(fin, plain, key)
            except WrongKey:
                raise CheckpointKeyError(f"{where} is encrypted with key {want}, not with this "
                                         f"job's key ({encryption.key_id(key)}): give the job the "
                                         "key it was written with") from None  # fmt: skip
            except (Tampered, EncryptionError) as exc:
                problems.append(integrity.Mismatch(name, f"{ALGORITHM} with key {want}", str(exc)))
                continue
        got = plain.digest()
        if got["sha256"] != digest["sha256"]:
            problems.append(integrity.Mismatch(name, f"plaintext sha256 {digest['sha256']}",
                                               f"sha256 {got['sha256']}"))  # fmt: skip
    return problems


def remove_opened(fast_root: str, node: str) -> None:
    """Remove every checkpoint ``node`` opened (after a load; a crash's leftovers too)."""
    shutil.rmtree(opened_root(fast_root, node), ignore_errors=True)
