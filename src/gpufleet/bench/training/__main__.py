"""``python -m gpufleet.bench.training``: the worker (gpufleet.bench.training.worker)."""

import sys

from gpufleet.bench.training.worker import main

sys.exit(main())
