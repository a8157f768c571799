"""spec.checkpoint.durable.encryption (issue 55, item 2): the key from a Secret or a file,
exactly one, never inline; where a pod and `gpufleet run` read it from."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import UserInputError
from gpufleet.launch.secrets import ENV_OBJECTS_DIR, check_checkpoint_key
from gpufleet.launch.worker import job_context
from gpufleet.render import render
from gpufleet.runtime.context import ENV_CHECKPOINT_KEY_FILE
from gpufleet.spec import validate_training_job
from tests.support.k8s_schemas import validate_strictly
from tests.support.specs import cluster_job, digits_job, pod_templates


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
    in_file = validate_training_job(durable({"keyFile": "/etc/gpufleet/ckpt.key"})).spec
    assert in_file.checkpoint.durable and in_file.checkpoint.durable.encryption
    assert in_file.checkpoint.durable.encryption.key_file == "/etc/gpufleet/ckpt.key"


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


# ---- where the key is read from ------------------------------------------------------------
def test_a_pod_reads_the_key_from_its_secret_mounted_read_only_never_from_the_env() -> None:
    """Every target's worker pod mounts the Secret's one key where the worker environment's
    GPUFLEET_CHECKPOINT_KEY_FILE names it; the rendered objects are valid and hold no key."""
    secret = {"keySecret": {"name": "ckpt-key", "key": "aes"}}
    checkpoint = {"dir": "/ckpt/run", "durable": {"dir": "s3://b/c", "encryption": secret}}
    for target in ("job", "jobset", "pytorchjob"):
        objs = render(validate_training_job(cluster_job(target, checkpoint=checkpoint)), target)
        for obj in objs:
            validate_strictly(obj)
        templates = [t for o in objs for t in pod_templates(o)]
        assert templates, target
        for template in templates:
            spec = template["spec"]
            (volume,) = [v for v in spec["volumes"] if v.get("secret")]
            assert volume["secret"] == {"secretName": "ckpt-key", "defaultMode": 0o440,
                                        "items": [{"key": "aes", "path": "aes"}]}  # fmt: skip
            (container,) = spec["containers"]
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
            assert mount["readOnly"] is True
            env = {e["name"]: e for e in container["env"]}
            assert env[ENV_CHECKPOINT_KEY_FILE]["value"] == f"{mount['mountPath']}/aes"
            assert not any("valueFrom" in e for e in container["env"])


def test_gpufleet_run_refuses_a_key_it_cannot_read_with_the_field_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locally a Secret's key is <objects dir>/secrets/<name>/<key>: missing, or not 32 bytes
    raw or in base64, it is one error naming the field, before anything starts."""
    monkeypatch.setenv(ENV_OBJECTS_DIR, str(tmp_path))
    job = validate_training_job(durable({"keySecret": {"name": "ckpt-key", "key": "aes"}}))
    with pytest.raises(UserInputError) as info:
        check_checkpoint_key(job)
    (error,) = info.value.errors
    assert error.path == f"{WHERE}.keySecret"
    assert f"cannot read {tmp_path}/secrets/ckpt-key/aes" in error.message
    key = tmp_path / "secrets" / "ckpt-key" / "aes"
    key.parent.mkdir(parents=True)
    key.write_text("too short")
    with pytest.raises(UserInputError) as info:
        check_checkpoint_key(job)
    assert "not a 32-byte key" in str(info.value)
    key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")  # as a Secret's stringData
    check_checkpoint_key(job)
    in_file = validate_training_job(durable({"keyFile": str(key)}))
    check_checkpoint_key(in_file)
    context = job_context(in_file, tmp_path / "run")
    assert context.to_env()[ENV_CHECKPOINT_KEY_FILE] == str(key)
    assert key.read_text().strip() not in str(context.to_env())
