"""HybridModel on layouts whose pipeline stages have their own dp x tp submeshes (stage_meshes),
and StageProfile, the closed-form stage cost the Alpa-style planner's inter-op DP uses."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs import clusters, zoo
from graphs.layout import HybridLayout, layout_grid
from graphs.plan import Plan
from placement_env.oracles import Simulator
from placement_env.oracles.hybrid import HybridModel

TORCHTITAN = dict(
    flash_attention=True, loss_logit_bytes=12, fsdp_root_unsharded=True,
    fsdp_pipeline_unsharded=True, sp_saves_gathered_input=True, pp_keeps_stage_output=True,
    pp_step_buffers=True, op_level_sac=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def gpt16():
    g = zoo.build("gpt", hidden=2048, layers=24, heads=16, vocab=51200, seq=2048, batch=64)
    return g, clusters.load("dgx_a100_80g", nodes=2)


@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=2, tp=4, pp=2, microbatch_size=2),
        dict(dp=4, tp=2, pp=2, microbatch_size=1, recompute="full", zero=1, sequence_parallel=True),
        dict(dp=2, tp=2, pp=4, microbatch_size=4, recompute="selective", zero=3, schedule="gpipe"),
    ],
)
def test_the_same_submesh_on_every_stage_is_the_uniform_layout(gpt16, kw):
    g, cl = gpt16
    M = HybridModel(g, cl)
    kw = dict(kw, global_batch=64)
    uni = Plan.hybrid(g, cl, **kw).layout
    het = Plan.hybrid(g, cl, **kw, stage_meshes=[(kw["dp"], kw["tp"])] * kw["pp"]).layout
    ru, rh = M.evaluate(uni), M.evaluate(het)
    assert rh.step_time == ru.step_time
    assert np.array_equal(rh.peak_memory, ru.peak_memory)
    assert rh.breakdown["memory_per_rank"] == ru.breakdown["memory_per_rank"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(dp=1, tp=2, pp=4, microbatch_size=1),
        dict(dp=2, tp=1, pp=4, microbatch_size=1, zero=3, schedule="gpipe"),
        dict(dp=1, tp=4, pp=2, microbatch_size=2, zero=3),
    ],
)
def test_the_same_submesh_on_every_stage_is_the_uniform_layout_on_a_dgx1(kw):
    """Found by fuzzing: on the DGX-1's cube mesh (groups differ by position) the uniform
    layout was scored with stage 0's group for every stage and its stage_meshes form with
    each stage's own: the two forms of one layout differed by 7-10 %."""
    g = zoo.build("gpt", hidden=256, layers=8, heads=8, vocab=1024, seq=128)
    cl = clusters.load("dgx1_v100_8")
    sim = Simulator(g, cl)
    kw = dict(kw, global_batch=16)
    u = sim.evaluate(Plan.hybrid(g, cl, **kw))
    h = sim.evaluate(Plan.hybrid(g, cl, **kw, stage_meshes=[(kw["dp"], kw["tp"])] * kw["pp"]))
    assert u.step_time == h.step_time
    assert u.breakdown["layer_fwd_per_rank"] == h.breakdown["layer_fwd_per_rank"]
    # the stages' own groups differ here (GPUs 0-1 vs 2-3 of the cube mesh): not one value
    if kw["tp"] == 2:
        assert len(set(np.round(u.breakdown["layer_fwd_per_rank"], 12))) > 1


