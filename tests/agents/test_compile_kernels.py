"""``python -m agents.compile_kernels`` leaves numba's cache holding what the library's
common calls need: a fresh process then loads every kernel it calls and compiles none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CALLS = """
import numpy as np
from agents import baselines
from agents.baselines import _ideal_kernel
from graphs import clusters, synthetic
from graphs.plan import Plan
from placement_env.oracles import Simulator, _kernels, pipeline

g = synthetic.series_parallel(20, rng=3, domain="language")  # not the warm-up's graph
c = clusters.load("k40_4")
p = np.arange(g.num_nodes) % 4
for placement in (p, Plan.for_graph(p, g, c)):
    Simulator(g, c, microbatches=4, schedule="1f1b").evaluate(placement, record=True)
    Simulator(g, c, microbatches=3, schedule="in_order").evaluate(placement)
    Simulator(g, c, objective="max_load").evaluate(placement)
baselines.get("ideal_dp")(g, c, Simulator(g, c, objective="max_load"))
kernels = [
    f for m in (_kernels, pipeline, _ideal_kernel) for f in vars(m).values()
    if type(f).__name__ == "CPUDispatcher"
]
print(len(kernels), sum(sum(f.stats.cache_hits.values()) for f in kernels),
      sum(sum(f.stats.cache_misses.values()) for f in kernels))
"""


def test_compiled_kernels_are_loaded_not_compiled_again():
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, *a], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    warm = run("-m", "agents.compile_kernels")
    assert warm.returncode == 0 and "numba kernels compiled" in warm.stderr, warm.stderr
    out = run("-c", CALLS)
    assert out.returncode == 0, out.stderr[-3000:]
    kernels, hits, misses = map(int, out.stdout.split())
    assert kernels == 11 and hits >= 8 and misses == 0, out.stdout
