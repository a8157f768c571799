"""Encrypted durable copies (spec.checkpoint.durable.encryption, issue 55): the node's uploader
seals each file of a checkpoint on its way to the durable tier, and a resume from the durable
tier opens the files into node-local plaintext that DCP loads. The cipher is
gpufleet.runtime.encryption's (AES-256-GCM, from ``cryptography``).

A sealed checkpoint's marker is its fast marker (``files``: the plaintext's sizes and SHA-256)
plus ``encryption``: the algorithm, the key's id (never the key) and the ciphertext's
``files``. So:

- ``integrity.verify`` checks the ciphertext without the key (a resume's first look, ``gpufleet
  checkpoints verify``): a changed file is corrupt, set aside, and an older checkpoint tried.
- Opening checks the marker's HMAC (``encryption.mac``, under a key derived from the job's), so
  no digest, name or file list can be rewritten to match a changed or swapped file; then each
  chunk's tag, whose associated data names the file's step directory and name; then each file's
  plaintext digest. Whatever fails is set aside in the same way.
- A job with a key loads no plaintext durable copy: whoever may write the bucket could have put
  it there (its DCP metadata is a pickle). A missing or wrong key stops the job
  (CheckpointKeyError) naming the ids: falling back to an older checkpoint would throw progress
  away where the fix is to give the job its key.

Opened copies go to ``<fast root>/.opened/<node>/<step dir>``: on the node's fast tier (its own
disk; STEP_DIR never matches, so listing, retention and the uploader skip them), one per node
(a fast tier several nodes share holds each node's), removed once loaded.

Imports no torch.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from gpufleet.errors import CheckpointKeyError
from gpufleet.extras import install_hint
from gpufleet.runtime import encryption, integrity
from gpufleet.runtime.context import node_dir_name
from gpufleet.runtime.encryption import ALGORITHM, EncryptionError, Hashed
from gpufleet.runtime.integrity import ENCRYPTION, MARKER, Mismatch, base_name

SAFE_FILE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]+$")  # a file a marker may name: no path

OPENED = ".opened"  # under the fast tier's root


def read_key(path: str | None) -> bytes | None:
    """The key in the file at ``path`` (None: the job encrypts nothing); CheckpointKeyError
    when it cannot be read or is not a key."""
    if path is None:
        return None
    try:
        import cryptography  # noqa: F401  # the cipher's library: missing, nothing can seal
    except ImportError:
        raise CheckpointKeyError(f"spec.checkpoint.durable.encryption needs the cryptography "
                                 f"package: {install_hint('encryption')}") from None  # fmt: skip
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


def _context(path: str) -> bytes:
    """A sealed file's place, in its chunks' associated data: ``<step directory>/<file>``."""
    return "/".join(path.rstrip("/").rsplit("/", 2)[-2:]).encode()


def seal(src_fs: Any, src: str, dst_fs: Any, dst: str, key: bytes, *, fsync: bool) -> tuple[
        dict[str, Any], dict[str, Any]]:  # fmt: skip
    """Encrypt file ``src`` into ``dst`` (streamed: an object store's multipart upload); the
    plaintext's digest and the ciphertext's, taken in that one pass."""
    with src_fs.open(src, "rb") as fin, dst_fs.open(dst, "wb") as fout:
        plain, sealed = Hashed(fin), Hashed(fout)
        encryption.encrypt(plain, sealed, key, _context(dst))
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


def _signed(marker: dict[str, Any]) -> bytes:
    """What a marker's HMAC covers: all of it but the HMAC, as canonical JSON (its
    ``encryption`` a dict: sealed_files)."""
    sealed = {k: v for k, v in marker[ENCRYPTION].items() if k != "mac"}
    return json.dumps(
        {**marker, ENCRYPTION: sealed}, sort_keys=True, separators=(",", ":")
    ).encode()


def sealed_marker(marker_bytes: bytes, parts: list[bytes], key: bytes) -> bytes:
    """The durable marker of a sealed checkpoint: the fast marker, every node's ciphertext
    digests, and its HMAC (ValueError when the nodes sealed with different keys)."""
    records = [json.loads(p) for p in parts]
    ids = {r.get("key_id") for r in records if isinstance(r, dict)}
    if len(ids) != 1 or not all(isinstance(r, dict) for r in records):
        raise ValueError(
            f"the nodes' parts were sealed with different keys ({sorted(map(str, ids))})"
        )
    files = dict(sorted(kv for r in records for kv in r["files"].items()))
    marker = json.loads(marker_bytes)
    marker[ENCRYPTION] = {"algorithm": ALGORITHM, "key_id": ids.pop(), "files": files}
    marker[ENCRYPTION]["mac"] = encryption.mac(key, _signed(marker))
    return json.dumps(marker).encode()


def opened_root(fast_root: str, node: str) -> Path:
    """Where ``node`` opens sealed checkpoints (the fast tier is a local path whenever there
    is a durable one: spec.checkpoint's rule)."""
    return Path(fast_root) / OPENED / node_dir_name(node)


def opened_dir(fast_root: str, node: str, url: str) -> Path:
    """Where ``node`` opens the sealed checkpoint at ``url``."""
    return opened_root(fast_root, node) / base_name(url)


def open_checkpoint(
    fs: Any, directory: str, marker: dict[str, Any], key: bytes | None, into: Path, url: str
) -> list[Mismatch]:
    """Decrypt every file of the sealed checkpoint at ``directory`` (``url``, as messages name
    it) into ``into``, its marker's HMAC first, each file checked against the marker's
    plaintext digest; what does not verify ([]: all does, else nothing is left in ``into``).
    CheckpointKeyError without the key it was sealed with."""
    if sealed_files(marker) is None:  # not a dict, or no files: nothing to trust
        return [Mismatch(MARKER, "an encryption record", "a malformed one")]
    want = str(marker[ENCRYPTION].get("key_id"))
    where = f"the durable checkpoint of step {marker.get('step')} ({url})"
    if key is None:
        raise CheckpointKeyError(f"{where} is encrypted with key {want}, and this job has no key: "
                                 "set spec.checkpoint.durable.encryption")  # fmt: skip
    if want != encryption.key_id(key):
        raise CheckpointKeyError(f"{where} is encrypted with key {want}, not with this job's key "
                                 f"({encryption.key_id(key)}): give the job the key it was "
                                 "written with")  # fmt: skip
    files = _files(marker, key)
    if isinstance(files, Mismatch):
        return [files]
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    try:
        problems = [p for name, digest in files.items()
                    if (p := _open_file(fs, integrity.join(directory, name), into / name,
                                        digest, key))]  # fmt: skip
    except BaseException:  # the store gone, the disk full: no plaintext left behind
        shutil.rmtree(into, ignore_errors=True)
        raise
    if problems:
        shutil.rmtree(into, ignore_errors=True)  # no plaintext of a copy that is set aside
    return problems


def _files(marker: dict[str, Any], key: bytes) -> dict[str, dict[str, Any]] | Mismatch:
    """The marker's plaintext digests once its HMAC verifies and every name is a plain file
    name that both lists hold; else what is wrong with the marker."""
    got = str(marker[ENCRYPTION].get("mac", "")).encode("utf-8", "replace")
    if not hmac.compare_digest(got, encryption.mac(key, _signed(marker)).encode()):
        return Mismatch(MARKER, "an HMAC under the job's key", "one that does not verify")
    files, sealed = marker.get("files"), marker[ENCRYPTION].get("files")
    if not (isinstance(files, dict) and isinstance(sealed, dict) and files.keys() == sealed.keys()
            and all(SAFE_FILE.match(n) for n in files)):  # fmt: skip
        return Mismatch(MARKER, "the same plain file names in files and encryption.files",
                        "other names")  # fmt: skip
    return files


def _open_file(fs: Any, src: str, dst: Path, digest: dict[str, Any], key: bytes) -> Mismatch | None:
    """Decrypt one file; None when its plaintext is what the marker says."""
    with fs.open(src, "rb") as fin, dst.open("wb") as fout:
        plain = Hashed(fout)
        try:
            encryption.decrypt(fin, plain, key, _context(src))
        except EncryptionError as exc:  # WrongKey here: a header changed (the marker's id is ours)
            return Mismatch(base_name(src), f"{ALGORITHM} under the job's key", str(exc))
    got = plain.digest()["sha256"]
    if got != digest.get("sha256"):
        return Mismatch(base_name(src), f"plaintext sha256 {digest.get('sha256')}", f"sha256 {got}")
    return None


def refused_plaintext() -> list[Mismatch]:
    """Why a job with a key refuses a plaintext durable copy."""
    return [Mismatch(MARKER, "an encrypted copy (the job has spec.checkpoint.durable.encryption)",
                     "a plaintext one, which anyone who may write the durable tier could have "
                     "put there")]  # fmt: skip


def remove_opened(fast_root: str, node: str) -> None:
    """Remove every checkpoint ``node`` opened (after a load; a crash's leftovers too)."""
    shutil.rmtree(opened_root(fast_root, node), ignore_errors=True)
