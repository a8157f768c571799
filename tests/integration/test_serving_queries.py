"""InferenceService autoscaling: the queries of the adapter rules and of the KEDA triggers the
renderer writes parse (promtool)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.render import render_spec
from tests.support.serving import adapter_rules, parsed, service


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (make tools)")
def test_autoscaling_queries_parse(tmp_path: Path) -> None:
    """Adapter rules (placeholders filled as the adapter does) and KEDA triggers parse."""
    exprs = [
        re.sub(r"<<\.LabelMatchers>>", 'namespace="a",pod="b"', r["metricsQuery"]).replace(
            "<<.GroupBy>>", "pod"
        )
        for r in adapter_rules()
    ]
    for metric in ("queueTime", "inflight"):
        svc = parsed(
            service(replicas={"min": 1, "max": 2}, autoscaling={"engine": "keda", "metric": metric})
        )
        exprs.append(render_spec(svc, "triton")[-1]["spec"]["triggers"][0]["metadata"]["query"])
    rules = [{"record": f"check:q{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "q.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    proc = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