@pytest.mark.parametrize("switches", [{}, TORCHTITAN])
def test_each_stage_computes_and_keeps_what_its_uniform_view_does(switches):
    """Stage p of a heterogeneous layout on a dp_p x tp_p submesh with dp * mbs / dp_p
    samples per microbatch: the same per-layer seconds and the same bytes per GPU as stage
    p of the uniform layout with that submesh everywhere (same microbatch count)."""
    g = zoo.build("llama", hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632,
                  vocab=32000, seq=2048, batch=32, **switches)  # fmt: skip
    cl = clusters.load("dgx_a100_80g", nodes=2)
    M = HybridModel(g, cl)
    lay = HybridLayout(
        dp=2, tp=4, pp=2, microbatch_size=2, global_batch=32, recompute="full", zero=3,
        sequence_parallel=True, stage_layers=((0, 9), (9, 16)), stage_meshes=((2, 4), (1, 8)),
    )  # fmt: skip
    r = M.evaluate(lay)
    assert len(r.peak_memory) == 16
    for p in range(2):
        v = lay.stage_view(p)
        assert v.world_size == 16
        rv = M.evaluate(v)
        assert r.breakdown["memory_per_rank"][p] == pytest.approx(
            rv.breakdown["memory_per_rank"][p], rel=1e-12
        )
        assert r.breakdown["layer_fwd_per_rank"][p] == pytest.approx(rv.breakdown["layer_fwd"])
        assert r.breakdown["layer_bwd_per_rank"][p] == pytest.approx(rv.breakdown["layer_bwd"])
    # parameters per GPU by hand: 9 layers and the embedding over tp 4; 7 layers, the final
    # norm and the untied head over tp 8
    d = M.dims
    assert r.breakdown["rank_params"][0] == pytest.approx((9 * d.layer_params() + 32000 * 2048) / 4)
    assert r.breakdown["rank_params"][1] == pytest.approx(
        (7 * d.layer_params() + 2048 + 32000 * 2048) / 8
    )


def test_p2p_between_submeshes_of_different_sizes_by_hand():
    """Stage 0 on 2 GPUs (dp 2, tp 1: 2 samples each of the 4-sample microbatch), stage 1 on
    6 (dp 1, tp 6: all 4 samples, hidden state gathered over its TP group). Each GPU of
    stage 0 sends its 2 samples' hidden state, 2 * 2 s h bytes, the larger end's share
    (a stage-1 GPU receives 1/6 of 4 samples'); stage 1 then all-gathers the 2 * 4 s h
    bytes over its 6 GPUs (no SP: Megatron's scatter/gather)."""
    s, h = 128, 768
    g = zoo.build("gpt", hidden=h, layers=4, heads=12, vocab=1000, seq=s, batch=8)
    cl = clusters.load("dgx1_v100_8")
    M = HybridModel(g, cl)
    lay = HybridLayout(
        dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8,
        stage_layers=((0, 2), (2, 4)), stage_meshes=((2, 1), (1, 6)),
    )  # fmt: skip
    r = M.evaluate(lay)
    topo = M.topo
    expect = topo.p2p(2.0 * 2 * s * h, 0, 2) + topo.allgather(2.0 * 4 * s * h, np.arange(2, 8))
    assert r.breakdown["p2p"] == pytest.approx(expect, rel=1e-12)
    assert r.breakdown["layer_fwd_per_rank"][1] != r.breakdown["layer_fwd_per_rank"][0]


@pytest.mark.parametrize("switches", [{}, TORCHTITAN])
def test_stage_profile_memory_is_the_pipeline_kernels_peak(switches):
    """StageProfile.memory (closed form) equals what HybridModel.evaluate's pipeline kernel
    finds, stage by stage, on a sample of 1F1B and GPipe layouts of the grid."""
    g = zoo.build("llama", hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632,
                  vocab=32000, seq=2048, batch=32, **switches)  # fmt: skip
    cl = clusters.load("dgx_a100_80g", nodes=2)
    M = HybridModel(g, cl)
    lays = [x for x in layout_grid(g, cl, global_batch=32) if x.virtual_stages == 1]
    rng = random.Random(0)
    checked = 0
    for lay in rng.sample(lays, 60):
        r = M.evaluate(lay)
        prof = M.stage_profile(lay, lay.dp, lay.tp, lay.microbatch_size)
        for p, (a, b) in enumerate(lay.stage_layers):
            got = prof.memory(b - a, p, lay.pp, lay.num_microbatches)
            assert got == pytest.approx(r.breakdown["memory_per_rank"][p], rel=1e-9), (lay, p)
            checked += 1
        assert prof.seconds(1, False, False) == pytest.approx(
            r.breakdown["layer_fwd"] + r.breakdown["layer_bwd"]
        )
    assert checked > 60


