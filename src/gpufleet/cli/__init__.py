"""The ``gpufleet`` command line: one thin module per verb group."""
