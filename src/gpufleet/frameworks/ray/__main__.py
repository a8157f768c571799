"""``python -m gpufleet.frameworks.ray``: the driver of the built-in workloads' Ray jobs."""

import sys

from gpufleet.frameworks.ray.driver import main

sys.exit(main())
