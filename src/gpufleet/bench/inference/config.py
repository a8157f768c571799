"""What ``gpufleet bench inference`` is asked: LoadGen's own BenchConfig, the one home of its
defaults (gpufleet.serve.loadgen.settings), under this benchmark's name."""

from __future__ import annotations

from gpufleet.serve.loadgen.settings import SCENARIOS, BenchConfig

InferenceConfig = BenchConfig
DEFAULTS = BenchConfig(url="", model="")  # what the CLI's options show

__all__ = ["DEFAULTS", "SCENARIOS", "InferenceConfig"]
