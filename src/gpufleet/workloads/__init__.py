"""Built-in workloads: ``digits`` (real data, small CNN), its data without torch
(``digits_data``, also TensorFlow's) and ``synthetic`` (sized for benchmarks). Import from the
modules: importing this package imports no torch, so a TensorFlow worker can read the data."""
