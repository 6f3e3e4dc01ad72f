"""Every layout the hybrid planners can choose is one the runtime accepts before launch.

``graphs.layout.layout_grid`` (megatron_grid's grid, alpa's and hybrid_anneal's space,
Hybrid-v0's states) and ``runtime.spec.make_run_spec`` (what ``runners.execute`` builds
before starting any process) must agree: until 27 Nov 2026 the grid took tensor-parallel
degrees that are multiples of a GQA model's kv heads, which the runtime refuses (it splits
whole kv heads, as Megatron-LM does), so such winning plans could not be run."""

from __future__ import annotations

import pytest

from graphs.cpu_cluster import cpu_cluster
from graphs.layout import layout_grid, model_dims
from graphs.plan import Plan
from runtime.model import graph_for_model
from runtime.spec import make_run_spec

LLAMA = {
    "name": "llama",
    "config": {"batch": 8, "seq": 8, "n_layer": 4, "d_model": 16, "n_head": 4, "n_kv_head": 2,
               "d_ff": 32, "vocab": 32, "n_ctx": 8},
}  # fmt: skip
GPT2 = {
    "name": "gpt2",
    "config": dict(n_layer=4, d_model=32, n_head=4, vocab=64, seq=16, n_ctx=16, batch=8),
}


@pytest.mark.parametrize("model, n", [(LLAMA, 8), (GPT2, 4)], ids=["llama-gqa-8", "gpt2-4"])
def test_grid_layouts_are_accepted_by_the_runtime(model, n):
    """One layout of the grid per (tp, pp, virtual stages, sequence parallelism) -- what the
    runtime's checks before launch depend on -- since ``make_run_spec`` takes about a second
    each (all 276 and 234 layouts passed once by hand, in 8 minutes; with the earlier
    grid 114 of the LLaMA's 390 were refused)."""
    graph = graph_for_model(model)
    cluster = cpu_cluster(n)
    layouts = list(layout_grid(graph, cluster, global_batch=8))
    picked = {}
    for lay in layouts:
        picked.setdefault((lay.tp, lay.pp, lay.virtual_stages, lay.sequence_parallel), lay)
    assert len(picked) >= 8
    for lay in picked.values():
        plan = Plan.from_layout(graph, cluster, lay, meta={"model": model})
        make_run_spec(plan, graph, cluster, steps=1, warmup=0, timeout_s=60)
    if model is LLAMA:  # 2 kv heads: tp 1 and 2 only (tp 4 and 8 were in the grid)
        assert model_dims(graph).kv_heads == 2 and {lay.tp for lay in layouts} == {1, 2}
