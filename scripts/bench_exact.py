"""Every baseline on op-level graphs and Fiddle-like clusters under the max-load objective.

Graphs: the uncoarsened zoo models (``bert-base``, ``bert-large``, ``resnet50``,
``inception-v3``) and seeded synthetic branchy DAGs (series-parallel and layered
training graphs). Clusters: ``A`` memory-capped identical accelerators plus one
unbounded host CPU, all-to-all links of one speed (the setting of Tarnawski et
al., NeurIPS 2020; every route costs the same, so `ideal_dp`'s costs are exact).
Each planner is scored by ``Simulator(objective="max_load")``; the table gives
its objective divided by the best plan any planner found for that row, and its
wall time. Writes ``docs/baselines_exact_table.md`` (first line: the command).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import numpy as np  # noqa: E402

import graphs  # noqa: E402
from agents import baselines  # noqa: E402
from graphs import synthetic  # noqa: E402
from graphs.cluster import Cluster, Device, Link  # noqa: E402
from graphs.compgraph import CompGraph  # noqa: E402
from placement_env.oracles.simulator import Simulator  # noqa: E402

#: (row name, builder, accelerators)
GRAPHS = {
    "bert-base": (lambda: graphs.zoo.build("bert-base"), 4),
    "resnet50": (lambda: graphs.zoo.build("resnet50"), 4),
    "inception-v3": (lambda: graphs.zoo.build("inception-v3"), 8),
    "bert-large": (lambda: graphs.zoo.build("bert-large"), 8),
    "series-parallel-s": (lambda: synthetic.series_parallel(120, rng=1, domain="vision"), 4),
    "layered-s": (lambda: synthetic.layered_dag(60, 4, rng=2, domain="language"), 8),
    "series-parallel-l": (lambda: synthetic.series_parallel(800, rng=3, domain="vision"), 8),
    "layered-l": (lambda: synthetic.layered_dag(470, 4, rng=4, domain="language"), 8),
}
#: "anneal+dp" = `anneal` started from `ideal_dp`'s plan (``init=``), same budget;
#: "ilp-sym" = `ilp` with its symmetry rows (``symmetry=True``), same start and limit.
PLANNERS = [
    "ideal_dp", "ilp", "ilp-sym", "anneal+dp", "pipedream_dp", "anneal", "metis", "expert", "m_topo",
    "m_etf", "m_sct", "random", "round_robin", "single",
]  # fmt: skip


def fiddle_like(graph: CompGraph, accelerators: int, cap_factor: float) -> Cluster:
    """``accelerators`` identical devices holding ``cap_factor / accelerators`` of the graph's
    parameter bytes each, one host CPU with unbounded memory, all-to-all 25 GB/s, 5 us links."""
    mem = cap_factor * float(graph.param_bytes.sum()) / accelerators
    devs = [
        Device(f"acc{i}", "acc", 120e12, 900e9, mem, efficiency=0.4, launch_overhead=5e-6)
        for i in range(accelerators)
    ]
    devs.append(Device("cpu0", "cpu", 2e12, 100e9, float("inf"), 0.5, 1e-5))
    D = len(devs)
    links = tuple(Link(a, b, 25e9, 5e-6) for a in range(D) for b in range(D) if a != b)
    return Cluster(f"fiddle_like_{accelerators}", tuple(devs), links)


def check_arguments(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuse bad arguments before the benchmark (about 20 minutes): ``--graphs nope`` raised
    ``KeyError``, ``--cap-factor 0`` failed inside ``Device`` naming no flag, negative budgets
    and limits filled the table with ``inf``, an unknown ``--skip`` pair was ignored."""
    bad = [g for g in a.graphs if g not in GRAPHS]
    if bad or not a.graphs:
        ap.error(f"--graphs: {bad or 'none given'}; valid: {list(GRAPHS)}")
    for flag, v in (("--dp-seconds", a.dp_seconds), ("--ilp-seconds", a.ilp_seconds),
                    ("--cap-factor", a.cap_factor)):  # fmt: skip
        if not (math.isfinite(v) and v > 0):
            ap.error(f"{flag} must be a finite number > 0, got {v}")
    for flag, v in (("--anneal-budget", a.anneal_budget), ("--random-budget", a.random_budget)):
        if v < 1:
            ap.error(f"{flag} must be an integer >= 1, got {v}")
    for pair in a.skip:
        g, _, planner = pair.partition(":")
        if g not in GRAPHS or planner not in PLANNERS:
            ap.error(f"--skip {pair!r}: expected GRAPH:PLANNER with GRAPH in {list(GRAPHS)} and "
                     f"PLANNER in {PLANNERS}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--graphs", nargs="*", default=list(GRAPHS))
    ap.add_argument("--dp-seconds", type=float, default=60.0)
    ap.add_argument("--ilp-seconds", type=float, default=60.0)
    ap.add_argument("--anneal-budget", type=int, default=2000)
    ap.add_argument("--random-budget", type=int, default=100)
    ap.add_argument("--cap-factor", type=float, default=2.0)
    ap.add_argument(
        "--skip", nargs="*", default=[], help="GRAPH:PLANNER pairs not to run (shown as skipped)"
    )
    ap.add_argument(
        "--planners", nargs="+", default=list(PLANNERS), choices=PLANNERS,
        help="planners to run (the others are shown as skipped); `ilp`, `ilp-sym` and "
        "`anneal+dp` start from `ideal_dp`'s plan only when it runs",
    )  # fmt: skip
    ap.add_argument("--out", default="docs/baselines_exact_table.md")
    a = ap.parse_args()
    check_arguments(ap, a)
    wall0, load0 = time.perf_counter(), os.getloadavg()
    budgets = {"anneal": a.anneal_budget, "random": a.random_budget}
    results: dict[str, dict[str, tuple[float, float, dict]]] = {}
    facts: dict[str, dict] = {}
    for gname in a.graphs:
        build, A = GRAPHS[gname]
        g = build()
        c = fiddle_like(g, A, a.cap_factor)
        _, unit_of = g.group_index()
        facts[gname] = {"nodes": g.num_nodes, "units": int(unit_of.max()) + 1, "A": A}
        results[gname] = {}
        dp_plan = None
        for name in PLANNERS:
            sim = Simulator(g, c, objective="max_load")
            opts: dict = {
                "ideal_dp": {"time_limit": a.dp_seconds},
                "ilp": {"time_limit": a.ilp_seconds},
            }.get(name, {})
            if f"{gname}:{name}" in a.skip or name not in a.planners:
                results[gname][name] = (np.nan, 0.0, {"error": "skipped"})
                continue
            if name == "ilp-sym":
                opts = {"time_limit": a.ilp_seconds, "symmetry": True}
            if name in ("ilp", "ilp-sym", "anneal+dp") and dp_plan is not None:
                opts["init"] = dp_plan.placement  # warm start = ideal_dp's plan, not solved twice
            base = name.split("+")[0].split("-")[0]
            t0 = time.perf_counter()
            try:
                p = baselines.get(base)(g, c, sim, budgets.get(base), **opts)
            except (baselines.InfeasiblePlanError, ValueError) as exc:
                results[gname][name] = (np.inf, time.perf_counter() - t0, {"error": str(exc)})
            else:
                dt = time.perf_counter() - t0
                if name == "ideal_dp":
                    dp_plan = p
                results[gname][name] = (float(p.meta["step_time"]), dt, dict(p.meta))
            v, dt, m = results[gname][name]
            print(f"{gname:18s} {name:13s} {v * 1e3:10.4f} ms {dt:7.1f} s", flush=True)
        for name in ("ilp", "ilp-sym", "anneal+dp"):  # own time plus the DP they start from
            if dp_plan is not None:
                v, dt, m = results[gname][name]
                results[gname][name] = (v, dt + results[gname]["ideal_dp"][1], m)
    lines = _table(results, facts, a)
    header = (
        f"<!-- python scripts/bench_exact.py {' '.join(sys.argv[1:])} | {platform.node()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC | wall {time.perf_counter() - wall0:.0f} s, "
        f"load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f} -->"
    )
    Path(a.out).write_text("\n".join([header, *lines]) + "\n")
    print("\n".join(lines))


