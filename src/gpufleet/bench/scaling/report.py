"""What ``gpufleet bench scaling`` shows: the table, the plot, the JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.bench.scaling.model import PREDICT_AT, Point


def table(points: list[Point], analysis: dict[str, Any]) -> list[str]:
    """The measured points, their prediction check, and the predictions, as text lines."""
    lines = [
        f"{'mode':<7}{'workers':>8}{'nodes':>6}{'batch':>7}{'samples/s':>11}{'eff':>7}"
        f"{'pred':>7}{'step ms':>9}{'compute':>9}{'data':>7}{'comm':>8}"
    ]
    for p in sorted(points, key=lambda p: (p.mode, p.world)):
        check = next(c for c in analysis["modes"][p.mode]["checks"] if c["world"] == p.world)
        lines.append(
            f"{p.mode:<7}{p.world:>8}{p.nodes:>6}{p.global_batch:>7}{p.samples_per_second:>11.0f}"
            f"{p.efficiency:>7.3f}{check['predicted']:>7.3f}{p.step_seconds * 1e3:>9.1f}"
            f"{p.compute_seconds * 1e3:>9.1f}{p.data_seconds * 1e3:>7.1f}"
            f"{p.communication_seconds * 1e3:>8.1f}"
        )
    link = analysis["link"]
    lines += [
        "",
        f"link here (alpha-beta fit of all-reduce): {link['bandwidth_gbps']:.2f} GB/s "
        f"bus bandwidth, alpha {link['alpha_seconds'] * 1e6:.0f} us",
    ]
    for mode, m in analysis["modes"].items():
        lines += [
            "",
            f"{mode} scaling: predicted efficiency (model error at measured points: "
            f"max {m['max_abs_error']:.3f}; hidden all-reduce fraction "
            f"{m['hidden_fraction']:.2f})",
            f"{'interconnect':<16}" + "".join(f"{p:>8}" for p in PREDICT_AT),
        ]
        for name, effs in m["predicted"].items():
            lines.append(f"{name:<16}" + "".join(f"{effs[str(p)]:>8.3f}" for p in PREDICT_AT))
    return lines


def plot(points: list[Point], analysis: dict[str, Any], path: Path) -> None:
    """Efficiency against workers: measured points and predicted curves, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted(analysis["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    xs = [1, 2, *PREDICT_AT]
    for ax, mode in zip(axes[0], modes, strict=True):
        m = analysis["modes"][mode]
        for name, effs in m["predicted"].items():
            checks = {c["world"]: c["predicted"] for c in m["checks"]} if name == "here" else {}
            ys = [checks.get(x, effs.get(str(x), float("nan"))) for x in xs]
            ax.plot(xs, ys, marker=".", label=f"predicted: {name}")
        mine = [p for p in points if p.mode == mode]
        ax.plot([p.world for p in mine], [p.efficiency for p in mine], "ko", label="measured")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("workers")
        ax.set_ylabel("efficiency")
        ax.set_title(f"{mode} scaling")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def record(
    points: list[Point], allreduce: dict[str, Any] | None, outdir: Path, as_json: bool
) -> int:
    """Analyse the points (efficiency, the predictor and its check), write scaling.json and
    the plot, print the table or the JSON; the exit code."""
    from dataclasses import asdict

    from gpufleet.bench import runner
    from gpufleet.bench.scaling.model import analyze
    from gpufleet.bench.system import describe

    analysis = analyze(points, allreduce)
    result = {
        "points": [asdict(p) for p in points],
        "analysis": analysis,
        "allreduce": allreduce,
        "system": describe(),
    }
    runner.write_result(outdir, "scaling", result, lambda png: plot(points, analysis, png))
    if as_json:
        runner.print_json(result)
    else:
        print("\n".join(table(points, analysis)))
        runner.say(f"results: {outdir}/scaling.json, scaling.png")
    return 0
