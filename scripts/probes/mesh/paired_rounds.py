"""Recompute ``pdmesh bench serve``'s paired rounds from its ``serve.json``, with the
current ``paired()``: for runs made before a change to how pairs are summed up, and to
see how far a conclusion rests on its largest rounds.
Usage: .venv/bin/python scripts/probes/mesh/paired_rounds.py DIR/serve.json [--drop-above 1.3]
(``--drop-above R``: also sum up throughput without the rounds whose ratio exceeds R).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pdmesh.bench.serve import report
from pdmesh.bench.serve.paired import paired


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("serve_json", type=Path)
    ap.add_argument("--drop-above", type=float, default=None)
    args = ap.parse_args()
    rows = json.loads(args.serve_json.read_text())["rows"]
    for rate, figures in report.paired_by_rate(rows).items():
        for key, label in report.RATIO_KEYS:
            if key in figures:
                print(f"rate {rate:g}, {label}: {figures[key].describe()}")
        if args.drop_above is not None and "output_tok_s" in figures:
            a = report.side_values(rows, "target", rate, "output_tok_s")
            b = report.side_values(rows, "compare", rate, "output_tok_s")
            kept = [(x, y) for x, y in zip(a, b) if y / x <= args.drop_above]
            print(f"rate {rate:g}, tok/s without rounds above {args.drop_above:g}x: "
                  f"{paired([x for x, _ in kept], [y for _, y in kept]).describe()}")


if __name__ == "__main__":
    main()
