"""The ``gpufleet`` console script."""

from __future__ import annotations

import typer

from gpufleet import __version__
from gpufleet.cli import fleet, jobs
from gpufleet.cli.bench import bench
from gpufleet.cli.checkpoints import checkpoints
from gpufleet.cli.common import fail, internal_error
from gpufleet.cli.dashboard import dashboard
from gpufleet.cli.doctor import doctor
from gpufleet.cli.elastic import elastic_controller
from gpufleet.cli.exporter import exporter
from gpufleet.cli.local_cluster import local_cluster
from gpufleet.cli.render import render_cmd
from gpufleet.cli.run import run
from gpufleet.cli.serve import export_cmd, serve
from gpufleet.cli.validate import validate
from gpufleet.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="One job spec for distributed PyTorch training, here and on Kubernetes; Triton serving "
    "and MLPerf LoadGen for the trained model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(run)
app.command()(validate)
app.command(name="render")(render_cmd)
app.command(name="export")(export_cmd)
app.command()(serve)
app.add_typer(bench, name="bench")
app.add_typer(checkpoints, name="checkpoints")
app.add_typer(local_cluster, name="cluster")
app.command(name="elastic-controller")(elastic_controller)
for command in (
    jobs.submit,
    jobs.status,
    jobs.logs,
    jobs.cancel,
    fleet.jobs,
    fleet.queues,
    dashboard,
    doctor,
    exporter,
):
    app.command()(command)


@app.command()
def version() -> None:
    """Print gpufleet's version."""
    print(__version__)


def main() -> None:
    """Entry point: run the app; gpufleet errors exit with their code and no traceback."""
    try:
        app()
    except GpufleetError as exc:
        fail(exc)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # a bug: a short message, not a traceback
        internal_error(exc)


if __name__ == "__main__":
    main()
