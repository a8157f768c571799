# syntax=docker/dockerfile:1
# A stand-in for a team's own PyTorch image, on which the real-node test adds gpufleet the way
# docs/images.md "Your own PyTorch image" says (examples/own-image/Dockerfile): Debian's Python
# in a venv on PATH, numpy, and torch at gpufleet's floor (pyproject.toml) from PyPI, not the
# pinned build of gpufleet's own image; no gpufleet and no user of UID 1000.
# scripts/build-image.sh own builds it on localhost/gpufleet-base:bookworm; torch's wheel on
# PyPI is a CUDA build (~4.5 GB installed with its CUDA libraries) and runs on the CPU.
ARG BASE=localhost/gpufleet-base:bookworm
FROM ${BASE}
ARG TORCH
ARG PIP_CERT
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_PROGRESS_BAR=off
ARG PIP_ROOT_USER_ACTION=ignore
RUN test -n "$TORCH" \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir "torch==$TORCH" numpy
ENV PATH=/opt/venv/bin:$PATH
CMD ["python"]
