"""`python -m kfray.eval.backends.sycl [FILTER | --resources | --probe FILTER]`.

With a filter (or none): the devices, the selected one, and the Ray resources of this node.
`--resources` prints only those resources, as JSON, for `ray start --resources "$(...)"` in cluster
scripts. `--probe FILTER` prints one JSON report for runtime.probe, which starts this in a fresh
process so that the caller's own SYCL runtime never starts.
"""
from __future__ import annotations

import json
import sys

from kfray.eval.backends.sycl.runtime import node_resources, probe_report


def main(argv: list[str]) -> None:
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe_report(argv[1] if len(argv) > 1 else "")))
        return
    if argv[:1] == ["--resources"]:
        print(json.dumps(node_resources()))
        return
    report = probe_report(argv[0] if argv else "")
    for d in report["devices"]:
        print(json.dumps(d))
    print(report["error"] or f"selected: {report['selected']['filter']} ({report['selected']['name']})")
    print("ray start --resources '" + json.dumps(node_resources()) + "'")


if __name__ == "__main__":
    main(sys.argv[1:])
