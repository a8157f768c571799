"""Secrets by reference: env entries with secretKeyRef/configMapKeyRef and envFrom, rendered as
Kubernetes does, resolved locally from the environment or a file, never shown in plain text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.errors import UserInputError
from gpufleet.launch.secrets import ENV_OBJECTS_DIR, resolve_env
from gpufleet.render import TARGETS, render_spec
from gpufleet.spec import validate_training_job
from tests.support.specs import cluster_job, digits_job

REF = {"secretKeyRef": {"name": "hf", "key": "token"}}
CONFIG = {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": True}}


def containers(obj: Any) -> list[dict[str, Any]]:
    """Every container (or TrainJob trainer) of a rendered object: dicts with an image."""
    found = []
    if isinstance(obj, dict):
        if "image" in obj and ("env" in obj or "command" in obj):
            found.append(obj)
        for value in obj.values():
            found += containers(value)
    elif isinstance(obj, list):
        for item in obj:
            found += containers(item)
    return found


@pytest.mark.parametrize("target", list(TARGETS))
def test_references_render_as_value_from_on_every_target(target: str) -> None:
    job = validate_training_job(
        cluster_job(target=target, env={"HF_TOKEN": REF, "MODE": CONFIG, "A": "1"})
    )
    objects = render_spec(job, target)
    envs = [c["env"] for obj in objects for c in containers(obj) if c.get("env")]
    assert envs, target
    for env in envs:
        by_name = {e["name"]: e for e in env}
        assert by_name["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": REF}
        want_config = {"configMapKeyRef": {"name": "settings", "key": "mode", "optional": True}}
        assert by_name["MODE"] == {"name": "MODE", "valueFrom": want_config}
        assert by_name["A"] == {"name": "A", "value": "1"}
    if target == "mpijob":  # ssh-started ranks get the container's env only through -x
        command = " ".join(objects[0]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
                           ["containers"][0]["command"])  # fmt: skip
        assert "-x HF_TOKEN" in command and "-x MODE" in command


@pytest.mark.parametrize("target", list(TARGETS))
def test_env_from_renders_or_is_refused_with_the_way_around(target: str) -> None:
    env_from = [
        {"secretRef": {"name": "s3-creds"}},
        {"configMapRef": {"name": "c"}, "prefix": "C_"},
    ]
    job = validate_training_job(cluster_job(target=target, envFrom=env_from))
    if target in ("mpijob", "trainjob"):
        with pytest.raises(UserInputError) as info:
            render_spec(job, target)
        (error,) = info.value.errors
        assert error.path == "spec.envFrom" and "name each variable under spec.env" in error.message
        return
    objects = render_spec(job, target)
    got = [c["envFrom"] for obj in objects for c in containers(obj) if "envFrom" in c]
    assert got and all(e == env_from for e in got), got


@pytest.mark.parametrize(
    ("env", "path", "want"),
    [
        ({"X": 1}, "spec.env.X", "must be a string, or {secretKeyRef"),
        ({"X": None}, "spec.env.X", "must be a string, or {secretKeyRef"),
        ({"X": {}}, "spec.env.X", "set exactly one of secretKeyRef or configMapKeyRef"),
        ({"X": {**REF, **CONFIG}}, "spec.env.X", "set exactly one"),
        ({"X": {"secretKeyRef": {"name": "hf"}}}, "spec.env.X.secretKeyRef.key", "required"),
        ({"X": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}, "spec.env.X.secretKeyRef.name",
         "DNS subdomain"),
        ({"X": {"secretRef": {"name": "a"}}}, "spec.env.X.secretRef", "unknown field"),
    ],
)  # fmt: skip
def test_bad_references_are_field_errors(env: dict[str, Any], path: str, want: str) -> None:
    with pytest.raises(UserInputError) as info:
        validate_training_job(digits_job(env=env))
    errors = {e.path: e.message for e in info.value.errors}
    assert want in errors.get(path, ""), errors


def test_credentials_in_plain_text_are_warned_about() -> None:
    plain = {"HF_TOKEN": "hf_abc", "AWS_SECRET_ACCESS_KEY": "x", "DB_PASSWORD": "p",
             "OPENAI_API_KEY": "k", "LR": "0.1", "EMPTY_TOKEN": ""}  # fmt: skip
    job = validate_training_job(digits_job(env={**plain, "GH_TOKEN": REF}))
    warned = sorted(w.split()[1] for w in job.spec.env_warnings())
    assert warned == ["spec.env.AWS_SECRET_ACCESS_KEY", "spec.env.DB_PASSWORD",
                      "spec.env.HF_TOKEN", "spec.env.OPENAI_API_KEY"]  # fmt: skip
    assert all("secretKeyRef" in w and "hf_abc" not in w for w in job.spec.env_warnings())


def objects_dir(root: Path, files: dict[str, str]) -> dict[str, str]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {ENV_OBJECTS_DIR: str(root)}


def test_local_resolution_environment_first_then_files(tmp_path: Path) -> None:
    job = validate_training_job(digits_job(
        env={"HF_TOKEN": REF, "MODE": CONFIG, "GONE": {"secretKeyRef": {"name": "x", "key": "y",
             "optional": True}}},
        envFrom=[{"secretRef": {"name": "s3"}, "prefix": "S3_"}, {"configMapRef": {"name": "no",
                 "optional": True}}]))  # fmt: skip
    files = {"secrets/hf/token": "from-file\n", "configmaps/settings/mode": "fast",
             "secrets/s3/KEY": "k", "secrets/s3/bad-name": "z"}  # fmt: skip
    environ = objects_dir(tmp_path, files)
    # The file's exact bytes, as a mounted Secret; invalid variable names skipped, as envFrom does.
    assert resolve_env(job, environ) == {"HF_TOKEN": "from-file\n", "MODE": "fast", "S3_KEY": "k"}
    environ["HF_TOKEN"] = "from-env"
    assert resolve_env(job, environ)["HF_TOKEN"] == "from-env"


def test_a_missing_reference_names_the_field_and_both_places(tmp_path: Path) -> None:
    job = validate_training_job(digits_job(env={"HF_TOKEN": REF},
                                           envFrom=[{"secretRef": {"name": "s3"}}]))  # fmt: skip
    with pytest.raises(UserInputError) as info:
        resolve_env(job, {ENV_OBJECTS_DIR: str(tmp_path)})
    errors = {e.path: e.message for e in info.value.errors}
    assert errors == {
        "spec.env.HF_TOKEN.secretKeyRef": f"hf/token: export HF_TOKEN, or write it to "
        f"{tmp_path}/secrets/hf/token",
        "spec.envFrom[0].secretRef": f"s3: no directory {tmp_path}/secrets/s3 (one file per key)",
    }


def test_a_rendered_job_never_holds_a_resolvable_value(tmp_path: Path) -> None:
    """The value a local run would read is nowhere in the rendered objects."""
    objects_dir(tmp_path, {"secrets/hf/token": "s3cr3t-value"})
    for target in TARGETS:
        job = validate_training_job(cluster_job(target=target, env={"HF_TOKEN": REF}))
        assert "s3cr3t-value" not in yaml.safe_dump_all(render_spec(job, target))
