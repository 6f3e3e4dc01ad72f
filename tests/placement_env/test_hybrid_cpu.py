"""CpuHybridModel (the hybrid step model calibrated to gloo CPU processes): hand-computed
step time and memory terms on a tiny GPT with a hand-written calibration."""

from __future__ import annotations

import re

import numpy as np
import pytest

from graphs.cpu_cluster import cpu_cluster
from graphs.plan import Plan
from placement_env.oracles.hybrid import HybridModel
from placement_env.oracles.hybrid_cpu import CpuHybridModel, collective_cost, speed_at
from placement_env.oracles.simulator import Simulator
from runtime.model import graph_for_model

MODEL = {
    "name": "gpt2",
    "config": dict(batch=8, seq=16, n_layer=2, d_model=32, n_head=2, vocab=64, n_ctx=16),
}
VH = 64 * 32  # the tied embedding / head matrix
# segments: 0 = embeddings, 1..2 = blocks, 3 = head + loss
FWD = [0.001, 0.010, 0.010, 0.002]
BWD = [0.001, 0.020, 0.020, 0.004]
KEPT = [1000.0, 50_000.0, 50_000.0, 8000.0]
PARAMS = [VH + 512, 12_000, 12_000, VH + 64]
MIB = 2.0**20


def _fit(lat, per):
    return {"latency": lat, "per_byte": per}


def calibration(speed4=0.5):
    seg = {"fwd": FWD, "bwd": BWD, "kept": KEPT, "params": PARAMS}
    full = {"fwd": FWD, "bwd": [b * 1.5 for b in BWD], "kept": [1000.0, 4000, 4000, 8000]}
    full["params"] = PARAMS
    coll = {n: {"wall": _fit(1e-3, 1e-9), "cpu": _fit(5e-4, 5e-10)} for n in
            ("all_reduce", "all_gather", "reduce_scatter", "p2p")}  # fmt: skip
    return {
        "segments": {"1": {"segments": {"2/none": seg, "2/full": full, "4/none": seg}}},
        "collectives": {"2": coll, "4": coll},
        "speed": {"1": 1.0, "2": 1.0, "4": speed4},
        "optimizer": {"adam_cpu_per_param": 1e-8},
        "memory": {"process": 300 * MIB, "build_extra": 40 * MIB},
    }


@pytest.fixture(scope="module")
def graph():
    return graph_for_model(MODEL)


def _evaluate(graph, k, **kw):
    cl = cpu_cluster(k, calibration={"hybrid": calibration()})
    plan = Plan.hybrid(graph, cl, global_batch=8, **kw)
    sim = Simulator(graph, cl)
    res = sim.evaluate(plan)
    assert isinstance(sim._hybrid, CpuHybridModel)  # a calibrated cpu_N gets the CPU model
    return res


def test_speed_and_collective_cost():
    s = {"1": 1.0, "2": 0.9, "4": 0.5}
    assert speed_at(s, 2) == 0.9 and speed_at(s, 3) == 0.5  # between counts: the next larger
    assert speed_at(s, 8) == pytest.approx(0.25)  # beyond: 4 x 0.5 cores shared by 8
    assert speed_at({"2": 1.3}, 2) == 1.0  # sharing never speeds up
    assert collective_cost(_fit(1e-3, 1e-9), 1e6) == pytest.approx(2e-3)


def test_single_process_step_is_the_sum_of_segments(graph):
    res = _evaluate(graph, 1, dp=1, tp=1, pp=1, microbatch_size=2)
    m = 4  # 8 samples / microbatch 2
    params = sum(PARAMS) - VH  # tied matrix counted once
    want = m * (sum(FWD) + sum(BWD)) + params * 1e-8
    assert res.step_time == pytest.approx(want)
    bd = res.breakdown
    assert bd["share_time"] == pytest.approx(want) and bd["critical_path"] == pytest.approx(want)
    base = 340 * MIB + 4 * params
    # 1F1B on one stage holds one microbatch's activations
    step = 4 * params + 8 * params + sum(KEPT)
    assert bd["memory_base"] == pytest.approx(base)
    assert bd["memory_step"][0] == pytest.approx(step)
    assert res.peak_memory.tolist() == pytest.approx([base + step])


