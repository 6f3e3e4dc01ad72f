"""Hybrid planners: megatron_grid, alpa (inter-op split) and hybrid_anneal on small and large problems."""

from __future__ import annotations

import time

import pytest

from agents import baselines
from agents.baselines.alpa import split_layers
from agents.baselines.common import InfeasiblePlanError
from agents.baselines.megatron_grid import grid
from graphs import clusters, zoo
from graphs.plan import Plan
from placement_env.oracles import Simulator


@pytest.fixture(scope="module")
def small():
    g = zoo.build("gpt", hidden=1024, layers=8, heads=16, vocab=51200, seq=1024, batch=16)
    cl = clusters.load("dgx_a100_80g", nodes=2)
    return g, cl, Simulator(g, cl)


def test_split_layers_minimises_the_largest_stage():
    # uniform layers: the even split
    assert split_layers(8, 4, 1.0, 0.0, 0.0) == ((0, 2), (2, 4), (4, 6), (6, 8))
    # a heavy last stage (head = 1.5 layers) gets fewer layers: max stage 3.5 -> 3
    assert split_layers(8, 3, 1.0, 0.0, 1.5) == ((0, 3), (3, 6), (6, 8))
    with pytest.raises(ValueError):
        split_layers(2, 3, 1.0, 0.0, 0.0)


def test_megatron_grid_returns_the_best_feasible_layout(small):
    g, cl, sim = small
    plan = baselines.get("megatron_grid")(g, cl, sim, None, global_batch=32)
    assert plan.layout is not None and plan.meta["algorithm"] == "megatron_grid"
    best = plan.meta["step_time"]
    # no layout of the grid is faster and fits
    for lay in grid(g, cl, global_batch=32):
        r = sim.evaluate_layout(lay)
        assert r.oom or r.step_time >= best - 1e-15
    # the plan is a valid hybrid plan with a JSON round trip
    assert Plan.from_dict(plan.to_dict()).layout == plan.layout


def test_alpa_and_anneal_match_or_trail_the_grid(small):
    g, cl, sim = small
    grid_t = baselines.get("megatron_grid")(g, cl, sim, None, global_batch=32).meta["step_time"]
    a = baselines.get("alpa")(g, cl, sim, None, global_batch=32)
    s = baselines.get("hybrid_anneal")(g, cl, sim, 300, global_batch=32, seed=1)
    assert a.meta["algorithm"] == "alpa" and s.meta["oracle_calls"] == 300
    # alpa's space holds the grid's v = 1 layouts and their re-split stages
    assert a.meta["step_time"] <= grid_t * 1.5
    assert s.meta["step_time"] >= grid_t * 0.5  # the anneal searches a superset (moved boundaries)


def test_infeasible_when_nothing_fits():
    g = zoo.build("gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048)
    cl = clusters.load("dgx_a100_80g")
    with pytest.raises(InfeasiblePlanError, match="fits"):
        baselines.get("megatron_grid")(g, cl, Simulator(g, cl), None, global_batch=8)


@pytest.mark.slow
def test_gpt3_175b_on_1024_a100_whole_grid_under_60s():
    g = zoo.build("gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048)
    cl = clusters.load("dgx_a100_80g", nodes=128)
    sim = Simulator(g, cl)
    sim.evaluate(Plan.hybrid(g, cl, dp=16, tp=8, pp=8, microbatch_size=1, global_batch=1536))
    t0 = time.perf_counter()
    plan = baselines.get("megatron_grid")(g, cl, sim, None, global_batch=1536)
    assert time.perf_counter() - t0 < 60
    published = sim.evaluate(
        Plan.hybrid(
            g, cl, dp=16, tp=8, pp=8, microbatch_size=1, global_batch=1536, recompute="full"
        )
    )
    assert plan.meta["step_time"] <= published.step_time


@pytest.mark.parametrize("name", ["megatron_grid", "alpa", "hybrid_anneal"])
@pytest.mark.parametrize(
    "budget, kw, says",
    [
        (None, {"global_batch": 0}, "global_batch must be an integer >= 1"),  # was the default
        (None, {"global_batch": "8"}, "global_batch must be an integer >= 1"),  # was read as 8
        (0, {}, "budget must be an integer >= 1"),  # scored nothing, then "none fits"
        (-1, {}, "budget must be an integer >= 1"),
    ],
)
def test_hybrid_planners_name_a_bad_batch_or_budget(small, name, budget, kw, says):
    g, c, _ = small
    with pytest.raises(ValueError, match=f"{name}: {says}"):
        baselines.get(name)(g, c, Simulator(g, c), budget, **kw)
    plan = baselines.get(name)(g, c, Simulator(g, c), 3, global_batch=16)
    assert plan.meta["oracle_calls"] <= 3 and plan.layout.global_batch == 16
