"""``python -m gpufleet.bench.collectives``: the worker (gpufleet.bench.collectives.worker)."""

import sys

from gpufleet.bench.collectives.worker import main

sys.exit(main())