def test_zero3_shards_grads_and_adam_and_gathers_a_block(graph):
    z0 = _evaluate(graph, 2, dp=2, tp=1, pp=1, microbatch_size=4, zero=0).breakdown
    z3 = _evaluate(graph, 2, dp=2, tp=1, pp=1, microbatch_size=4, zero=3).breakdown
    params = sum(PARAMS) - VH
    assert z0["memory_grads"][0] == pytest.approx(4 * params)
    assert z0["memory_optimizer"][0] == pytest.approx(8 * params)
    assert z3["memory_grads"][0] == pytest.approx(4 * params / 2)
    assert z3["memory_optimizer"][0] == pytest.approx(8 * params / 2)
    assert z3["memory_gathered"][0] == pytest.approx(4 * 12_000)
    assert z0["memory_gathered"][0] == 0.0
    # ZeRO-0: one all-reduce of the whole model's gradients per step (CPU seconds per rank)
    assert z0["dp_cpu"][0] == pytest.approx(5e-4 + 4 * params * 5e-10)
    # ZeRO-3, m = 1: each block gathered in forward and backward and reduce-scattered once,
    # the root (embeddings, head) the same
    blk, rest = 4 * 12_000, 4 * params - 2 * 4 * 12_000
    one = 5e-4
    want = 2 * (3 * one + 3 * blk * 5e-10) + (3 * one + 3 * rest * 5e-10)
    assert z3["dp_cpu"][0] == pytest.approx(want)


def test_time_sharing_slows_total_work(graph):
    # 4 single-stage replicas at speed 0.5: 2 cores for 4 ranks' work
    res = _evaluate(graph, 4, dp=4, tp=1, pp=1, microbatch_size=2, zero=0)
    bd = res.breakdown
    assert bd["cores"] == pytest.approx(2.0)
    assert bd["share_time"] == pytest.approx(bd["total_work"] / 2.0)
    assert bd["total_work"] == pytest.approx(4 * bd["work_per_rank"][0])
    assert res.step_time == pytest.approx(max(bd["share_time"], bd["critical_path"]))


def test_recompute_trades_activations_for_backward_time(graph):
    none = _evaluate(graph, 1, dp=1, tp=1, pp=1, microbatch_size=2).breakdown
    full = _evaluate(graph, 1, dp=1, tp=1, pp=1, microbatch_size=2, recompute="full")
    bd = full.breakdown
    assert bd["memory_activations"][0] == pytest.approx(1000 + 4000 + 4000 + 8000)
    assert bd["memory_transient"][0] == pytest.approx(50_000)  # one block's, recomputed
    assert bd["chunk_bwd"][0] == pytest.approx(1.5 * none["chunk_bwd"][0])


def test_a_recomputation_mode_per_stage_takes_each_stages_own_figures(graph):
    """``stage_recompute = (full, none)`` on 2 stages: stage 0 is charged the ``2/full``
    segment figures and the block it recomputes, stage 1 the ``2/none`` figures and no
    transient -- each stage exactly as in the uniform layout of its own mode."""
    kw = dict(dp=1, tp=1, pp=2, microbatch_size=2)
    mixed = _evaluate(graph, 2, recompute="full", stage_recompute=("full", "none"), **kw)
    bd = mixed.breakdown
    assert bd["chunk_bwd"] == pytest.approx([1.5 * (BWD[0] + BWD[1]), BWD[2] + BWD[3]])
    # 1F1B: stage 0 holds 2 microbatches of the full-recomputation kept bytes, stage 1 one
    assert bd["memory_activations"] == pytest.approx([2 * (1000 + 4000), KEPT[2] + KEPT[3]])
    assert bd["memory_transient"] == pytest.approx([50_000, 0.0])
    uniform = {rc: _evaluate(graph, 2, recompute=rc, **kw).breakdown for rc in ("full", "none")}
    for p, rc in enumerate(("full", "none")):
        for key in ("chunk_fwd", "chunk_bwd", "memory_activations", "memory_transient",
                    "memory_per_rank", "work_per_rank"):  # fmt: skip
            assert bd[key][p] == pytest.approx(uniform[rc][key][p]), (key, p)
    assert uniform["none"]["critical_path"] < bd["critical_path"] < uniform["full"]["critical_path"]


def test_pipeline_splits_work_and_memory_by_stage(graph):
    res = _evaluate(graph, 2, dp=1, tp=1, pp=2, microbatch_size=2)
    bd = res.breakdown
    assert bd["chunk_fwd"] == pytest.approx([FWD[0] + FWD[1], FWD[2] + FWD[3]])
    assert bd["rank_params"] == pytest.approx([PARAMS[0] + PARAMS[1], PARAMS[2] + PARAMS[3]])
    # the first stage holds more microbatches in flight under 1F1B (2 vs 1)
    assert bd["memory_activations"][0] == pytest.approx(2 * (KEPT[0] + KEPT[1]))
    assert bd["memory_activations"][1] == pytest.approx(KEPT[2] + KEPT[3])
    assert len(res.peak_memory) == 2 and bd["critical_path"] > m_work_one_rank(bd)


def m_work_one_rank(bd):
    return min(bd["work_per_rank"])


