"""Secret and ConfigMap references of a job's env, resolved for `gpufleet run`.

On Kubernetes the kubelet resolves ``valueFrom`` and ``envFrom``. Here there is no API server,
so a reference is read from (1) the variable of the same name in the environment of
``gpufleet run`` (``export HF_TOKEN=...`` as for any local tool; env entries only), else (2) a
file laid out as a mounted Secret or ConfigMap: ``<dir>/secrets/<name>/<key>`` or
``<dir>/configmaps/<name>/<key>``, where ``<dir>`` is ``$GPUFLEET_OBJECTS_DIR`` or ``.gpufleet``.
A value is the file's exact bytes, as in a pod. The values reach the workers' environment
only: never the spec, the run directory or a temporary file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gpufleet.errors import FieldError, UserInputError
from gpufleet.spec import ENV_NAME, TrainingJob

ENV_OBJECTS_DIR = "GPUFLEET_OBJECTS_DIR"
_FOLDER = {"secretKeyRef": "secrets", "configMapKeyRef": "configmaps",
           "secretRef": "secrets", "configMapRef": "configmaps"}  # fmt: skip


def objects_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where local Secrets and ConfigMaps are: $GPUFLEET_OBJECTS_DIR, else ./.gpufleet."""
    return Path((environ if environ is not None else os.environ).get(ENV_OBJECTS_DIR, ".gpufleet"))


def secrets_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where local Secrets are, absolute (workers may run elsewhere): ``<objects dir>/secrets``
    (a checkpoint key's Secret: spec.checkpoint.durable.encryption.keySecret)."""
    return str((objects_dir(environ) / _FOLDER["secretKeyRef"]).resolve())


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError([FieldError(str(path), f"cannot read: {exc}")]) from None


def resolve_env(job: TrainingJob, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of every env reference and envFrom source of ``job``; UserInputError with
    every missing, non-optional one (field path, and where it was looked for)."""
    environ = os.environ if environ is None else environ
    root = objects_dir(environ)
    values: dict[str, str] = {}
    errors: list[FieldError] = []
    for i, source in enumerate(job.spec.env_from):
        kind, ref = source.ref
        folder = root / _FOLDER[kind] / ref.name
        if not folder.is_dir():
            if not ref.optional:
                errors.append(FieldError(f"spec.envFrom[{i}].{kind}", (
                    f"{ref.name}: no directory {folder} (one file per key)")))  # fmt: skip
            continue
        for file in sorted(folder.iterdir()):
            name = (source.prefix or "") + file.name
            if file.is_file() and ENV_NAME.match(name):  # Kubernetes skips invalid names too
                values[name] = _read(file) or ""
    for name, env_source in job.spec.env_refs.items():
        kind, key_ref = env_source.ref
        if name in environ:
            values[name] = environ[name]
            continue
        path = root / _FOLDER[kind] / key_ref.name / key_ref.key
        found = _read(path)
        if found is not None:
            values[name] = found
        elif not key_ref.optional:
            where = f"export {name}, or write it to {path}"
            errors.append(
                FieldError(f"spec.env.{name}.{kind}", f"{key_ref.name}/{key_ref.key}: {where}")
            )
    if errors:
        raise UserInputError(errors)
    return values


def check_checkpoint_key(job: TrainingJob) -> None:
    """Fail before starting anything when the durable tier's key (spec.checkpoint.durable
    .encryption) cannot be read here, or is not a key: UserInputError with its field path."""
    durable = job.spec.checkpoint.durable
    encryption = durable.encryption if durable else None
    if encryption is None:
        return
    from gpufleet.extras import require
    from gpufleet.runtime.encryption import load_key

    require("encryption", "cryptography", what="spec.checkpoint.durable.encryption")
    field = "keyFile" if encryption.key_file else "keySecret"
    path = Path(encryption.key_path(secrets_dir()))
    try:
        load_key(path.read_bytes, str(path))
    except (OSError, ValueError) as exc:
        reason = f"cannot read {path}: {exc.strerror}" if isinstance(exc, OSError) else str(exc)
        where = f"spec.checkpoint.durable.encryption.{field}"
        raise UserInputError([FieldError(where, reason)]) from None
