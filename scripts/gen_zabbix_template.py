"""Generate deploy/zabbix/gpufleet-templates.yaml (gpufleet.observe.zabbix) from the metric
catalogue and the Prometheus rules; ``--check`` fails if the checked-in file differs.

python scripts/gen_zabbix_template.py          # rewrite the file
python scripts/gen_zabbix_template.py --check  # CI: the file matches the code and the rules
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from gpufleet.observe.zabbix.export import export_yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpufleet-rules.yaml"
OUT = REPO / "deploy" / "zabbix" / "gpufleet-templates.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is not current")
    args = parser.parse_args()
    text = export_yaml(yaml.safe_load(RULES.read_text()))
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(
                f"{OUT.relative_to(REPO)} is stale: run python {Path(__file__).name}",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