def test_uncalibrated_layouts_are_refused_naming_what_to_measure(graph):
    with pytest.raises(ValueError, match="tp=2, microbatch size 2"):
        _evaluate(graph, 2, dp=1, tp=2, pp=1, microbatch_size=2)
    cal = calibration()
    del cal["speed"]
    with pytest.raises(ValueError, match="no 'speed'"):
        CpuHybridModel(graph, cpu_cluster(1), cal)


def test_uncalibrated_cpu_cluster_keeps_the_gpu_model(graph):
    cl = cpu_cluster(1)
    plan = Plan.hybrid(graph, cl, dp=1, tp=1, pp=1, microbatch_size=2, global_batch=8)
    sim = Simulator(graph, cl)
    sim.evaluate(plan)
    assert not isinstance(sim._hybrid, CpuHybridModel)
    # the calibration does not change the cluster's content hash: plans stay valid
    calibrated = cpu_cluster(1, calibration={"hybrid": calibration()})
    assert np.isfinite(Simulator(graph, calibrated).evaluate(plan).step_time)


def test_runtime_overheads_by_process_count(graph):
    cal = calibration()
    cal["runtime"] = {"1": {"microbatch": 0.001}, "4": {"ddp": 0.01}, "8": {"ddp": 0.02}}
    model = CpuHybridModel(graph, cpu_cluster(4), cal)
    assert model.overheads(1) == {"microbatch": 0.001}
    assert model.overheads(2) == {"microbatch": 0.001, "ddp": 0.01}  # the next count above
    assert model.overheads(8)["ddp"] == 0.02 and model.overheads(16)["ddp"] == 0.02
    cl = cpu_cluster(4, calibration={"hybrid": cal})
    plan = Plan.hybrid(graph, cl, dp=4, tp=1, pp=1, microbatch_size=2, global_batch=8)
    with_rt = Simulator(graph, cl).evaluate(plan).breakdown
    without = _evaluate(graph, 4, dp=4, tp=1, pp=1, microbatch_size=2).breakdown
    # ZeRO-0: one chunk, its all-reduce + 10 ms; one microbatch + 1 ms
    assert with_rt["dp_cpu"][0] == pytest.approx(without["dp_cpu"][0] + 0.01)
    assert with_rt["chunk_fwd"][0] == pytest.approx(without["chunk_fwd"][0] + 0.001)


def test_hybrid_anneal_on_a_calibrated_cpu_cluster_scores_per_stage_modes(graph):
    """``hybrid_anneal`` moves one stage to another recomputation mode by default (and, with
    ``stage_zero=True``, to another ZeRO stage); on a calibrated ``cpu_N`` cluster those
    layouts are scored by this model (they raised ``ValueError`` before it charged modes
    per stage) and the search ends with a plan."""
    sim, scored, plan = _anneal_recorded(
        graph, 400, ("none", "full"), (1,), recompute=("none", "full"), max_tp=1,
        sequence_parallel=(False,), stage_zero=True,
    )  # fmt: skip
    assert isinstance(sim._hybrid, CpuHybridModel)
    per_stage = [lay for lay in scored if lay.stage_recompute]
    assert len(per_stage) > 10
    for lay in per_stage[:5]:  # each scored as its stages' own modes
        assert np.isfinite(sim.evaluate_layout(lay).step_time)
    # with stage_zero=True some layouts give a stage its own ZeRO stage, scored here too
    per_zero = [lay for lay in scored if lay.stage_zero]
    assert per_zero and all(np.isfinite(sim.evaluate_layout(x).step_time) for x in per_zero[:5])
    assert plan.layout is not None and np.isfinite(plan.meta["step_time"])


def test_a_zero_stage_per_stage_takes_each_stages_own_figures(graph):
    """``stage_zero = (3, 0)`` on dp 2 x pp 2: stage 0 is charged ZeRO-3's all-gathers,
    sharded gradients, Adam state and gathered block, stage 1 ZeRO-0's all-reduce and full
    state -- each stage's work and memory exactly as in the uniform layout of its own stage."""
    kw = dict(dp=2, tp=1, pp=2, microbatch_size=2)
    bd = _evaluate(graph, 4, zero=3, stage_zero=(3, 0), **kw).breakdown
    uniform = {z: _evaluate(graph, 4, zero=z, **kw).breakdown for z in (3, 0)}
    for p, z in enumerate((3, 0)):
        for key in ("memory_per_rank", "work_per_rank"):
            assert bd[key][p] == pytest.approx(uniform[z][key][p]), (key, p)
    assert uniform[3]["memory_per_rank"][1] < bd["memory_per_rank"][1]


