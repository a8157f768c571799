"""Checkpoint files encrypted for the durable tier (spec.checkpoint.durable.encryption, issue 55):
AES-256-GCM from the ``cryptography`` library (no cipher code here), in chunks, so that a file
of any size streams through a fixed amount of memory and a change anywhere in it is found.

A file's layout::

    MAGIC | key id (8 bytes) | nonce prefix (8 random bytes) | chunk 0 | chunk 1 | ...

Each chunk is at most ``CHUNK`` bytes of the file, sealed with its 16-byte tag; its nonce is the
file's random prefix and the chunk's number, and its associated data the header, the number
and whether it is the last chunk. So a chunk moved, dropped, repeated or cut off (the file
truncated where a chunk ends) fails to open, as does any flipped bit: ``Tampered``. A file
whose size is a multiple of ``CHUNK`` ends with an empty last chunk.

The key id is the first 8 bytes of the key's SHA-256: a checkpoint's marker names the key it
needs without holding anything that helps find the key, and a wrong key is told apart from a
tampered file before anything is decrypted.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from typing import BinaryIO

MAGIC = b"GFCKPTE1"
KEY_BYTES = 32  # AES-256
ID_BYTES = 8
PREFIX_BYTES = 8
TAG_BYTES = 16
CHUNK = 4 << 20  # plaintext bytes per sealed chunk
HEADER_BYTES = len(MAGIC) + ID_BYTES + PREFIX_BYTES
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


def _aad(header: bytes, index: int, last: bool) -> bytes:
    return header + index.to_bytes(8, "big") + (b"\x01" if last else b"\x00")


def _nonce(prefix: bytes, index: int) -> bytes:
    return prefix + index.to_bytes(4, "big")  # 12 bytes: GCM's own nonce size


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


def encrypt(src: BinaryIO | Hashed, dst: BinaryIO | Hashed, key: bytes) -> None:
    """Write ``src`` encrypted under ``key`` to ``dst``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    aes = AESGCM(check_key(key))
    header = MAGIC + bytes.fromhex(key_id(key)) + os.urandom(PREFIX_BYTES)
    dst.write(header)
    for index, (chunk, last) in enumerate(_chunks(src)):
        dst.write(aes.encrypt(_nonce(header[-PREFIX_BYTES:], index), chunk,
                              _aad(header, index, last)))  # fmt: skip


def _header(src: BinaryIO | Hashed) -> bytes:
    header = src.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or not header.startswith(MAGIC):
        raise EncryptionError("not a checkpoint file encrypted by gpufleet")
    return header


def file_key_id(src: BinaryIO) -> str:
    """The id of the key an encrypted file needs (EncryptionError when it is not one)."""
    return _header(src)[len(MAGIC) : len(MAGIC) + ID_BYTES].hex()


def decrypt(src: BinaryIO | Hashed, dst: BinaryIO | Hashed, key: bytes) -> None:
    """Write the plaintext of ``src`` to ``dst``: WrongKey, or Tampered at the first chunk
    that does not verify (what was written before it is the file's true start)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    header = _header(src)
    found = header[len(MAGIC) : len(MAGIC) + ID_BYTES].hex()
    if found != key_id(check_key(key)):
        raise WrongKey(f"encrypted with key {found}, not with the key given ({key_id(key)})")
    aes, prefix, full = AESGCM(key), header[-PREFIX_BYTES:], CHUNK + TAG_BYTES
    sealed, index = src.read(full), 0
    while True:
        following = src.read(full) if len(sealed) == full else b""
        last = not following
        try:
            dst.write(aes.decrypt(_nonce(prefix, index), sealed, _aad(header, index, last)))
        except InvalidTag:
            raise Tampered(f"chunk {index} does not verify: the file was changed") from None
        if last:
            return
        sealed, index = following, index + 1


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
