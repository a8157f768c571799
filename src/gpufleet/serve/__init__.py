"""Inference: Triton model repositories (export), local serving through PyTriton, LoadGen."""
