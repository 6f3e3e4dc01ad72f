"""Benchmark the Simulator: evaluations/s on gpt2-xl (coarsened and op-level) vs the reference.

Usage: ``python scripts/bench_simulator.py [--seconds 5] [--ref-evals 3] [--no-write]``.
Prints a Markdown table and writes it into ``docs/simulator.md`` between the
``<!-- bench:start -->`` / ``<!-- bench:end -->`` markers. Single process, one
core (the numba kernels are not parallel). Random colocation-respecting
placements, 8 microbatches, 1F1B, ``dgx1_v100_8``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphs import clusters  # noqa: E402
from graphs.compgraph import CompGraph  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402
from tests.placement_env.reference_sim import reference_simulate  # noqa: E402

DOC = ROOT / "docs" / "simulator.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def load_graph(max_groups: int | None) -> tuple[CompGraph, str]:
    """gpt2-xl from the zoo; a synthetic graph of similar size if the zoo cannot build it."""
    label = "gpt2-xl" + (f", coarsened to {max_groups} groups" if max_groups else ", op-level")
    try:
        from graphs import zoo

        return zoo.build("gpt2-xl", max_groups=max_groups), label
    except Exception as exc:  # noqa: BLE001 - report and fall back
        from graphs import synthetic

        print(f"zoo.build('gpt2-xl', max_groups={max_groups}) failed ({exc!r}); using synthetic")
        size = max_groups or 5000
        g = synthetic.sample(np.random.default_rng(0), "layered", min_nodes=size, max_nodes=size)
        return g, f"SYNTHETIC stand-in for {label}"


def group_placements(g: CompGraph, D: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """k random placements that keep every colocation group on one device."""
    _, inv = g.group_index()
    ng = int(inv.max()) + 1 if len(inv) else 0
    return [rng.integers(0, D, ng)[inv].astype(np.int64) for _ in range(k)]


def pipeline_placement(g: CompGraph, D: int) -> np.ndarray:
    """Contiguous split of the groups (in topological order of their first node) into D stages."""
    _, inv = g.group_index()
    ng = int(inv.max()) + 1
    first = np.full(ng, len(inv))
    pos = np.empty(len(inv), np.int64)
    pos[g.topo_order] = np.arange(len(inv))
    np.minimum.at(first, inv, pos)
    rank = np.empty(ng, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(ng)
    return (rank * D // ng)[inv].astype(np.int64)


def rate(sim: Simulator, placements: list[np.ndarray], seconds: float) -> tuple[float, int]:
    sim.evaluate(placements[0])  # compile / load the kernel cache
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sim.evaluate(placements[n % len(placements)])
        n += 1
    return n / (time.perf_counter() - t0), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="timing window per case")
    ap.add_argument("--ref-evals", type=int, default=3, help="reference evaluations to time")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/simulator.md")
    ap.add_argument("--skip-oplevel", action="store_true")
    args = ap.parse_args()

    cluster = clusters.load("dgx1_v100_8")
    rng = np.random.default_rng(0)
    rows = []
    cases = [256] + ([] if args.skip_oplevel else [None])
    for max_groups in cases:
        g, label = load_graph(max_groups)
        sim = Simulator(g, cluster, microbatches=8, schedule="1f1b")
        pls = group_placements(g, cluster.num_devices, 16, rng)
        pls.append(pipeline_placement(g, cluster.num_devices))
        fast, nfast = rate(sim, pls[:-1], args.seconds)
        fast_pipe, _ = rate(sim, pls[-1:], args.seconds / 2)
        pipe = sim.evaluate(pls[-1])
        ref = ""
        ratio = ""
        if max_groups is not None:
            t0 = time.perf_counter()
            for k in range(args.ref_evals):
                out = reference_simulate(g, cluster, pls[k], microbatches=8, schedule="1f1b")
                elapsed = time.perf_counter() - t0
                assert out["step_time"] == sim.evaluate(pls[k]).step_time, "reference disagrees"
                t0 = time.perf_counter() - elapsed
            r = args.ref_evals / (time.perf_counter() - t0)
            ref, ratio = f"{r:.2f}", f"{fast / r:.0f}x"
        rows.append(
            f"| {label} | {g.num_nodes} | {g.num_edges} | {fast:,.0f} ({nfast} evals) "
            f"| {fast_pipe:,.0f} | {ref} "
            f"| {ratio} | {pipe.step_time * 1e3:.1f} ms |"
        )
        print(rows[-1], flush=True)

    table = "\n".join(
        [
            START,
            f"Measured {time.strftime('%Y-%m-%d')} by `python scripts/bench_simulator.py` on "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
            "one process, **shared with other developers' jobs during measurement** "
            "(figures are lower bounds of an idle machine). `dgx1_v100_8`, 8 microbatches, 1F1B; "
            "16 random colocation-respecting placements, and a contiguous 8-stage pipeline "
            "placement; the reference is `tests/placement_env/reference_sim.py` on the same "
            "random placements and agreed exactly; ratio = random-placement rates.",
            "",
            "| graph | nodes | edges | Simulator evals/s, random | evals/s, pipeline "
            "| reference evals/s, random | ratio | step time, pipeline |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            END,
        ]
    )
    print(table)
    if not args.no_write and DOC.exists():
        text = DOC.read_text()
        if START in text and END in text:
            a, b = text.index(START), text.index(END) + len(END)
            DOC.write_text(text[:a] + table + text[b:])
            print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
