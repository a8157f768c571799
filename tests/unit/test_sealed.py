"""Opening a sealed checkpoint (gpufleet.runtime.sealed): a marker is trusted only with its
HMAC, and even then names no file outside the directory it is opened into."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import fsspec
import pytest

from gpufleet.errors import CheckpointKeyError
from gpufleet.runtime.encryption import encrypt, key_id
from gpufleet.runtime.sealed import open_checkpoint, sealed_marker

KEY, OTHER = bytes(range(32)), bytes(range(1, 33))


def marker(files: dict[str, dict[str, object]], key: bytes = KEY) -> dict[str, object]:
    part = json.dumps({"key_id": key_id(key), "files": files}).encode()
    fast = json.dumps({"step": 5, "files": files}).encode()
    return dict(json.loads(sealed_marker(fast, [part], key)))


def test_a_marker_naming_a_path_is_refused_even_with_a_valid_hmac(tmp_path: Path) -> None:
    escape = {"../../escaped": {"size": 1, "sha256": "0" * 64}}
    into = tmp_path / "opened" / "step"
    found = open_checkpoint(fsspec.filesystem("file"), str(tmp_path / "d"), marker(escape), KEY,
                            into, "s3://b/d")  # fmt: skip
    assert [p.file for p in found] == ["COMPLETE.json"] and "other names" in str(found[0])
    assert not (tmp_path / "escaped").exists() and not into.exists()


def test_a_marker_rewritten_without_the_key_fails_its_hmac(tmp_path: Path) -> None:
    doc = marker({"__0_0.distcp": {"size": 1, "sha256": "0" * 64}})
    doc["step"] = 6  # any change at all
    found = open_checkpoint(fsspec.filesystem("file"), str(tmp_path), doc, KEY, tmp_path / "o", "u")
    assert "does not verify" in str(found[0])


def test_another_key_is_one_error_naming_both_ids(tmp_path: Path) -> None:
    doc = marker({"__0_0.distcp": {"size": 1, "sha256": "0" * 64}})
    with pytest.raises(CheckpointKeyError) as info:
        open_checkpoint(fsspec.filesystem("file"), str(tmp_path), doc, OTHER, tmp_path / "o", "u")
    assert key_id(KEY) in str(info.value) and key_id(OTHER) in str(info.value)


@pytest.mark.parametrize("broken", [{"encryption": "x"}, {"mac": "\u00e9" * 64}])
def test_a_malformed_encryption_record_is_a_mismatch_not_a_crash(
    tmp_path: Path, broken: dict[str, object]
) -> None:
    """A marker anyone with write access could have shaped: the copy is set aside (a
    Mismatch), never a traceback that would leave the other ranks waiting."""
    doc = marker({"__0_0.distcp": {"size": 1, "sha256": "0" * 64}})
    if "mac" in broken:
        doc["encryption"] = {**doc["encryption"], **broken}  # type: ignore[dict-item]
    else:
        doc.update(broken)
    found = open_checkpoint(fsspec.filesystem("file"), str(tmp_path), doc, KEY, tmp_path / "o", "u")
    assert found and found[0].file == "COMPLETE.json"


def test_an_open_that_fails_midway_leaves_no_plaintext(tmp_path: Path) -> None:
    """The store gone (a file missing) after some files were decrypted: the error goes up
    (the resume retries) and nothing opened so far stays on the node."""
    src = tmp_path / "step_000000005-abcdef"
    src.mkdir()
    data = b"plaintext weights"
    sealed_file = io.BytesIO()
    encrypt(io.BytesIO(data), sealed_file, KEY, f"{src.name}/a.distcp".encode())
    (src / "a.distcp").write_bytes(sealed_file.getvalue())
    digest = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    doc = marker({"a.distcp": digest, "b.distcp": digest})
    into = tmp_path / "opened"
    with pytest.raises(FileNotFoundError):
        open_checkpoint(fsspec.filesystem("file"), str(src), doc, KEY, into, "u")
    assert not into.exists()
