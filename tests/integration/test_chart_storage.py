"""The chart's storage tiers: the fast tier's local NVMe class, the object store's reference for
jobs, and the backup tier's mirror CronJob (storage.* values)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.render import check_restricted, pod_specs_in
from tests.support.chart import CHART, needs_helm, template

pytestmark = needs_helm

DESIGN = CHART / "ci" / "onprem-50node-values.yaml"


def _objects(values: Path, kind: str) -> list[dict[str, Any]]:
    return [o for o in template(values) if o["kind"] == kind]


def test_the_fast_tiers_local_nvme_is_scratch_deleted_on_release() -> None:
    (nvme,) = [c for c in _objects(DESIGN, "StorageClass") if c["metadata"]["name"] == "local-nvme"]
    assert nvme["reclaimPolicy"] == "Delete"
    assert nvme["volumeBindingMode"] == "WaitForFirstConsumer"  # on the node the pod runs on


def test_jobs_find_the_object_stores_endpoint_by_envfrom_and_no_credential() -> None:
    maps = [m for m in _objects(DESIGN, "ConfigMap") if m["metadata"]["name"] == "gpufleet-s3"]
    assert maps and all(m["data"]["AWS_ENDPOINT_URL"] == "http://minio.minio.svc:9000"
                        for m in maps)  # fmt: skip
    assert all("SECRET" not in key for m in maps for key in m["data"])


def test_the_mirror_copies_data_then_markers_never_deletes_and_reads_secrets_by_reference() -> None:
    (cron,) = _objects(DESIGN, "CronJob")
    assert cron["metadata"]["namespace"] == "minio" and cron["spec"]["schedule"] == "0 2 * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    ((path, pod),) = list(pod_specs_in(cron))
    assert not check_restricted(pod, path)
    (container,) = pod["containers"]
    script = container["args"][0]
    data, markers = script.split("&&")
    assert '--exclude "**/COMPLETE.json"' in data and '--include "**/COMPLETE.json"' in markers
    assert all(w not in script for w in ("sync", "delete", "move"))  # a backup never deletes
    env = {e["name"]: e for e in container["env"]}
    assert env["SOURCE"]["value"] == "checkpoints"
    assert env["RCLONE_CONFIG_DST_ENDPOINT"]["value"] == "http://minio-backup.minio.svc:9000"
    for side, secret in (("SRC", "minio-credentials"), ("DST", "minio-backup-credentials")):
        for key in ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY"):
            ref = env[f"RCLONE_CONFIG_{side}_{key}"]
            assert "value" not in ref
            assert ref["valueFrom"]["secretKeyRef"] == {"name": secret, "key": f"AWS_{key}"}
    assert not [o for o in template() if o["kind"] == "CronJob"]  # the default: none
