"""``python -m gpufleet.frameworks.tf``: the TensorFlow worker of the built-in workloads."""

import sys

from gpufleet.frameworks.tf.train import main

sys.exit(main())
