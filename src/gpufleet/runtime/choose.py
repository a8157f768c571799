"""Which checkpoint a resume loads: the newest step with a copy that verifies, on the fast tier
or the durable one (the fast copy first), rank 0's decision for all ranks
(gpufleet.runtime.checkpoint.Checkpointer.latest).

A job on several nodes may have a fast tier on each node's own disk: there each node's copy of
a checkpoint holds only the files its ranks wrote, and no rank can load it. Before rank 0
decides, every rank says which fast checkpoints its own view lacks files of (``incomplete``);
those are skipped, not set aside (nothing is wrong with them), and the durable copy is used.

Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.errors import CheckpointError, CheckpointKeyError, NoUsableCheckpointError
from gpufleet.runtime import integrity
from gpufleet.runtime.sealed import sealed_files
from gpufleet.runtime.tier import CheckpointRef, Tier

# Opens a sealed (encrypted) copy for loading: (its tier, the ref, its marker) -> the files
# that do not verify (gpufleet.runtime.sealed.open_checkpoint).
Opener = Callable[[Tier, CheckpointRef, dict[str, Any]], list[integrity.Mismatch]]


def newest_usable(
    fast: Tier,
    durable: Tier | None,
    identity: dict[str, str],
    log: Callable[[str], None],
    incomplete: frozenset[str] = frozenset(),
    opener: Opener | None = None,
) -> CheckpointRef | None:
    """The newest step with a copy that verifies, the fast tier's copy tried first; corrupt
    copies set aside on the way. ``incomplete``: fast directories some node cannot read whole.
    A durable copy is also given to ``opener``, which opens a sealed one (or refuses a plaintext
    one, for a job with a key): one that does not open is corrupt too. Raises
    NoUsableCheckpointError when checkpoints exist but none can be loaded."""
    tiers = [t for t in (fast, durable) if t is not None]
    copies: dict[int, list[tuple[Tier, CheckpointRef]]] = {}
    for tier in tiers:
        for ref in listed(tier, fast, log):
            copies.setdefault(ref.step, []).append((tier, ref))
    set_aside: list[str] = []
    split: list[int] = []
    for step in sorted(copies, reverse=True):
        for tier, ref in copies[step]:
            if tier is fast and ref.path.rstrip("/").rsplit("/", 1)[-1] in incomplete:
                split.append(step)
                continue
            marker, problems = tier.check(ref)
            sealed = sealed_files(marker) is not None
            if not problems and (sealed or (opener is not None and tier is not fast)):
                opened = _opened(opener, tier, ref, marker)  # its HMAC before its identity
                problems = opened if opened or sealed else problems  # None: still unverified
            if problems is None:
                log(f"gpufleet: checkpoint step {step} ({ref.path}) predates checksums: "
                    "loading it unverified")  # fmt: skip
            elif problems:
                aside = tier.set_aside(ref)
                set_aside.append(aside)
                log(f"gpufleet: WARNING checkpoint step {step} is corrupt ("
                    f"{'; '.join(map(str, problems))}); set aside as {aside}, trying the next "
                    "copy")  # fmt: skip
                continue
            integrity.check_identity(identity, marker, root=tier.root, step=step)
            if split:
                steps = ", ".join(map(str, split))
                log(f"gpufleet: the fast tier's checkpoints of step {steps} are split over the "
                    "nodes' own disks: resuming from the durable tier")  # fmt: skip
            return CheckpointRef(step, ref.path, marker.get("world_size"), tier.name, sealed)
    _none_usable(tiers, set_aside, split)
    return None


def _opened(
    opener: Opener | None, tier: Tier, ref: CheckpointRef, marker: dict[str, Any]
) -> list[integrity.Mismatch]:
    if opener is None:
        raise CheckpointKeyError(f"the checkpoint of step {ref.step} ({ref.path}) is encrypted "
                                 "and nothing here can open it")  # fmt: skip
    return opener(tier, ref, marker)


def _none_usable(tiers: list[Tier], set_aside: list[str], split: list[int]) -> None:
    roots = " or ".join(t.root for t in tiers)
    if split:
        raise NoUsableCheckpointError(
            f"no usable checkpoint in {roots}: the fast tier's (step "
            f"{', '.join(map(str, split))}) are split over the nodes' own disks, no node holds "
            "all of one, and no durable copy verifies: a job on several nodes needs a shared "
            "spec.checkpoint.dir or spec.checkpoint.durable"
        )
    if set_aside:
        raise NoUsableCheckpointError(
            f"no usable checkpoint in {roots}: every complete one is corrupt (set aside: "
            f"{', '.join(set_aside)}); run with --fresh to start over from step 0"
        )


def listed(tier: Tier, fast: Tier, log: Callable[[str], None]) -> list[CheckpointRef]:
    """``tier``'s complete checkpoints. An unreachable durable tier is a warning while the fast
    tier has a checkpoint to resume from, and an error (a restart retries) when it has none:
    starting at step 0 could throw the durable tier's progress away."""
    if tier is fast:
        return tier.complete()
    try:
        return tier.complete()
    except Exception as exc:  # the object store's client errors are not all OSErrors
        if not fast.complete():
            raise CheckpointError(
                f"the durable tier {tier.root} is unreachable ({exc}) and the fast tier "
                f"{fast.root} holds no checkpoint: resuming from step 0 could throw the "
                "durable checkpoints away; the job retries"
            ) from None
        log(f"gpufleet: WARNING the durable tier {tier.root} is unreachable ({exc}); resuming "
            "from the fast tier alone")  # fmt: skip
        return []


def wanted(fast: Tier) -> dict[str, dict[str, int]]:
    """Each complete fast checkpoint's directory name and its files' sizes, from its marker
    (what every node checks it can see: ``lacking``)."""
    out: dict[str, dict[str, int]] = {}
    for ref in fast.complete():
        path = fast.fs_path(ref.path)
        try:
            files = integrity.read_marker(fast.fs, path).get("files")
        except (OSError, ValueError):
            continue  # unreadable: rank 0's own check says so
        if isinstance(files, dict):
            sizes = {str(n): int(f.get("size", -1)) for n, f in files.items()}
            out[path.rstrip("/").rsplit("/", 1)[-1]] = sizes
    return out


def lacking(fast: Tier, wanted: dict[str, dict[str, int]]) -> set[str]:
    """The directories of ``wanted`` this process's view of the fast tier lacks a file of (or
    has one of another size)."""
    out = set()
    for name, sizes in wanted.items():
        try:
            infos: list[dict[str, Any]] = fast.fs.ls(fast.join(fast.root_path, name), detail=True)
        except FileNotFoundError:
            out.add(name)
            continue
        have = {i["name"].rstrip("/").rsplit("/", 1)[-1]: int(i["size"]) for i in infos}
        if any(have.get(file) != size for file, size in sizes.items()):
            out.add(name)
    return out