def test_stages_on_their_own_submeshes_take_each_stages_view(graph):
    """``stage_meshes = ((2, 1), (1, 1))`` on 3 processes (8 samples, microbatches of 4 rows:
    2 per rank on stage 0, 4 on stage 1): each stage's chunk times, data-parallel and
    optimizer cost and memory equal stage p of its own uniform view (``stage_view(p)``);
    the boundary's messages carry the larger side's 4 rows (hand-computed), and the total
    work counts stage 0's two ranks and stage 1's one."""
    kw = dict(dp=2, tp=1, pp=2, microbatch_size=2)
    res = _evaluate(graph, 3, stage_meshes=((2, 1), (1, 1)), **kw)
    bd = res.breakdown
    lay = res.layout
    cl = cpu_cluster(3, calibration={"hybrid": calibration()})
    model = CpuHybridModel(graph, cl, calibration())
    views = [model._evaluate_uniform(lay.stage_view(p), 3).breakdown for p in range(2)]
    for p in range(2):
        for key in ("chunk_fwd", "chunk_bwd", "dp_cpu", "optimizer", "memory_per_rank"):
            assert bd[key][p] == pytest.approx(views[p][key][p]), (key, p)
    assert bd["chunk_fwd"] == pytest.approx([FWD[0] + FWD[1], FWD[2] + FWD[3]])
    assert views[1]["dp_cpu"][1] == 0.0 and views[0]["dp_cpu"][0] > 0  # dp 1 vs dp 2
    hid = 4.0 * 4 * 16 * 32  # fp32 x 4 rows x seq x hidden
    assert bd["p2p_per_boundary"] == pytest.approx([1e-3 + hid * 1e-9])
    m, p2p_cpu = 2, 5e-4 + hid * 5e-10
    for p in range(2):  # the view's own messages carry its own rows: 2 on stage 0, 4 on 1
        own = 5e-4 + 4.0 * (2, 4)[p] * 16 * 32 * 5e-10
        assert bd["work_per_rank"][p] == pytest.approx(
            views[p]["work_per_rank"][p] - 2 * m * own + 2 * m * p2p_cpu
        )
    assert bd["total_work"] == pytest.approx(2 * bd["work_per_rank"][0] + bd["work_per_rank"][1])
    assert bd["stage_sizes"] == [2, 1] and len(res.peak_memory) == 3


def test_one_submesh_shape_given_per_stage_scores_as_the_uniform_layout(graph):
    kw = dict(dp=2, tp=1, pp=2, microbatch_size=2)
    same = _evaluate(graph, 4, stage_meshes=((2, 1), (2, 1)), **kw)
    uniform = _evaluate(graph, 4, **kw)
    assert same.layout.stage_meshes and not uniform.layout.stage_meshes
    assert same.step_time == pytest.approx(uniform.step_time, rel=1e-12)
    np.testing.assert_allclose(same.peak_memory, uniform.peak_memory, rtol=1e-12)
    for key in ("work_per_rank", "memory_activations", "critical_path", "total_work"):
        assert same.breakdown[key] == pytest.approx(uniform.breakdown[key], rel=1e-12), key


def test_hybrid_anneal_on_a_calibrated_cpu_cluster_scores_per_stage_submeshes(graph):
    """With tp up to 2, ``hybrid_anneal`` gives stages their own submeshes; on a calibrated
    ``cpu_N`` cluster this model scores those layouts (it refused them before) and the
    search ends with a plan."""
    sim, scored, plan = _anneal_recorded(
        graph, 300, ("none",), (1, 2), recompute=("none",), max_tp=2, sequence_parallel=(False,)
    )
    het = [lay for lay in scored if lay.stage_meshes]
    assert len(het) > 10 and isinstance(sim._hybrid, CpuHybridModel)
    assert all(np.isfinite(sim.evaluate_layout(x).step_time) for x in het[:10])
    assert plan.layout is not None and np.isfinite(plan.meta["step_time"])


def _anneal_recorded(graph, budget, modes, tps, **kw):
    """``hybrid_anneal`` on a calibrated ``cpu_4`` whose calibration covers microbatches
    1-8 (microbatch 2's figures stand in for the others), recomputation ``modes`` and tensor
    degrees ``tps`` (tp 1's figures for the others): ``(simulator, scored layouts, plan)``."""
    import copy

    from agents import baselines

    cal = calibration()
    segs = cal["segments"]["1"]["segments"]
    for mb in (1, 4, 8):
        for rc in modes:
            segs.setdefault(f"{mb}/{rc}", segs[f"2/{rc}"])
    for tp in tps:
        cal["segments"].setdefault(str(tp), copy.deepcopy(cal["segments"]["1"]))
    cl = cpu_cluster(4, calibration={"hybrid": cal})
    sim = Simulator(graph, cl)
    scored = []

    class Recording:
        def evaluate_layout(self, lay):
            scored.append(lay)
            return sim.evaluate_layout(lay)

    plan = baselines.get("hybrid_anneal")(graph, cl, Recording(), budget, **kw)
    return sim, scored, plan


