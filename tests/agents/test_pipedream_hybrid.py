"""`pipedream`: PipeDream's partitioning DP with replicated stages, on hybrid plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import baselines
from agents.baselines.common import InfeasiblePlanError
from agents.baselines.pipedream_hybrid import FIRST, LAST, MID, ONLY, _Costs, replicated_split
from graphs import clusters, zoo
from placement_env.oracles import Simulator
from placement_env.oracles.hybrid import HybridModel


def _compositions(n: int, parts: int):
    for cuts in itertools.combinations(range(1, n), parts - 1):
        b = (0, *cuts, n)
        yield [b[i + 1] - b[i] for i in range(parts)]


def _brute_force(L, U, sizes, cost, kmax):
    """Least bottleneck of every depth P over every split and every size sequence."""
    best = {}
    for P in range(1, min(L, U) + 1):
        val = np.inf
        for ks in _compositions(L, P):
            for ss in itertools.product(sizes, repeat=P):
                if sum(ss) != U:
                    continue
                worst, off = 0.0, 0
                for i, (k, s) in enumerate(zip(ks, ss)):
                    end = ONLY if P == 1 else FIRST if i == 0 else LAST if i == P - 1 else MID
                    if k > kmax(s, end, P - i):
                        worst = np.inf
                        break
                    worst = max(worst, cost(k, s, end, off))
                    off += s
                val = min(val, worst)
        best[P] = val
    return best


@settings(max_examples=60, deadline=None)
@given(
    L=st.integers(1, 6),
    U=st.integers(1, 5),
    data=st.data(),
)
def test_replicated_split_equals_brute_force(L, U, data):
    sizes = data.draw(st.sets(st.integers(1, U), min_size=1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    table = rng.integers(1, 50, size=(L + 1, U + 1, 4, U + 1)).astype(float)
    caps = rng.integers(0, L + 1, size=(U + 1, 4, L + 2))

    def cost(k, s, end, off):
        return float(table[k, s, end, off])

    def kmax(s, end, q):
        # memory only shrinks what a stage holds as more stages follow it (1F1B in-flight)
        return int(caps[s, end, : q + 1].min())

    best, stages = replicated_split(L, U, sizes, cost, kmax)
    bf = _brute_force(L, U, sorted(sizes), cost, kmax)
    assert len(best) == min(L, U) + 1
    for P, v in bf.items():
        assert best[P] == v, (P, best[P], v)
        if np.isfinite(v):
            split = stages(P)
            assert len(split) == P and sum(k for k, _ in split) == L
            assert sum(s for _, s in split) == U and all(s in sizes for _, s in split)
            worst, off = 0.0, 0
            for i, (k, s) in enumerate(split):
                end = ONLY if P == 1 else FIRST if i == 0 else LAST if i == P - 1 else MID
                assert k <= kmax(s, end, P - i)
                worst = max(worst, cost(k, s, end, off))
                off += s
            assert worst == v
        else:
            with pytest.raises(ValueError, match=f"no {P}-stage split fits"):
                stages(P)


def test_replicated_split_by_hand():
    """Two layers on two GPUs, a layer costing 4 / (GPUs of its stage) per microbatch and
    the boundary 1: the pipeline (1 layer per GPU) has bottleneck 4, replicating both layers
    on both GPUs 2 x 4 / 2 = 4 as well plus the all-reduce 0.5 -> 4.5; with a heavy head
    (+3 on the last stage) the pipeline's last stage costs 7 and replication 4 + 3 / 2 +
    0.5 = 6, so replication wins."""

    def make(head):
        def cost(k, s, end, off):
            comp = (4.0 * k + (head if end in (LAST, ONLY) else 0.0)) / s
            return max(comp + (0.5 if s > 1 else 0.0), 1.0 if end in (FIRST, MID) else 0.0)

        return cost

    def kmax(s, end, q):
        return 2

    best, stages = replicated_split(2, 2, [1, 2], make(0.0), kmax)
    assert best[1] == 4.5 and best[2] == 4.0 and stages(2) == [(1, 1), (1, 1)]
    best, stages = replicated_split(2, 2, [1, 2], make(3.0), kmax)
    assert best[1] == 6.0 and best[2] == 7.0 and stages(1) == [(2, 2)]


@pytest.fixture(scope="module")
def small():
    # 4 layers on one 8-GPU node: at most 4 stages, so stages must be replicated
    g = zoo.build("gpt", hidden=1024, layers=4, heads=16, vocab=51200, seq=1024, batch=32)
    cl = clusters.load("dgx_a100_80g", nodes=1)
    return g, cl


def test_stage_cost_is_pipedreams_max_of_compute_all_reduce_and_boundary_by_hand(small):
    """A middle stage of 2 layers on 2 of the node's GPUs, 8 samples per microbatch (4 per
    replica): its cost is the largest of its forward + backward, its gradients' ring
    all-reduce over NVSwitch once per step (4 microbatches: a quarter per microbatch),
    and two p2p's of its output."""
    g, cl = small
    model = HybridModel(g, cl)
    c = _Costs(model, 32, 8, "none", 1, [1, 2, 4, 8])
    d = model.dims
    bw, lat = model.topo.intra.bw, model.topo.intra.lat  # NVSwitch: one route for every pair
    prof = c.prof[2]
    comp = prof.seconds(2, False, False)
    grads = 2 * d.layer_params() * model.grad_bytes
    ring = 2 * (2 - 1) / 2 * grads / bw + 2 * (2 - 1) * lat  # ring all-reduce, 2 ranks
    hid = 2.0 * 4 * d.seq * d.hidden  # fp16 hidden state of 4 samples
    p2p = 2 * (lat + hid / bw)
    assert c.m == 4
    assert c.cost(2, 2, MID, 0) == pytest.approx(max(comp, ring / 4, p2p), rel=1e-9)
    # the last stage sends nothing on; the only stage's tied head is the embedding itself
    assert c.cost(2, 2, LAST, 6) == pytest.approx(
        max(prof.seconds(2, False, True), 2 * (1 / 2) * (
            prof.params(2, False, True, 2) * model.grad_bytes) / bw / 4 + 2 * lat / 4),
        rel=1e-9,
    )  # fmt: skip
    # one GPU: no all-reduce
    assert c.cost(1, 1, MID, 0) == pytest.approx(
        max(c.prof[1].seconds(1, False, False), 2 * (lat + 2.0 * 8 * d.seq * d.hidden / bw))
    )


