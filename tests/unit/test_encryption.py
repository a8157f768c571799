"""Checkpoint files encrypted for the durable tier (gpufleet.runtime.encryption, issue 55 item
2): what comes out is what went in, for every size around a chunk's; any change to the file
(a bit, a chunk moved or dropped, the end cut off) is Tampered; another key is WrongKey naming
both ids; the file holds no plaintext."""

from __future__ import annotations

import base64
import io
import os

import pytest

from gpufleet.runtime import encryption
from gpufleet.runtime.encryption import (
    EncryptionError,
    Tampered,
    WrongKey,
    decrypt,
    encrypt,
    file_key_id,
    key_id,
    load_key,
    mac,
)

KEY = bytes(range(32))
SMALL = 64  # a chunk's size in these tests, so that files of a few chunks stay small


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encryption, "CHUNK", SMALL)


def sealed(data: bytes, key: bytes = KEY) -> bytes:
    out = io.BytesIO()
    encrypt(io.BytesIO(data), out, key)
    return out.getvalue()


def opened(blob: bytes, key: bytes = KEY) -> bytes:
    out = io.BytesIO()
    decrypt(io.BytesIO(blob), out, key)
    return out.getvalue()


@pytest.mark.parametrize("size", [0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL, 3 * SMALL + 5])
def test_what_is_decrypted_is_what_was_encrypted(size: int) -> None:
    data = os.urandom(size)
    blob = sealed(data)
    assert opened(blob) == data
    assert file_key_id(io.BytesIO(blob)) == key_id(KEY)
    assert sealed(data) != blob  # a new nonce prefix each time


def test_the_file_holds_no_plaintext() -> None:
    data = b"weights:" + b"\x42" * 200
    assert b"weights:" not in sealed(data) and b"\x42" * 16 not in sealed(data)


def chunks(blob: bytes) -> tuple[bytes, list[bytes]]:
    head, rest = blob[: encryption.HEADER_BYTES], blob[encryption.HEADER_BYTES :]
    full = SMALL + encryption.TAG_BYTES
    return head, [rest[i : i + full] for i in range(0, len(rest), full)]


def test_any_change_is_tampered() -> None:
    blob = sealed(os.urandom(3 * SMALL + 5))
    head, parts = chunks(blob)
    changed = {
        "a bit of the data": blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:],
        "the nonce prefix": head[:-1] + bytes([head[-1] ^ 1]) + b"".join(parts),
        "two chunks swapped": head + parts[1] + parts[0] + b"".join(parts[2:]),
        "a chunk dropped": head + parts[0] + b"".join(parts[2:]),
        "a chunk repeated": head + parts[0] + b"".join(parts),
        "the last chunk cut off": head + b"".join(parts[:-1]),
    }
    for what, blob_changed in changed.items():
        with pytest.raises(Tampered):
            opened(blob_changed)
        assert blob_changed != blob, what


def test_a_file_cut_where_a_chunk_ends_is_tampered() -> None:
    head, parts = chunks(sealed(os.urandom(2 * SMALL)))  # two full chunks and an empty last
    assert len(parts) == 3 and len(parts[-1]) == encryption.TAG_BYTES
    with pytest.raises(Tampered):
        opened(head + b"".join(parts[:-1]))


def test_another_key_is_named_and_nothing_is_decrypted() -> None:
    other = bytes(32)
    out = io.BytesIO()
    with pytest.raises(
        WrongKey, match=f"key {key_id(KEY)}, not with the key given \\({key_id(other)}\\)"
    ):
        decrypt(io.BytesIO(sealed(b"x" * 100)), out, other)
    assert out.getvalue() == b""
    with pytest.raises(EncryptionError, match="not a checkpoint file encrypted by gpufleet"):
        opened(b"plain text, never encrypted")
    with pytest.raises(ValueError, match="32 bytes, this one 16"):
        sealed(b"x", bytes(16))


def test_a_key_is_32_raw_bytes_or_their_base64() -> None:
    assert load_key(lambda: KEY, "f") == KEY
    assert load_key(lambda: base64.b64encode(KEY) + b"\n", "f") == KEY
    for bad in (b"short", base64.b64encode(bytes(16)), b"not base64 at all!!" * 3):
        with pytest.raises(ValueError, match="Secret ckpt/key: not a 32-byte key"):
            load_key(lambda bad=bad: bad, "Secret ckpt/key")
    assert len(key_id(KEY)) == 16 and key_id(KEY) != key_id(bytes(32))


def test_a_file_opens_only_in_the_place_it_was_sealed_for() -> None:
    """The context (a file's step directory and name) is in every chunk's associated data: a
    valid file moved to another step or name does not open."""
    data = os.urandom(3 * SMALL)
    out = io.BytesIO()
    encrypt(io.BytesIO(data), out, KEY, b"step_1/__0_0.distcp")
    for elsewhere in (b"step_2/__0_0.distcp", b"step_1/__1_0.distcp", b""):
        with pytest.raises(Tampered):
            decrypt(io.BytesIO(out.getvalue()), io.BytesIO(), KEY, elsewhere)
    back = io.BytesIO()
    decrypt(io.BytesIO(out.getvalue()), back, KEY, b"step_1/__0_0.distcp")
    assert back.getvalue() == data


def test_a_markers_mac_needs_the_key_and_the_very_bytes() -> None:
    other = bytes(reversed(KEY))
    assert mac(KEY, b"marker") == mac(KEY, b"marker")
    assert mac(KEY, b"marker") != mac(KEY, b"marker ")
    assert mac(other, b"marker") != mac(KEY, b"marker")
    assert KEY.hex() not in mac(KEY, b"marker")