# ---- the hybrid planners' default grids on a calibrated cpu_N cluster


def _calibrated_oracle(k=4):
    """A calibrated ``cpu_k`` whose calibration has tp 1 at microbatch 2 (none, full) and
    4 (none) only: the default grids of the planners hold many other layouts."""
    cl = cpu_cluster(k, calibration={"hybrid": calibration()})
    return cl, Simulator(graph_for_model(MODEL), cl)


def _calibrated(lay) -> bool:
    keys = {"2/none", "2/full", "4/none"}
    modes = lay.stage_recompute or (lay.recompute,) * lay.num_chunks
    tps = [t for _, t in lay.meshes] if lay.stage_meshes else [lay.tp]
    return all(t == 1 for t in tps) and all(f"{lay.microbatch_size}/{m}" in keys for m in modes)


@pytest.mark.parametrize("name", ["megatron_grid", "alpa", "hybrid_anneal", "pipedream"])
def test_hybrid_planners_skip_layouts_the_calibration_cannot_score(graph, name, monkeypatch):
    """With their default grids (selective recomputation, tp 2 and 4, microbatch 1 and 8:
    never calibrated here) the planners used to stop at the first such layout with
    CpuHybridModel's ValueError. They now skip those (no oracle call), count them, and
    plan among the calibrated ones."""
    from agents import baselines

    answered, refused = [], []
    orig = CpuHybridModel.stage_costs

    def stage_costs(self, lay):
        try:
            out = orig(self, lay)
        except ValueError:
            refused.append(lay)
            raise
        answered.append(lay)
        return out

    seg_orig = CpuHybridModel.segment_costs
    seg_answered, seg_refused = [], []

    def segment_costs(self, *shape):
        out = seg_orig(self, *shape)
        (seg_refused if out is None else seg_answered).append(shape)
        return out

    monkeypatch.setattr(CpuHybridModel, "stage_costs", stage_costs)
    monkeypatch.setattr(CpuHybridModel, "segment_costs", segment_costs)
    cl, sim = _calibrated_oracle()
    plan = baselines.get(name)(graph, cl, sim, 200 if name == "hybrid_anneal" else None)
    assert isinstance(sim._hybrid, CpuHybridModel)
    # pipedream proposes only stages the calibration has figures for: nothing to skip
    if name == "pipedream":
        assert "uncalibrated_skipped" not in plan.meta
    else:
        assert plan.meta["uncalibrated_skipped"] > 0
    if name == "alpa":  # alpa also counts the stage-cost queries the model answers as
        # calls, in pass 1 (stage_costs) and in pass 2's submesh DP (segment_costs); the
        # refused ones are no call (they used to be counted)
        assert answered and refused and seg_answered and seg_refused
        assert plan.meta["oracle_calls"] == sim.calls + len(answered) + len(seg_answered)
    elif name == "pipedream":  # its DP weighs stages with the calibrated segments, each
        # lookup answered counted as a call; stages the calibration lacks are not offered
        assert seg_answered and seg_refused and not answered
        assert plan.meta["oracle_calls"] == sim.calls + len(seg_answered)
    else:
        assert plan.meta["oracle_calls"] == sim.calls
    assert _calibrated(plan.layout)
    assert plan.meta["step_time"] == pytest.approx(sim.evaluate_layout(plan.layout).step_time)


def test_megatron_grid_on_a_calibrated_cluster_is_the_best_calibrated_layout(graph):
    """Brute force: the best of the grid's layouts that the calibration covers."""
    from agents import baselines
    from graphs.layout import layout_grid

    cl, sim = _calibrated_oracle()
    plan = baselines.get("megatron_grid")(graph, cl, sim)
    ok = [lay for lay in layout_grid(graph, cl, global_batch=8) if _calibrated(lay)]
    assert 0 < len(ok) == plan.meta["oracle_calls"]
    skipped = len(list(layout_grid(graph, cl, global_batch=8))) - len(ok)
    assert plan.meta["uncalibrated_skipped"] == skipped
    times = [sim.evaluate_layout(lay) for lay in ok]
    best = min(r.step_time for r in times if not r.oom)
    assert plan.meta["step_time"] == pytest.approx(best)


def test_hybrid_planners_say_when_no_layout_is_calibrated(graph):
    from agents import baselines
    from agents.baselines.common import InfeasiblePlanError

    cl, sim = _calibrated_oracle()
    for name in ("megatron_grid", "alpa", "hybrid_anneal"):
        with pytest.raises(InfeasiblePlanError, match=f"{name}: none of the .* could be scored"):
            baselines.get(name)(graph, cl, sim, None, microbatch_sizes=(1, 8))
    assert sim.calls == 0


