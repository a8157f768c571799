"""Spec -> Kubernetes objects (pure functions), and checks on what they produce.

Work in progress for the Kubernetes issue: so far the Pod Security "restricted" checker that
every renderer's and the chart's pods must pass.
"""

from gpufleet.render.podsecurity import check_restricted, pod_specs_in

__all__ = ["check_restricted", "pod_specs_in"]
