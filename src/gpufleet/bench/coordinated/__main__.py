"""``python -m gpufleet.bench.coordinated``: the worker (gpufleet.bench.coordinated.worker)."""

import sys

from gpufleet.bench.coordinated.worker import main

sys.exit(main())