def test_hybrid_anneal_ends_on_a_grid_of_one_layout(graph):
    """No move gives another layout: the search ends after its start (it looped forever)."""
    from agents import baselines

    cl = cpu_cluster(1)
    one = dict(microbatch_sizes=(1,), virtual_stages=(1,), recompute=("none",), zero=(0,))
    plan = baselines.get("hybrid_anneal")(
        graph, cl, Simulator(graph, cl), 20, sequence_parallel=(False,), **one
    )
    assert plan.meta["oracle_calls"] == 1 and plan.meta["stopped_without_moves"]


def test_a_calibration_of_another_model_is_refused_naming_both(graph):
    cal = dict(calibration(), model={"name": "gpt2", "config": dict(MODEL["config"], n_layer=4)})
    with pytest.raises(
        ValueError, match=r"measured on 'gpt2' .*differs in \{'n_layer': \(4, 2\)\}"
    ):
        CpuHybridModel(graph, cpu_cluster(2), cal)
    same = dict(calibration(), model=MODEL)
    assert CpuHybridModel(graph, cpu_cluster(2), same).dims.layers == 2


def test_a_calibration_of_a_parametric_model_is_checked_against_its_keywords():
    """``runners.profile hybrid.model={name: gpt, config: {hidden: ...}}`` calibrates a
    parametric model (its module is the zoo's GPT-2 of those dimensions); the parametric
    graph keeps its keywords in ``meta["config"]``, so the calibration is accepted for that
    graph and refused, naming the key, for another size (it was refused for every graph:
    the parametric graph had no config to compare)."""
    from graphs import zoo

    kw = dict(hidden=32, layers=2, heads=2, vocab=64, seq=16, batch=8)
    g = zoo.build("gpt", **kw)
    assert g.meta["config"] == kw
    ok = dict(calibration(), model={"name": "gpt", "config": kw})
    assert CpuHybridModel(g, cpu_cluster(2), ok).dims.layers == 2
    other = zoo.build("gpt", **dict(kw, hidden=64))
    with pytest.raises(ValueError, match=r"differs in \{'hidden': \(32, 64\)\}"):
        CpuHybridModel(other, cpu_cluster(2), ok)


def test_predicted_run_gives_each_rank_its_stages_figures(graph):
    """dp 2 x pp 2 on a calibrated cpu_4: ranks 0-1 hold stage 0, ranks 2-3 stage 1."""
    from placement_env.oracles.hybrid_cpu import predicted_run

    cl = cpu_cluster(4, calibration={"hybrid": calibration()})
    plan = Plan.hybrid(graph, cl, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8)
    pred = predicted_run(plan, graph, cl)
    res = Simulator(graph, cl).evaluate(plan)
    per_stage = res.breakdown["memory_per_rank"]
    assert pred["step_time"] == pytest.approx(res.step_time)
    assert pred["peak_memory"] == pytest.approx([per_stage[0]] * 2 + [per_stage[1]] * 2)
    assert per_stage[0] != per_stage[1]
    # no hybrid calibration, or no layout: nothing to predict
    assert predicted_run(plan, graph, cpu_cluster(4)) is None
    op = Plan(np.zeros(graph.num_nodes, dtype=np.int64))
    assert predicted_run(op, graph, cl) is None


def test_hybrid_env_on_a_calibrated_cluster_moves_among_calibrated_layouts(graph):
    """Hybrid-v0 on a calibrated cpu_4: its states are the layouts the calibration covers
    (tp 1; microbatch 2 with none / full, 4 with none), moves to others are masked, and
    masked random steps never reach the model's UncalibratedLayoutError (PPO on such a
    cluster used to stop at the first one)."""
    from placement_env.envs.hybrid import HybridEnv
    from placement_env.generators import fixed

    cl, sim = _calibrated_oracle()
    env = HybridEnv(fixed(graph, cl), global_batch=8)
    env.reset(seed=0)
    space = env._prep["space"]
    assert space and all(_calibrated(lay) for lay in space)
    assert any(not _calibrated(lay) for lay in layout_grid_of(graph, cl))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        mask = env.action_masks()
        assert mask.any()
        _, _, _, _, info = env.step(int(rng.choice(np.flatnonzero(mask))))
        assert not info["invalid_action"] and _calibrated(env.layout)
        seen.add(str(env.layout.to_dict()))
    assert len(seen) > 5
    # the simulator says why a layout cannot be scored, without scoring it
    bad = next(lay for lay in layout_grid_of(graph, cl) if not _calibrated(lay))
    assert "tp=" in sim.layout_unscorable(bad) and sim.calls == 0
    assert sim.layout_unscorable(space[0]) is None


def layout_grid_of(graph, cl):
    from graphs.layout import layout_grid

    return list(layout_grid(graph, cl, global_batch=8))