def _table(results: dict, facts: dict, a: argparse.Namespace) -> list[str]:
    out = [
        'Objective = `Simulator(objective="max_load")` step time; each cell: objective / best '
        "plan of the row, then seconds (`ilp`, `ilp-sym` and `anneal+dp` include the `ideal_dp` "
        "run they start from). `inf` = infeasible (memory) or refused (model too large).",
        "",
        "| graph | nodes | units | A | best (ms) | " + " | ".join(PLANNERS) + " |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in PLANNERS) + " |",
    ]
    for gname, row in results.items():
        best = np.nanmin([v for v, _, _ in row.values()])
        cells = []
        for name in PLANNERS:
            v, dt, _ = row[name]
            if np.isnan(v):
                cells.append("skipped")
            else:
                cells.append(f"{v / best:.3f} ({dt:.1f})" if np.isfinite(v) else f"inf ({dt:.1f})")
        f = facts[gname]
        out.append(
            f"| {gname} | {f['nodes']} | {f['units']} | {f['A']} | {best * 1e3:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    out += [
        "",
        "| graph | ideal_dp status | exact | dropped | dp gap | items | pinned | ideals | "
        "chain DP / ideal_dp | ilp status | ilp / ideal_dp | ilp gap | ilp bound / best | "
        "ilp-sym rows | ilp-sym status | ilp-sym gap |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: "
        "| ---: | --- | ---: |",
    ]
    for gname, row in results.items():
        best = np.nanmin([v for v, _, _ in row.values()])
        dv, _, dm = row["ideal_dp"]
        iv, _, im = row["ilp"]
        nm = row["ilp-sym"][2]
        if "error" in dm:
            out.append(f"| {gname} | {dm['error'][:80]} |" + " |" * 14)
            continue
        ilp_cells = (
            f"{im['ilp_status']} | {iv / dv:.4f} | {im['mip_gap']:.3f} | "
            f"{im['ilp_bound'] / best:.3f} | {nm.get('symmetry_rows', '')}"
            if "error" not in im
            else f"{im['error'][:60]} | | | |"
        )
        ns_cells = (
            f"{nm['ilp_status']} | {nm['mip_gap']:.3f}"
            if "error" not in nm
            else f"{nm['error'][:40]} |"
        )
        out.append(
            f"| {gname} | {dm['status']} | {dm['exact']} | {dm['dropped_units']} | "
            f"{dm['dp_gap']:.4f} | {dm['items']} | {dm['pinned_items']} | "
            f"{dm['ideals']} | {dm['chain_objective'] / dv:.4f} | {ilp_cells} | {ns_cells} |"
        )
    return out


if __name__ == "__main__":
    main()
