"""The worker shim's guard against the DDP + gloo teardown deadlock at the end of a script."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import torch.distributed as dist

from gpufleet.launch import shim


def test_destroyed_groups_are_released_only_after_the_script(tmp_path: Path) -> None:
    original = dist.destroy_process_group
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    world = weakref.ref(dist.group.WORLD)
    with shim._safe_group_teardown():
        assert dist.destroy_process_group is not original
        dist.destroy_process_group()  # what a plain script calls
        assert not dist.is_initialized()
        gc.collect()
        assert world() is not None  # the shim, not a DDP Reducer, holds the last reference
    gc.collect()
    assert world() is None  # dropped once the script is over
    assert dist.destroy_process_group is original


def test_a_named_group_is_kept_too(tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        with shim._safe_group_teardown():
            side = dist.new_group(backend="gloo")
            ref = weakref.ref(side)
            dist.destroy_process_group(side)
            del side
            gc.collect()
            assert ref() is not None
        gc.collect()
        assert ref() is None
    finally:
        dist.destroy_process_group()
