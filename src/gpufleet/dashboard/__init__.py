"""The read-only web dashboard (``gpufleet dashboard``): its defaults live here, apart from the
application (gpufleet.dashboard.app), so that the CLI reads them without the dashboard extra."""

DASHBOARD_PORT = 8465
REFRESH_S = 5.0  # seconds between a page's updates of its main part

__all__ = ["DASHBOARD_PORT", "REFRESH_S"]
