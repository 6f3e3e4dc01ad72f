"""How many ideals the op-level graphs of ``scripts/bench_exact.py`` have: what `ideal_dp` would have to visit.

Usage: ``python -m scripts.count_ideals [--seconds 300] [--no-write]``.

For each graph of ``bench_exact.GRAPHS`` it builds the item DAG ``ideal_dp`` works on
(``ideal_dp.dp_items``: the edge-free units dropped, as ``ideal_dp``'s default does) and
counts its ideals with :func:`agents.baselines.ideal_count.count_ideals`, then prints a
Markdown table (items, ideals, seconds) and writes it into ``docs/baselines.md`` between
``<!-- ideal-count:start -->`` / ``<!-- ideal-count:end -->``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.baselines.ideal_count import count_ideals  # noqa: E402
from agents.baselines.ideal_dp import dp_items  # noqa: E402
from scripts.bench_alpa_submeshes import write_between  # noqa: E402
from scripts.bench_exact import GRAPHS  # noqa: E402

DOC = ROOT / "docs" / "baselines.md"
START, END = "<!-- ideal-count:start -->", "<!-- ideal-count:end -->"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="time limit per graph")
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    if not a.seconds > 0 or a.seconds == float("inf"):  # NaN too: it meant no limit at all
        ap.error(f"--seconds must be a finite number > 0, got {a.seconds}")
    lines = [
        f"<!-- python -m scripts.count_ideals {' '.join(sys.argv[1:])} | {platform.node()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC -->",
        "| graph | nodes | items | ideals of the item DAG | counted in |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, (build, _) in GRAPHS.items():
        g = build()
        _, unit_of = g.group_index()
        items, _ = dp_items(g, unit_of)
        t0 = time.perf_counter()
        n = count_ideals(items.succ, time_limit=a.seconds)
        dt = time.perf_counter() - t0
        shown = "not counted" if n is None else (f"{n:,}" if n < 10**9 else f"{float(n):.3e}")
        lines.append(f"| {name} | {g.num_nodes:,} | {len(items.succ):,} | {shown} | {dt:.1f} s |")
        print(lines[-1], flush=True)
    md = "\n".join(lines) + "\n"
    print(md)
    if not a.no_write:
        write_between(DOC, START, END, md)


if __name__ == "__main__":
    main()
