"""spec.checkpoint.durable.encryption (issue 55, item 2): the key from a Secret or a file,
exactly one, never inline."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.errors import UserInputError
from gpufleet.spec import validate_training_job
from tests.support.specs import digits_job


def durable(encryption: Any) -> dict[str, Any]:
    return digits_job("enc", checkpoint={"durable": {"dir": "s3://b/c", "encryption": encryption}})


def errors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(UserInputError) as info:
        validate_training_job(doc)
    return [(e.path, e.message) for e in info.value.errors]


def test_a_key_from_a_secret_or_a_file_is_accepted() -> None:
    secret = validate_training_job(durable({"keySecret": {"name": "ckpt", "key": "key"}}))
    tier = secret.spec.checkpoint.durable
    assert tier is not None and tier.encryption is not None
    assert tier.encryption.key_secret is not None and tier.encryption.key_secret.name == "ckpt"
    in_file = validate_training_job(durable({"keyFile": "/etc/gpufleet/ckpt.key"}))
    assert in_file.spec.checkpoint.durable.encryption.key_file == "/etc/gpufleet/ckpt.key"


WHERE = "spec.checkpoint.durable.encryption"


@pytest.mark.parametrize(
    ("encryption", "path", "said"),
    [
        ({}, WHERE, "set exactly one of keySecret or keyFile"),
        ({"keySecret": {"name": "a", "key": "k"}, "keyFile": "/k"}, WHERE, "exactly one"),
        ({"keyFile": "relative/key"}, f"{WHERE}.keyFile", "should match pattern"),
        ({"key": "c2VjcmV0"}, f"{WHERE}.key", "unknown field"),  # never inline
    ],
)
def test_a_key_source_that_is_not_exactly_one_place_is_refused(
    encryption: dict[str, Any], path: str, said: str
) -> None:
    found = errors(durable(encryption))
    assert any(p == path and said in m for p, m in found), found
