"""Benchmarks, one package each: ``collectives``, ``scaling``, ``training``, ``coordinated``
(run as gpufleet jobs: a worker module started by the same launcher as training, so it runs
here on loopback and, rendered from the same spec, across a cluster's nodes) and
``inference`` (LoadGen from this process). Each job-run package holds ``config`` (the one home
of its defaults), a pure ``plan(config, spec)``, ``worker``, ``report`` and ``run``. Shared:
``jobs`` (pure job building, publishing), ``runner`` (running here, writing results),
``collect`` (reading a cluster run back), ``system`` (the machine description) and
``mlperf`` (the compliance ruleset of bench training)."""
