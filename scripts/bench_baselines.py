"""Run every baseline on the default experiment and write the table of docs/baselines.md."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import graphs  # noqa: E402
from agents import baselines  # noqa: E402
from placement_env.oracles.simulator import Simulator  # noqa: E402


def main() -> None:
    from scripts.argtypes import positive_float, positive_int

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="gpt2-xl")
    ap.add_argument("--cluster", default="dgx1_v100_8")
    ap.add_argument("--microbatches", type=positive_int, default=8)
    ap.add_argument("--anneal-budget", type=positive_int, default=300)
    ap.add_argument("--random-budget", type=positive_int, default=100)
    ap.add_argument("--ilp-seconds", type=positive_float, default=60.0)
    ap.add_argument("--out", default="docs/baselines_table.md")
    a = ap.parse_args()
    wall0, load0 = time.perf_counter(), os.getloadavg()
    try:  # an unknown name was a ValueError traceback (found by fuzzing)
        c = graphs.clusters.load(a.cluster)
        g = graphs.zoo.build(a.model, max_groups=256)
    except ValueError as exc:
        ap.error(f"--model {a.model!r} / --cluster {a.cluster!r}: {exc}")
    lb = Simulator(g, c, microbatches=a.microbatches, schedule="1f1b").lower_bound()
    rows = [
        f"{a.model} (<= 256 groups) on {a.cluster}, {a.microbatches} microbatches, 1F1B; "
        f"simulator lower bound {lb * 1e3:.1f} ms\n",
        "| baseline | step time (ms) | search time (s) | oracle calls | notes |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    budgets = {"anneal": a.anneal_budget, "random": a.random_budget}
    options = {"ilp": {"time_limit": a.ilp_seconds}}
    # op-placement planners only: the hybrid ones plan data x tensor x pipeline layouts, which
    # this table's op placements cannot express (they ran here, unmarked, until 30 Nov 2026)
    for name in [n for n in baselines.names() if n not in baselines.HYBRID_PLANNERS]:
        sim = Simulator(g, c, microbatches=a.microbatches, schedule="1f1b")
        t0 = time.perf_counter()
        try:
            p = baselines.get(name)(g, c, sim, budgets.get(name), **options.get(name, {}))
        except baselines.InfeasiblePlanError as exc:
            dt = time.perf_counter() - t0
            rows.append(f"| {name} | infeasible | {dt:.2f} | {sim.calls} | {str(exc)[:90]} |")
        else:
            m = p.meta
            note = f"mip_gap {m['mip_gap']:.3f}" if "mip_gap" in m else ""
            rows.append(
                f"| {name} | {m['step_time'] * 1e3:.1f} | {m['search_seconds']:.2f} | "
                f"{m['oracle_calls']} | {note} |"
            )
        print(rows[-1], flush=True)
    header = (
        f"<!-- python scripts/bench_baselines.py {' '.join(sys.argv[1:])} | {platform.node()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')} | wall {time.perf_counter() - wall0:.0f} s, "
        f"{os.cpu_count()} CPUs, load average {load0[0]:.2f} -> {os.getloadavg()[0]:.2f} -->"
    )
    Path(a.out).write_text("\n".join([header, *rows]) + "\n")


if __name__ == "__main__":
    main()
