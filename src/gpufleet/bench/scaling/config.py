"""What one ``gpufleet bench scaling`` run is asked: the one home of its defaults, read by the
CLI's options and by the worker's own arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.errors import FieldError, UserInputError

MODES = {"both": ("strong", "weak"), "strong": ("strong",), "weak": ("weak",)}


def _bad(option: str, message: str) -> UserInputError:
    return UserInputError([FieldError(option, message)])


def world_sizes(text: str) -> tuple[int, ...]:
    """``1,2,4`` as sorted world sizes; they must include 1 and stay within 1..1024."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise _bad(
            "--workers", f"must be comma-separated numbers like 1,2,4, got {text!r}"
        ) from None
    if not sizes or sizes[0] != 1 or sizes[-1] > 1024:
        raise _bad(
            "--workers",
            "must include 1 (efficiency is relative to one worker) and "
            f"stay within 1..1024, got {text!r}",
        )
    return tuple(sizes)


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """Which world sizes and modes to measure, and the model and steps each point trains."""

    workers: tuple[int, ...] = (1, 2)
    mode: str = "both"  # a key of MODES
    batch: int = 256  # strong: the global batch; weak: the batch per worker
    steps: int = 20  # timed steps per world size and kind
    per_node: int = 0  # 0: all on one node; with a spec, its procsPerNode
    quick: bool = False
    outdir: Path = Path("bench-results/scaling")
    warmup: int = 4
    input_size: int = 256  # the synthetic MLP: 3.4 M parameters
    hidden_size: int = 1024
    layers: int = 4
    quick_steps: int = 3
    quick_warmup: int = 1
    quick_model: tuple[int, int, int] = (64, 256, 2)  # input size, hidden size, layers

    @classmethod
    def parse(
        cls,
        *,
        workers: str,
        mode: str,
        batch: int,
        steps: int,
        per_node: int,
        quick: bool,
        outdir: Path,
    ) -> ScalingConfig:
        """The config of the CLI's options (world sizes as text); UserInputError naming the
        first option that is wrong."""
        sizes = world_sizes(workers)
        if mode not in MODES:
            raise _bad("--mode", f"must be strong, weak or both, got {mode!r}")
        if batch < 1 or steps < 1 or per_node < 0:
            raise _bad(
                "--batch" if batch < 1 else "--steps" if steps < 1 else "--per-node",
                "must be at least 1" if per_node >= 0 else "must be 0 or more",
            )
        for n in sizes:
            if "strong" in MODES[mode] and batch % n:
                raise _bad(
                    "--batch",
                    f"strong scaling splits the global batch {batch} over "
                    f"{n} workers: use a batch divisible by {max(sizes)}",
                )
        return cls(
            workers=sizes,
            mode=mode,
            batch=batch,
            steps=steps,
            per_node=per_node,
            quick=quick,
            outdir=outdir,
        )

    def worker_args(self) -> list[str]:
        """The worker's options every point shares (its mode and --fit are the plan's)."""
        model = self.quick_model if self.quick else None
        sizes = (
            [
                "--input-size",
                str(model[0]),
                "--hidden-size",
                str(model[1]),
                "--layers",
                str(model[2]),
            ]
            if model
            else []
        )
        return [
            "--batch",
            str(self.batch),
            "--steps",
            str(self.quick_steps if self.quick else self.steps),
            "--warmup",
            str(self.quick_warmup if self.quick else self.warmup),
            *sizes,
        ]
