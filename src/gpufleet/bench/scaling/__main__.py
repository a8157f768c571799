"""``python -m gpufleet.bench.scaling``: the worker (gpufleet.bench.scaling.worker)."""

import sys

from gpufleet.bench.scaling.worker import main

sys.exit(main())