def test_alpa_weighs_its_inter_op_split_with_the_calibrated_segments(graph, monkeypatch):
    """``CpuHybridModel.stage_costs`` by hand (the test calibration's segment seconds), and
    ``alpa`` on a calibrated cluster asks it, not the GPU roofline, for its pass-1 split."""
    from agents import baselines

    cl, sim = _calibrated_oracle()
    model = sim.hybrid_model()
    lay = Plan.hybrid(graph, cl, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8).layout
    c = model.stage_costs(lay)
    assert c == pytest.approx({"layer": 0.010 + 0.020, "first": 0.001 + 0.001, "last": 0.006})
    full = model.stage_costs(Plan.hybrid(graph, cl, dp=2, tp=1, pp=2, microbatch_size=2,
                                         global_batch=8, recompute="full").layout)  # fmt: skip
    assert full["layer"] == pytest.approx(0.010 + 0.030)  # the full-recomputation figures
    seen = []
    orig = CpuHybridModel.stage_costs
    monkeypatch.setattr(
        CpuHybridModel, "stage_costs", lambda self, x: seen.append(x) or orig(self, x)
    )
    plan = baselines.get("alpa")(graph, cl, sim, None)
    assert seen and all(x.pp > 1 for x in seen) and _calibrated(plan.layout)


