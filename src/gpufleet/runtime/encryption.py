"""Checkpoint files encrypted for the durable tier (spec.checkpoint.durable.encryption, issue 55):
AES-256-GCM from the ``cryptography`` library (no cipher code here), in chunks, so that a file
of any size streams through a fixed amount of memory and a change anywhere in it is found.

A file's layout::

    MAGIC | key id (8 bytes) | salt (32 random bytes) | chunk 0 | chunk 1 | ...

Each file has its own key, derived from the job's key and the file's salt with HKDF-SHA256, so
no nonce is ever used twice under one key however many files a key seals: a chunk's nonce is
its number. Each chunk is at most ``CHUNK`` bytes of the file, sealed with its 16-byte tag over
associated data: the header, the caller's ``context`` (the file's place: its step directory and
name), the chunk's number and whether it is the last. So a chunk moved, dropped, repeated or
cut off (the file truncated where a chunk ends), a file moved to another name or step, and any
flipped bit fail to open: ``Tampered``. A file whose size is a multiple of ``CHUNK`` ends with
an empty last chunk.

The key id is the first 8 bytes of the key's SHA-256: a checkpoint's marker names the key it
needs without holding anything that helps find the key, and a wrong key is told apart from a
tampered file before anything is decrypted. ``mac`` authenticates a marker with a key derived
from the job's for that alone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

MAGIC = b"GFCKPTE1"
KEY_BYTES = 32  # AES-256
ID_BYTES = 8
SALT_BYTES = 32
TAG_BYTES = 16
CHUNK = 4 << 20  # plaintext bytes per sealed chunk
HEADER_BYTES = len(MAGIC) + ID_BYTES + SALT_BYTES
ALGORITHM = "AES-256-GCM"


class Hashed:
    """A binary file that counts and hashes (SHA-256) what passes through it, read or
    written: the digests a marker records, taken in the pass that encrypts or decrypts."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.size, self._sha = file, 0, hashlib.sha256()

    def read(self, n: int) -> bytes:
        data = self.file.read(n)
        self._seen(data)
        return data

    def write(self, data: bytes) -> int:
        self._seen(data)
        return self.file.write(data)

    def _seen(self, data: bytes) -> None:
        self.size += len(data)
        self._sha.update(data)

    def digest(self) -> dict[str, int | str]:
        """``{"size", "sha256"}``, as the marker's ``files`` hold them."""
        return {"size": self.size, "sha256": self._sha.hexdigest()}


class EncryptionError(Exception):
    """A file cannot be decrypted: not encrypted by gpufleet, or with another key."""


class WrongKey(EncryptionError):
    """The file was encrypted with a key other than the one given (the message names both
    ids)."""


class Tampered(EncryptionError):
    """A chunk's tag does not verify: the file was changed or cut, read like a corrupt
    file."""


def key_id(key: bytes) -> str:
    """The id a marker records for ``key``: hex of its SHA-256's first bytes."""
    return hashlib.sha256(key).digest()[:ID_BYTES].hex()


def check_key(key: bytes) -> bytes:
    if len(key) != KEY_BYTES:
        raise ValueError(f"an {ALGORITHM} key is {KEY_BYTES} bytes, this one {len(key)}")
    return key


def _derived(key: bytes, salt: bytes | None, purpose: bytes) -> bytes:
    """A key of KEY_BYTES for one ``purpose`` (and one file's ``salt``), by HKDF-SHA256."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(hashes.SHA256(), KEY_BYTES, salt, b"gpufleet " + purpose).derive(key)


def _aad(header: bytes, context: bytes, index: int, last: bool) -> bytes:
    lengths = len(context).to_bytes(4, "big")  # the context's length: no ambiguous join
    return header + lengths + context + index.to_bytes(8, "big") + (b"\x01" if last else b"\x00")


def _nonce(index: int) -> bytes:
    return index.to_bytes(12, "big")  # GCM's own nonce size; the key is the file's own


def _chunks(src: BinaryIO | Hashed) -> Iterator[tuple[bytes, bool]]:
    """``src`` in chunks of ``CHUNK`` bytes, each with whether it is the last."""
    chunk = src.read(CHUNK)
    while True:
        following = src.read(CHUNK) if len(chunk) == CHUNK else b""
        last = len(chunk) < CHUNK
        yield chunk, last
        if last:
            return
        chunk = following


def encrypt(
    src: BinaryIO | Hashed, dst: BinaryIO | Hashed, key: bytes, context: bytes = b""
) -> None:
    """Write ``src`` encrypted under ``key`` to ``dst``; ``context``: where it belongs (it
    must be the same to decrypt)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt = os.urandom(SALT_BYTES)
    header = MAGIC + bytes.fromhex(key_id(check_key(key))) + salt
    aes = AESGCM(_derived(key, salt, b"checkpoint file"))
    dst.write(header)
    for index, (chunk, last) in enumerate(_chunks(src)):
        dst.write(aes.encrypt(_nonce(index), chunk, _aad(header, context, index, last)))


def _header(src: BinaryIO | Hashed) -> bytes:
    header = src.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or not header.startswith(MAGIC):
        raise EncryptionError("not a checkpoint file encrypted by gpufleet")
    return header


def file_key_id(src: BinaryIO) -> str:
    """The id of the key an encrypted file needs (EncryptionError when it is not one)."""
    return _header(src)[len(MAGIC) : len(MAGIC) + ID_BYTES].hex()


def decrypt(
    src: BinaryIO | Hashed, dst: BinaryIO | Hashed, key: bytes, context: bytes = b""
) -> None:
    """Write the plaintext of ``src`` to ``dst``: WrongKey, or Tampered at the first chunk
    that does not verify (what was written before it is the file's true start)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    header = _header(src)
    found = header[len(MAGIC) : len(MAGIC) + ID_BYTES].hex()
    if found != key_id(check_key(key)):
        raise WrongKey(f"encrypted with key {found}, not with the key given ({key_id(key)})")
    aes, full = AESGCM(_derived(key, header[-SALT_BYTES:], b"checkpoint file")), CHUNK + TAG_BYTES
    sealed, index = src.read(full), 0
    while True:
        following = src.read(full) if len(sealed) == full else b""
        last = not following
        try:
            dst.write(aes.decrypt(_nonce(index), sealed, _aad(header, context, index, last)))
        except InvalidTag:
            raise Tampered(f"chunk {index} does not verify: the file was changed") from None
        if last:
            return
        sealed, index = following, index + 1


def mac(key: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data`` (a marker's canonical JSON) under a key derived from ``key`` for
    markers alone, in hex."""
    from cryptography.hazmat.primitives import hashes, hmac

    signer = hmac.HMAC(_derived(check_key(key), None, b"checkpoint marker"), hashes.SHA256())
    signer.update(data)
    return signer.finalize().hex()


def load_key(read: Callable[[], bytes], where: str) -> bytes:
    """A key as kept in a Secret or a file: 32 raw bytes, or their base64 (a Secret's
    ``stringData``, ``openssl rand -base64 32``); ValueError naming ``where`` otherwise."""
    import base64
    import binascii

    raw = read()
    if len(raw) == KEY_BYTES:
        return raw
    try:
        decoded = base64.b64decode(raw.strip(), validate=True)
    except binascii.Error:
        decoded = b""
    if len(decoded) != KEY_BYTES:
        raise ValueError(f"{where}: not a {KEY_BYTES}-byte key, raw or in base64 "
                         "(make one with: openssl rand -base64 32)")  # fmt: skip
    return decoded
