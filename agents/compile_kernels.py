"""Compile the package's numba kernels into numba's on-disk cache, once, before anything runs.

``python -m agents.compile_kernels`` (``make train`` and ``make test`` call it after set-up).
Every kernel is ``@njit(cache=True)``: the first process that calls it compiles it (about 45 s
of CPU for all of them on the 2-core reference machine) and writes the cache beside the
module; later processes load it in well under a second. Without this step the processes a
test run or a sweep starts at once -- pytest-xdist workers, the CLI runs they launch -- each
compiled the same kernels before any of them had written the cache. The kernels are compiled
in two processes side by side (the discrete-event simulator's; the DP over ideals', the
max-load and pipeline kernels'), each on a tiny problem with the argument types the library
passes.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _simulator() -> float:
    """The simulator's kernels: each schedule, with and without the event record, and the
    max-load objective."""
    import numpy as np

    from graphs import clusters, synthetic
    from graphs.plan import Plan
    from placement_env.oracles import Simulator

    t = time.perf_counter()
    c = clusters.load("k40_2")
    g = synthetic.series_parallel(12, rng=0, domain="vision")
    p = np.arange(g.num_nodes) % 2
    # numba compiles for read-only and writable arrays separately: a Plan's placement is
    # read-only, an array of one's own writable
    for placement in (p, Plan.for_graph(p, g, c)):
        for schedule in ("gpipe", "1f1b", "in_order"):
            for record in (False, True):
                sim = Simulator(g, c, microbatches=2, schedule=schedule)
                sim.evaluate(placement, record=record)
        Simulator(g, c, objective="max_load").evaluate(placement)
    return time.perf_counter() - t


def _exact_and_pipeline() -> float:
    """The DP over ideals (and the max-load kernel it scores with), then the pipeline
    simulation of hybrid plans."""
    from agents import baselines
    from graphs import clusters, synthetic, zoo
    from graphs.plan import Plan
    from placement_env.oracles import Simulator

    t = time.perf_counter()
    g = synthetic.series_parallel(12, rng=0, domain="vision")
    c = clusters.load("k40_2")
    plan = baselines.get("ideal_dp")(g, c, Simulator(g, c, objective="max_load"))
    Simulator(g, c, objective="max_load").evaluate(plan)
    hg = zoo.build("gpt", hidden=256, layers=4, heads=4, vocab=1000, seq=128)
    hc = clusters.load("dgx_a100_80g", nodes=2)
    for schedule, v in (("1f1b", 1), ("interleaved", 2)):
        hplan = Plan.hybrid(
            hg, hc, dp=4, tp=2, pp=2, microbatch_size=1, global_batch=8, virtual_stages=v,
            schedule=schedule,
        )  # fmt: skip
        Simulator(hg, hc).evaluate(hplan)
    return time.perf_counter() - t


def main() -> None:
    t = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(f) for f in (_simulator, _exact_and_pipeline)]
        took = [job.result() for job in jobs]
    print(
        f"numba kernels compiled (or loaded from the cache) in {time.perf_counter() - t:.1f} s "
        f"(simulator {took[0]:.1f} s, exact planners and pipelines {took[1]:.1f} s)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
