"""A job's loss and throughput curves from its ranks' own log lines.

Rank 0 logs ``step 25/300 loss 2.2593 12,947 samples/s`` every ``logEvery`` steps
(gpufleet.runtime.reporting): the same line in a local run's rank logs, in a pod's log (behind
``[rank0]:``) and in the logs kept beside the checkpoints once the pods are gone, so one parser
serves every page, history included. A restart resumes from a checkpoint and logs some steps
again: the later attempt's value stands, and the step it went back to is a restart mark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf)"
LINE = re.compile(rf"\bstep (\d+)/(\d+) loss ({NUMBER}) (\d[\d,]*(?:\.\d+)?) samples/s")


ATTEMPT = "attempt_"  # torchelastic's directory of one try: attempt_<n>


def attempt_number(name: str) -> int:
    """The try number of an ``attempt_<n>`` directory (-1 for another name): they sort by it,
    not as text (attempt_10 after attempt_9)."""
    number = name.removeprefix(ATTEMPT)
    return int(number) if name.startswith(ATTEMPT) and number.isdigit() else -1


@dataclass
class Curves:
    """Points by step (the latest attempt's), and the steps where a restart went back to."""

    loss: dict[int, float] = field(default_factory=dict)
    throughput: dict[int, float] = field(default_factory=dict)
    steps: int | None = None
    restarts: list[int] = field(default_factory=list)

    def add(self, lines: Iterable[str]) -> Curves:
        """Read one attempt's (or one pod's) lines, in order."""
        last = None
        for line in lines:
            match = LINE.search(line)
            if not match:
                continue
            step = int(match.group(1))
            if last is None and self.loss and step <= max(self.loss):
                self.restarts.append(step)
            last = step
            self.steps = int(match.group(2))
            loss = float(match.group(3))
            if math.isfinite(loss):
                self.loss[step] = loss
            self.throughput[step] = float(match.group(4).replace(",", ""))
        return self

    def points(self, which: str) -> list[tuple[int, float]]:
        """``loss`` or ``throughput`` as (step, value), by step."""
        values = self.loss if which == "loss" else self.throughput
        return sorted(values.items())