def test_the_simulator_scores_per_stage_submeshes_and_the_runtime_takes_them():
    """The simulator scores a plan whose stages have their own submeshes, and the runtime
    makes it a run spec of 4 + 4 ranks (executed in ``tests/runtime/test_submesh.py``)."""
    from runtime.spec import make_run_spec

    g = zoo.build("gpt", hidden=256, layers=4, heads=4, vocab=1000, seq=64, batch=8)
    cl = clusters.load("dgx_a100_80g", nodes=1)
    tiny = {"batch": 8, "seq": 8, "n_layer": 4, "d_model": 16, "n_head": 4, "vocab": 32, "n_ctx": 8}
    plan = Plan.hybrid(
        g, cl, dp=4, tp=1, pp=2, microbatch_size=1, global_batch=8,
        stage_meshes=[(4, 1), (2, 2)], meta={"model": {"name": "gpt2", "config": tiny}},
    )  # fmt: skip
    assert Simulator(g, cl).evaluate(plan).step_time > 0
    spec = make_run_spec(plan, g, cl)
    assert spec.world_size == 8 and spec.hybrid["stage_meshes"] == [[4, 1], [2, 2]]


_G16 = zoo.build("gpt", hidden=1024, layers=12, heads=16, vocab=32000, seq=1024, batch=32)
_CL16 = clusters.load("dgx_a100_80g", nodes=2)
_M16 = HybridModel(_G16, _CL16)
# every ordered split of 16 GPUs into 2-4 stages of 1, 2, 4 or 8 (a strategy with a filter
# for the sum discarded too many draws: hypothesis's filter_too_much health check)
_SPLITS_16 = [
    xs for P in (2, 3, 4) for xs in itertools.product((1, 2, 4, 8), repeat=P) if sum(xs) == 16
]