def test_alpa_submesh_dp_weighs_stages_with_the_calibrated_segments(graph):
    """Pass 2 (the submesh DP) on a calibrated cluster: each stage option's seconds are the
    calibrated segment figures of its ``(tp, samples per DP rank, recompute)`` -- the
    roofline's before 28 Nov 2026 --, its memory the roofline's closed form, and options the
    calibration lacks are not offered at all."""
    from agents.baselines.alpa import _MeshOptions, submesh_layouts

    cl, sim = _calibrated_oracle()
    model = sim.hybrid_model()
    assert model.segment_costs(1, 2, "none") == pytest.approx(
        {"layer": 0.010 + 0.020, "first": 0.001 + 0.001, "last": 0.006}
    )
    assert model.segment_costs(2, 2, "none") is None
    roof = HybridModel(graph, cl)
    tpl = Plan.hybrid(graph, cl, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8).layout
    mo = _MeshOptions(roof, tpl, 1, (1, 2), 2, float("inf"), ("none", "full"), None, model)
    assert mo.opts and mo.queries == len(mo.opts)
    plain = _MeshOptions(roof, tpl, 1, (1, 2), 2, float("inf"), ("none", "full"))
    assert len(plain.opts) > len(mo.opts)  # tp 2 and the 1-sample microbatches: uncalibrated
    for size, dp, tp, prof, rc, z in mo.opts:
        want = model.segment_costs(tp, 4 // dp, rc)
        assert (prof.layer, prof.first, prof.last) == pytest.approx(
            (want["layer"], want["first"], want["last"])
        )
        twin = next(o[3] for o in plain.opts if o[:3] == (size, dp, tp) and o[4:] == (rc, z))
        assert prof.memory(1, 0, 2, 2) == twin.memory(1, 0, 2, 2)
        assert twin.layer != prof.layer  # the roofline's seconds are other
    counter = [0]
    found = submesh_layouts(roof, tpl, max_tp=2, gpus_per_node=4, recomputes=("none", "full"),
                            costs=model, counter=counter)  # fmt: skip
    assert counter[0] > 0
    assert all(_calibrated(lay) for _, lay in found)


def test_pipedream_weighs_stages_with_the_calibrated_segments(graph):
    """`pipedream` on a calibrated cluster: each stage option's seconds are the calibrated
    segment figures of its ``(tp = 1, samples per replica, recompute)``, its memory the
    roofline's, and replica counts the calibration lacks are not offered (as alpa's DP)."""
    from agents.baselines.pipedream_hybrid import _Costs

    cl, sim = _calibrated_oracle()
    model = sim.hybrid_model()
    roof = HybridModel(graph, cl)
    # 4 samples per microbatch: 2 replicas get 2 each (calibrated), 1 replica 4 (calibrated
    # without recomputation only), 4 replicas 1 each (never calibrated)
    c = _Costs(roof, 8, 4, "none", 1, [1, 2, 4], model)
    plain = _Costs(roof, 8, 4, "none", 1, [1, 2, 4])
    assert sorted(c.prof) == [1, 2] and sorted(plain.prof) == [1, 2, 4] and c.queries == 2
    for s in c.prof:
        want = model.segment_costs(1, 4 // s, "none")
        prof = c.prof[s]
        assert (prof.layer, prof.first, prof.last) == pytest.approx(
            (want["layer"], want["first"], want["last"])
        )
        assert prof.memory(1, 0, 2, 2) == plain.prof[s].memory(1, 0, 2, 2)
        assert plain.prof[s].layer != prof.layer
    assert sorted(_Costs(roof, 8, 4, "full", 1, [1, 2, 4], model).prof) == [2]


def test_execute_predicts_only_what_the_model_counts(graph, tmp_path):
    """runners.execute: Adam by default where the calibrated model predicts the run (it
    counts Adam; the runtime's default is SGD), no prediction -- a line saying why -- for
    another optimizer or a layout the calibration lacks; it used to compare SGD runs with
    Adam predictions, and to fail after the run on an uncalibrated layout."""
    from types import SimpleNamespace

    from runners.execute import default_optimizer, report_prediction

    cl = cpu_cluster(4, calibration={"hybrid": calibration()})
    plan = Plan.hybrid(graph, cl, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8)
    op = Plan(np.zeros(graph.num_nodes, dtype=np.int64))
    assert default_optimizer(plan, cl) == "adam"
    assert default_optimizer(plan, cpu_cluster(4)) == default_optimizer(op, cl) == "sgd"
    run = SimpleNamespace(step_time=0.1, run_peak=[4e8] * 4, to_dict=lambda: {"step_time": 0.1})
    lines: list[str] = []
    pred = report_prediction(plan, graph, cl, run, tmp_path, lines.append)
    assert pred["optimizer"] == "adam" and len(pred["peak_memory_error"]) == 4
    assert lines[-1].startswith(f"predicted by the calibrated model of {cl.name}")
    assert report_prediction(plan, graph, cl, run, tmp_path, lines.append, optimizer="sgd") is None
    assert "no prediction: the calibrated model" in lines[-1] and "'sgd'" in lines[-1]
    selective = Plan.hybrid(
        graph, cl, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=8, recompute="selective"
    )
    assert report_prediction(selective, graph, cl, run, tmp_path, lines.append) is None
    assert lines[-1].startswith("no prediction: CpuHybridModel: no calibrated segment times")


def _bad(edit):
    cal = calibration()
    edit(cal)
    return cal


@pytest.mark.parametrize(
    "edit, says",
    [
        # negative times were taken: the grid's best went from 25.68 to 14.64 ms (fuzzing)
        (lambda c: c["segments"]["1"]["segments"]["2/none"].update(fwd=[-1.0] * 4),
         r"'hybrid.segments.1.segments.2/none.fwd\[0\]' is -1.0"),
        (lambda c: c["speed"].update({"2": -0.5}), r"'hybrid.speed.2' is -0.5"),
        (lambda c: c["speed"].update({"2": 0}), r"'hybrid.speed.2' is 0"),  # ZeroDivisionError
        (lambda c: c["memory"].update(worker_base=-1e12), r"'hybrid.memory.worker_base'"),
        # a short list raised IndexError when a layout reached its missing blocks (2/none and
        # 4/none share one dict here)
        (lambda c: c["segments"]["1"]["segments"]["4/none"].update(fwd=[0.1, 0.1, 0.1]),
         r"'hybrid.segments.1.segments.[24]/none.bwd' has 4 figures where fwd has 3"),
        (lambda c: c["segments"]["1"]["segments"].update({"2/bogus": c["segments"]["1"]["segments"]["2/none"]}),
         "is not a 'microbatch size/recompute' key"),
        (lambda c: c["collectives"]["2"]["p2p"]["wall"].update(per_byte=-1e-9),
         r"'hybrid.collectives.2.p2p.wall.per_byte'"),
        (lambda c: c["optimizer"].pop("adam_cpu_per_param"), "adam_cpu_per_param' is missing"),
    ],
)  # fmt: skip
def test_a_bad_hybrid_calibration_is_refused_naming_the_field(graph, tmp_path, edit, says):
    import json

    from graphs.cpu_cluster import load_calibration

    bad = _bad(edit)
    with pytest.raises(ValueError, match=says):  # from Python: when the model is built
        _evaluate_with(graph, bad)
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"hybrid": bad}))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": field .*" + says):
        load_calibration(path)  # from a file: when it is read, naming the file


def test_segments_of_another_layer_count_are_refused(graph):
    def short(c):  # every figure for one block, where the model has two
        for e in c["segments"]["1"]["segments"].values():
            for k in ("fwd", "bwd", "kept", "params"):
                e[k] = e[k][:3]

    with pytest.raises(ValueError, match="has 3 segment figures; this model has 2 blocks, so 4"):
        _evaluate_with(graph, _bad(short))


def _evaluate_with(graph, cal):
    cl = cpu_cluster(2, calibration={"hybrid": cal})
    plan = Plan.hybrid(graph, cl, dp=2, tp=1, pp=1, global_batch=8, microbatch_size=2)
    return Simulator(graph, cl).evaluate(plan)
