"""`ilp` with and without its symmetry rows on coarsened zoo graphs: time to a proven optimum.

Each graph is a zoo training graph coarsened to at most ``G`` colocation groups
(``graphs.zoo.build(name, max_groups=G)``), on the Fiddle-like cluster of
``scripts/bench_exact.py`` (``A`` identical accelerators + a host CPU, uniform
links), so the ``A`` accelerators are one group of interchangeable devices.
`ilp` runs twice with the same warm start (`ideal_dp`) and time limit, with
``symmetry=True`` and ``symmetry=False``. Writes ``docs/ilp_symmetry_table.md``
(first line: the command, the machine, the load average).

    python scripts/bench_ilp_symmetry.py --time-limit 60
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "scripts"))

from bench_exact import fiddle_like  # noqa: E402

import graphs  # noqa: E402
from agents import baselines  # noqa: E402
from placement_env.oracles.simulator import Simulator  # noqa: E402

#: (zoo model, max groups, accelerators)
CASES = [
    ("bert-base", 24, 4),
    ("bert-base", 32, 8),
    ("resnet50", 48, 8),
    ("inception-v3", 32, 8),
    ("gpt2", 32, 8),
]


def main() -> None:
    from scripts.argtypes import positive_float

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=positive_float, default=60.0)
    ap.add_argument("--out", default="docs/ilp_symmetry_table.md")
    a = ap.parse_args()
    wall0, load0 = time.perf_counter(), os.getloadavg()
    rows = [
        "| graph | groups | A | symmetry | seconds | status | proven gap | objective (ms) "
        "| B&B nodes | load (1 min) |",
        "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, G, A in CASES:
        g = graphs.zoo.build(name, max_groups=G)
        c = fiddle_like(g, A, 2.0)
        _, unit_of = g.group_index()
        warm = baselines.get("ideal_dp")(g, c, Simulator(g, c, objective="max_load"))
        for sym in (True, False):
            t0 = time.perf_counter()
            p = baselines.get("ilp")(
                g, c, Simulator(g, c, objective="max_load"), None, symmetry=sym,
                time_limit=a.time_limit, init=warm.placement,
            )  # fmt: skip
            dt = time.perf_counter() - t0
            m = p.meta
            rows.append(
                f"| {name} | {int(unit_of.max()) + 1} | {A} | {sym} | {dt:.1f} | {m['ilp_status']} | "
                f"{m['mip_gap']:.4f} | {m['step_time'] * 1e3:.4f} | {m['ilp_nodes']} | "
                f"{os.getloadavg()[0]:.1f} |"
            )
            print(rows[-1], flush=True)
    header = (
        f"<!-- python scripts/bench_ilp_symmetry.py {' '.join(sys.argv[1:])} | {platform.node()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC | wall {time.perf_counter() - wall0:.0f} s, "
        f"load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f} -->"
    )
    Path(a.out).write_text("\n".join([header, *rows]) + "\n")


if __name__ == "__main__":
    main()
