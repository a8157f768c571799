"""``spec.checkpoint``: where and how often a job checkpoints, on one tier or two.

The tiers' shape: ``dir`` stays where the loop saves (the fast tier: node-local NVMe, an
emptyDir, tmpfs), and ``durable`` names the one place its checkpoints are copied to in the
background (a PVC path or ``s3://``), with its own ``keep``. Not a list of tiers: a job has one
fast and at most one durable tier (a backup tier beyond it is the platform's mirror job, from
the durable tier, not the job's business), and every spec written before tiers keeps its meaning.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from pydantic import Field

from gpufleet.runtime.context import CHECKPOINT_DEFAULTS, CheckpointSettings
from gpufleet.spec.env import KeyRef
from gpufleet.spec.validation import INT32_MAX, CrossFieldModel, Problem, SpecModel


class Encryption(CrossFieldModel):
    """The durable tier's copies encrypted with AES-256-GCM; the key from one of two sources.

    Never from the spec or a command line (gpufleet.runtime.sealed)."""

    key_secret: KeyRef | None = Field(
        default=None,
        description=(
            "The key: a key of a Secret (32 bytes, raw or in base64), mounted read-only into "
            "the worker pods as a file (never an environment variable). gpufleet run reads "
            ".gpufleet/secrets/<name>/<key>."
        ),
    )
    key_file: str | None = Field(
        default=None,
        min_length=2,
        pattern=r"^/",
        description="The key: an absolute path to a file holding it (a mounted Secret's).",
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        if sum(data.get(k) is not None for k in ("keySecret", "keyFile")) != 1:
            return [((), "set exactly one of keySecret or keyFile")]
        return []

    def key_path(self, secrets_root: str) -> str:
        """The key's file: keyFile, or the Secret's key where a Secret is laid out as mounted
        under ``secrets_root`` (``<root>/<name>/<key>``: the pod's mount, the local folder)."""
        if self.key_file is not None:
            return self.key_file
        assert self.key_secret is not None  # exactly one: cross_field_problems
        return posixpath.join(secrets_root, self.key_secret.name, self.key_secret.key)


class DurableTier(SpecModel):
    """The durable tier: checkpoints uploaded there in the background, each file verified."""

    dir: str = Field(
        min_length=1,
        description=(
            "Directory (a PVC's mount) or fsspec URI (s3://bucket/prefix) the node's uploader "
            "copies each committed checkpoint of spec.checkpoint.dir to, file by file, each "
            "verified by SHA-256, its marker last. A resume takes the newest checkpoint that "
            "verifies on either tier, the fast copy first."
        ),
    )
    keep: int = Field(
        default=CHECKPOINT_DEFAULTS.durable_keep,
        ge=1,
        le=INT32_MAX,
        description="Complete checkpoints to keep on the durable tier (newest).",
    )
    encryption: Encryption | None = Field(
        default=None,
        description=(
            "Encrypt each file on the durable tier (AES-256-GCM) before it leaves the node; "
            "its marker records the key's id, never the key. A resume decrypts and verifies; "
            "a tampered copy is refused like a corrupt one."
        ),
    )


class Checkpoint(CrossFieldModel):
    """Where and how often the runtime checkpoints (torch.distributed.checkpoint)."""

    dir: str | None = Field(
        default=None,
        description=(
            "Directory or fsspec URI (s3://...) the training loop saves to: with durable, the "
            "fast tier (a node-local path). Default: <run dir>/checkpoints; on Kubernetes "
            "required unless durable is set, which makes the pod's own run directory (an "
            "emptyDir) the fast tier."
        ),
    )
    every_steps: int = Field(
        default=CHECKPOINT_DEFAULTS.every_steps,
        ge=1,
        le=INT32_MAX,
        description="Checkpoint every N steps.",
    )
    keep: int = Field(
        default=CHECKPOINT_DEFAULTS.keep,
        ge=1,
        le=INT32_MAX,
        description="Complete checkpoints to keep (newest).",
    )
    async_save: bool = Field(
        default=CHECKPOINT_DEFAULTS.async_save,
        alias="async",
        description="Write in the background after staging to CPU memory.",
    )
    durable: DurableTier | None = Field(
        default=None,
        description=(
            "A durable tier beside dir (the fast tier): the loop blocks only for the fast "
            "save; a lost node or a corrupt fast copy resumes from the durable one."
        ),
    )

    @classmethod
    def cross_field_problems(cls, data: dict[str, Any]) -> list[Problem]:
        durable = data.get("durable")
        target = durable.get("dir") if isinstance(durable, dict) else None
        fast = data.get("dir")
        if not isinstance(target, str) or not target:
            return []
        if isinstance(fast, str) and "://" in fast and not fast.startswith("file://"):
            return [(("dir",), f"is {fast}, an object store: with spec.checkpoint.durable, dir "
                     "is the fast tier the loop waits for, a local path (node-local NVMe, an "
                     "emptyDir); put the object store in durable.dir")]  # fmt: skip
        if isinstance(fast, str) and _overlap(fast, target):
            return [(("durable", "dir"), f"is {target}, which overlaps spec.checkpoint.dir "
                     f"{fast}: the durable tier must be another place")]  # fmt: skip
        return []

    def settings(self, run_dir: Path, secrets_root: str) -> CheckpointSettings:
        """These fields as the runtime's settings for a job whose run directory is ``run_dir``,
        the directory resolved (``dir``, else <run_dir>/checkpoints) so every worker agrees,
        and a Secret's key found under ``secrets_root`` (Encryption.key_path)."""
        encryption = self.durable.encryption if self.durable else None
        return CheckpointSettings(
            dir=CheckpointSettings(dir=self.dir).root(run_dir),
            every_steps=self.every_steps,
            keep=self.keep,
            async_save=self.async_save,
            durable=self.durable.dir if self.durable else None,
            durable_keep=self.durable.keep if self.durable else CHECKPOINT_DEFAULTS.durable_keep,
            key_file=encryption.key_path(secrets_root) if encryption else None,
        )


def _overlap(a: str, b: str) -> bool:
    """Whether two local paths (or two URIs) are one place or one holds the other."""
    if ("://" in a) != ("://" in b):
        return False
    x, y = (posixpath.normpath(p.removeprefix("file://")).rstrip("/") + "/" for p in (a, b))
    return x.startswith(y) or y.startswith(x)
