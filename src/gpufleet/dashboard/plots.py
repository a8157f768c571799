"""Curves as inline SVG, drawn on the server with matplotlib: the page needs no JavaScript
charting library, nothing from a CDN, and an air-gapped cluster gets the same page. Each point is
a marker (an SVG ``<use>``) in the curve's group (``<g id="loss-points">``): a test counts them."""

from __future__ import annotations

import io

from gpufleet.dashboard.curves import Curves

LABELS = {"loss": "loss (mean over ranks)", "throughput": "samples/s"}


def svg(curves: Curves, which: str) -> str | None:
    """The ``which`` curve as an ``<svg>`` element; None without points."""
    points = curves.points(which)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display; the SVG backend draws
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 2.4), layout="constrained")
    axes = figure.add_subplot()
    (line,) = axes.plot([s for s, _ in points], [v for _, v in points], marker="o",
                        markersize=3, linewidth=1.2, color="#1f6feb")  # fmt: skip
    line.set_gid(f"{which}-points")  # the <g> of the curve's path and its points
    for step in curves.restarts:
        axes.axvline(step, color="#d1242f", linestyle="--", linewidth=0.8)
    axes.set_xlabel("step")
    axes.set_ylabel(LABELS[which])
    axes.grid(alpha=0.3)
    if curves.steps:
        axes.set_xlim(0, curves.steps)
    out = io.StringIO()
    # Text as <text> (selectable, readable by a test), not as glyph paths; no date in it.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        figure.savefig(out, format="svg", metadata={"Date": None})
    text = out.getvalue()
    return text[text.index("<svg") :]  # without the XML prolog: inline in the page
