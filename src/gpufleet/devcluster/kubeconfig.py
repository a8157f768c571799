"""``cluster up --kubeconfig PATH``: the local cluster's context merged into a kubeconfig the
user names, as ``kind create cluster --kubeconfig`` does: its cluster, user and context
(named ``gpufleet-local``) replace any of the same name, the others stay, and it becomes the
current context."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from gpufleet.errors import FieldError, UserInputError

SECTIONS = ("clusters", "users", "contexts")


def _read(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError) as exc:
        raise UserInputError([FieldError("--kubeconfig", f"cannot read {path}: {exc}")]) from None
    if loaded is None:
        return {"apiVersion": "v1", "kind": "Config"}
    if not isinstance(loaded, dict) or loaded.get("kind", "Config") != "Config":
        raise UserInputError([FieldError("--kubeconfig", f"{path} is not a kubeconfig")])
    return loaded


def check_merge_target(path: Path) -> None:
    """Refuse (exit 2) before anything starts if ``path`` cannot take the context."""
    _read(path)
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise UserInputError([FieldError("--kubeconfig", f"{path} is not writable")])


def merge_kubeconfig(ours: Path, target: Path) -> Path:
    """Merge the cluster's kubeconfig ``ours`` into ``target`` (created when missing, owner
    only); returns ``target``."""
    source, merged = _read(ours), _read(target)
    for section in SECTIONS:
        names = {entry["name"] for entry in source.get(section, [])}
        kept = [e for e in merged.get(section) or [] if e.get("name") not in names]
        merged[section] = kept + list(source.get(section, []))
    merged["current-context"] = source["current-context"]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(yaml.safe_dump(merged, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(target)
    return target