def test_pipedream_plans_replicated_stages_that_fit_and_scores_them(small):
    g, cl = small
    sim = Simulator(g, cl)
    plan = baselines.get("pipedream")(g, cl, sim, None)
    lay = plan.layout
    assert plan.meta["algorithm"] == "pipedream"
    lay.validate(4, 16, 8)
    assert lay.zero == 0 and all(t == 1 for _, t in lay.meshes)
    assert sum(dp for dp, _ in lay.meshes) == 8 and lay.pp <= 4
    res = sim.evaluate_layout(lay)
    assert not res.oom and plan.meta["step_time"] == pytest.approx(res.step_time)
    assert plan.meta["memory_per_gpu"] <= cl.devices[0].memory
    assert plan.meta["oracle_calls"] == plan.meta["layouts_found"] >= 1
    m = lay.num_microbatches
    assert plan.meta["dp_estimate"] == pytest.approx((m + lay.pp - 1) * plan.meta["dp_bottleneck"])
    # brute force over every split and replica count of the chosen setting, with the costs
    # the DP weighs: none has a smaller bottleneck at the chosen depth
    samples = lay.dp * lay.microbatch_size
    sizes = [s for s in range(1, 9) if samples % s == 0]
    c = _Costs(HybridModel(g, cl), 32, samples, lay.recompute, 1, sizes)
    bf = _brute_force(4, 8, sizes, c.cost, c.kmax)
    assert plan.meta["dp_bottleneck"] == pytest.approx(bf[lay.pp], rel=1e-12)


def test_pipedream_keeps_to_the_memory_and_says_when_a_layer_cannot_fit():
    """GPT 1T: one layer's weights, gradients and Adam state are 141 GB with no tensor
    parallelism or ZeRO, more than an A100's 80 GB: PipeDream's space has no plan."""
    g = zoo.build("gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048, batch=64)
    cl = clusters.load("dgx_a100_80g", nodes=2)
    sim = Simulator(g, cl)
    with pytest.raises(InfeasiblePlanError, match="pipedream: no split .* not even one layer"):
        baselines.get("pipedream")(g, cl, sim, None)
    assert sim.calls == 0


def test_pipedream_refuses_bad_options(small):
    g, cl = small
    sim = Simulator(g, cl)
    for kw, says in (
        ({"samples": [0]}, "samples must be a non-empty list of integers >= 1"),
        ({"samples": []}, "samples must be a non-empty list of integers >= 1"),
        ({"recompute": ["some"]}, "recompute must be a non-empty list of modes among"),
        ({"depths": 0}, "depths must be an integer >= 1"),
    ):
        with pytest.raises(ValueError, match=f"pipedream: {says}"):
            baselines.get("pipedream")(g, cl, sim, None, **kw)
    assert sim.calls == 0


def test_pipedream_across_nodes_replicates_whole_nodes():
    """On 4 DGX A100 nodes the stages are whole nodes (PipeDream's upper level), each a
    data-parallel group of 8 x its nodes."""
    g = zoo.build("gpt", hidden=2048, layers=24, heads=16, vocab=51200, seq=2048, batch=64)
    cl = clusters.load("dgx_a100_80g", nodes=4)
    plan = baselines.get("pipedream")(g, cl, Simulator(g, cl), None)
    assert all(dp % 8 == 0 and t == 1 for dp, t in plan.layout.meshes)
    assert sum(dp for dp, _ in plan.layout.meshes) == 32


def test_pipedream_says_when_no_microbatch_divides_the_batch(small):
    g, cl = small
    with pytest.raises(
        ValueError, match="pipedream: no samples-per-microbatch setting divides the global batch 3"
    ):
        baselines.get("pipedream")(g, cl, Simulator(g, cl), None, global_batch=3, samples=[2, 4])