@st.composite
def _het_layouts(draw):
    """Random layouts of 12 layers on 16 GPUs whose stages have their own submeshes (and,
    in half of the draws, their own recomputation modes)."""
    sizes = draw(st.sampled_from(_SPLITS_16))  # stage GPU counts, powers of two summing to 16
    P = len(sizes)
    meshes = []
    for n in sizes:
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= n and n % t == 0]))
        meshes.append((n // tp, tp))
    g = draw(st.sampled_from([8, 16, 32]))  # samples per microbatch: every dp divides it
    cuts = sorted(draw(st.sets(st.integers(1, 11), min_size=P - 1, max_size=P - 1)))
    bounds = [0, *cuts, 12]
    # a recomputation mode per stage (stage_recompute) in half of the draws
    modes = ["none", "selective", "full"]
    rcs = draw(st.lists(st.sampled_from(modes), min_size=P, max_size=P))
    if not draw(st.booleans()):
        rcs = [rcs[0]] * P
    return HybridLayout(
        dp=meshes[0][0], tp=meshes[0][1], pp=P, microbatch_size=g // meshes[0][0],
        global_batch=32, recompute=rcs[0],
        stage_recompute=tuple(rcs) if len(set(rcs)) > 1 else (),
        sequence_parallel=draw(st.booleans()) and max(t for _, t in meshes) > 1,
        zero=draw(st.sampled_from([0, 1, 2, 3])), schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
        stage_layers=tuple(zip(bounds[:-1], bounds[1:])), stage_meshes=tuple(meshes),
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(_het_layouts())
def test_random_submesh_layouts_keep_what_their_stage_views_keep(lay):
    """Property: on any split of 16 GPUs into stage submeshes (with or without a
    recomputation mode per stage), each stage's bytes per GPU are
    those of stage p of its uniform view (scored on a cluster of the view's size), the
    per-device array repeats each stage's value over its own GPUs, and StageProfile's closed
    form (1F1B) matches the kernel's peak."""
    r = _M16.evaluate(lay)
    mem = r.breakdown["memory_per_rank"]
    assert len(r.peak_memory) == 16 and np.isfinite(r.step_time) and r.step_time > 0
    start = 0
    for p, (dp, tp) in enumerate(lay.meshes):
        n = dp * tp
        assert np.all(r.peak_memory[start : start + n] == mem[p])
        start += n
        v = lay.stage_view(p)
        if v.world_size % 8 == 0:  # whole DGX nodes: score the view on a cluster of its size
            cl = clusters.load("dgx_a100_80g", nodes=v.world_size // 8)
            rv = HybridModel(_G16, cl).evaluate(v)
            assert mem[p] == pytest.approx(rv.breakdown["memory_per_rank"][p], rel=1e-12)
        if lay.schedule == "1f1b":
            b = lay.stage_microbatch_sizes[p]
            prof = _M16.stage_profile(lay.stage_view(p), dp, tp, b)
            a, z = lay.stage_layers[p]
            got = prof.memory(z - a, p, lay.pp, lay.num_microbatches)
            assert got == pytest.approx(mem[p], rel=1e-9)


def test_stages_that_do_not_fill_whole_nodes_are_scored_where_they_sit():
    """Found by fuzzing: on 3 DGX A100 nodes a dp 3 x tp 2 stage is 6 GPUs, so stage 1
    (GPUs 6-11) and stage 2 (12-17) cross node boundaries; the uniform layout was scored
    with stage 0's all-intra-node groups for every stage (ZeRO-3 traffic 24 % under) while
    its stage_meshes form was not. Both now score each stage's own groups."""
    g = zoo.build("gpt", hidden=4096, layers=16, heads=32, vocab=51200, seq=2048, batch=48)
    cl = clusters.load("dgx_a100_80g", nodes=3)
    sim = Simulator(g, cl)
    for zero in (0, 3):
        kw = dict(dp=3, tp=2, pp=4, microbatch_size=1, global_batch=48, zero=zero)
        u = sim.evaluate(Plan.hybrid(g, cl, **kw))
        h = sim.evaluate(Plan.hybrid(g, cl, **kw, stage_meshes=[(3, 2)] * 4))
        assert u.step_time == h.step_time
        assert u.breakdown["layer_bwd_per_rank"] == h.breakdown["layer_bwd_per_rank"]
    # ZeRO-3: stage 0's DP groups stay in node 0, stage 1's span nodes 0 and 1
    bwd = u.breakdown["layer_bwd_per_rank"]
    assert bwd[1] > bwd[0] * 1.05 and bwd[3] == bwd[0]  # stage 3 (GPUs 18-23) is node 2's


def test_a_tensor_parallel_group_across_two_nodes_sets_the_stages_tp_time():
    """tp 6 on 8-GPU nodes: the second TP group (GPUs 6-11) spans two nodes; the layer's TP
    all-reduce is that group's (the step waits for the slowest), not the first group's."""
    import placement_env.oracles.collectives as col

    g = zoo.build("gpt", hidden=6144, layers=8, heads=48, vocab=51200, seq=2048, batch=48)
    cl = clusters.load("dgx_a100_80g", nodes=3)
    r = Simulator(g, cl).evaluate(
        Plan.hybrid(g, cl, dp=4, tp=6, pp=1, microbatch_size=1, global_batch=48)
    )
    topo = col.Topology.from_cluster(cl)
    hid = 2.0 * 2048 * 6144
    inside, across = topo.allreduce(hid, np.arange(6)), topo.allreduce(hid, np.arange(6, 12))
    assert across > 2 * inside
    assert r.breakdown["tp_collective"] == pytest.approx(across, rel=1e-12)
    # Topology.slowest by hand: the largest time over the rows, one row per shape timed
    assert (
        topo.slowest(lambda x: topo.allreduce(hid, x), [np.arange(6), np.arange(6, 12)]) == across
    )
