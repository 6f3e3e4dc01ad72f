"""HybridLayout.stage_meshes: a dp x tp submesh per pipeline stage (Alpa's inter-op stages)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs import clusters, zoo
from graphs.layout import HybridLayout
from graphs.plan import Plan


def _het(**kw):
    base = dict(
        dp=2, tp=2, pp=3, microbatch_size=2, global_batch=16,
        stage_layers=((0, 2), (2, 6), (6, 8)), stage_meshes=((2, 2), (4, 1), (1, 4)),
    )  # fmt: skip
    base.update(kw)
    return HybridLayout(**base)


def test_ranks_follow_the_stages_submeshes():
    lay = _het()
    assert lay.heterogeneous and lay.world_size == 4 + 4 + 4
    assert lay.meshes == ((2, 2), (4, 1), (1, 4))
    # the microbatch of dp * microbatch_size = 4 samples, split dp_p ways on each stage
    assert lay.num_microbatches == 4 and lay.stage_microbatch_sizes == (2, 1, 4)
    assert [lay.stage_offset(p) for p in range(3)] == [0, 4, 8]
    assert list(lay.stage_ranks(1)) == [4, 5, 6, 7]
    assert lay.rank(0, 1, 1) == 3 and lay.rank(1, 3, 0) == 7 and lay.rank(2, 0, 3) == 11
    for r in range(lay.world_size):
        assert lay.rank(*lay.coords(r)) == r
    with pytest.raises(ValueError, match="rank 12"):
        lay.coords(12)
    with pytest.raises(ValueError, match="own submeshes"):
        lay.mesh_shape  # noqa: B018


def test_stage_view_is_the_uniform_layout_of_one_stage():
    v = _het().stage_view(2)
    assert (v.dp, v.tp, v.microbatch_size, v.num_microbatches) == (1, 4, 4, 4)
    assert not v.heterogeneous and v.stage_layers == ((0, 2), (2, 6), (6, 8))


def test_json_round_trip_and_uniform_layouts_unchanged():
    lay = _het(recompute="full", zero=1)
    d = json.loads(json.dumps(lay.to_dict()))
    assert d["stage_meshes"] == [[2, 2], [4, 1], [1, 4]]
    assert HybridLayout.from_dict(d) == lay
    uni = HybridLayout(dp=2, tp=2, pp=2, microbatch_size=1, global_batch=8,
                       stage_layers=((0, 2), (2, 4)))  # fmt: skip
    assert "stage_meshes" not in uni.to_dict() and not uni.heterogeneous
    assert uni.meshes == ((2, 2), (2, 2))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(stage_meshes=((2, 2), (4, 1))), "stage_meshes .*pp = 3"),
        (dict(stage_meshes=((2, 2), (4, 1), (3, 1))), r"stage_meshes\[2\].*divides the microbatch"),
        (dict(stage_meshes=((4, 1), (4, 1), (1, 4))), r"stage_meshes\[0\].*first stage's"),
        (dict(stage_meshes=((2, 2), (4, 0), (1, 4))), r"stage_meshes\[1\].*>= 1"),
        (dict(stage_meshes=((2, 2), (4, True), (1, 4))), r"stage_meshes\[1\]"),
        (
            dict(
                virtual_stages=2,
                schedule="interleaved",
                global_batch=24,
                stage_layers=tuple((i, i + 1) for i in range(6)),
            ),
            "virtual_stages.*1 when the stages",
        ),  # fmt: skip
    ],
)
def test_bad_stage_meshes_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        _het(**change)
    d = _het().to_dict()
    d.update(
        {k: ([list(r) for r in v] if k.startswith("stage_") else v) for k, v in change.items()}
    )
    with pytest.raises(ValueError, match="plan.json"):
        HybridLayout.from_dict(d, source="plan.json")


def test_sequence_parallel_needs_tp_on_some_stage():
    _het(stage_meshes=((4, 1), (4, 1), (1, 4)), dp=4, tp=1, microbatch_size=1,
         sequence_parallel=True)  # fmt: skip
    with pytest.raises(ValueError, match="sequence_parallel"):
        _het(stage_meshes=((4, 1), (4, 1), (4, 1)), dp=4, tp=1, microbatch_size=1,
             sequence_parallel=True)  # fmt: skip


def test_validate_names_the_device_count_and_the_stage_tp():
    lay = _het()
    with pytest.raises(ValueError, match="stage_meshes: the stages' dp\\*tp sum to 12"):
        lay.validate(8, 4, 16)
    with pytest.raises(ValueError, match=r"stage_meshes\[2\] tp = 4 must divide the model's 6"):
        lay.validate(8, 6, 12)
    lay.validate(8, 4, 12)


def test_plan_hybrid_places_each_stage_on_its_submesh(tmp_path):
    g = zoo.build("gpt", hidden=256, layers=8, heads=4, vocab=1000, seq=64, batch=16)
    cl = clusters.load("dgx_a100_80g", nodes=2)
    plan = Plan.hybrid(
        g, cl, dp=2, tp=2, pp=3, microbatch_size=2, global_batch=16,
        stage_layers=[(0, 2), (2, 6), (6, 8)], stage_meshes=[(2, 2), (4, 2), (2, 2)],
    )  # fmt: skip
    assert sorted(np.unique(plan.placement)) == [0, 4, 12]
    layer = g.layer
    assert set(plan.placement[(layer >= 2) & (layer < 6)]) == {4}
    plan.save(tmp_path / "plan.json")
    back = Plan.load(tmp_path / "plan.json")
    assert back.layout == plan.layout and back.layout.stage_meshes == ((2, 2), (4, 2), (2, 2))
    back.check(g, cl)
    with pytest.raises(ValueError, match="sum to 14 devices, but the cluster has 16"):
        Plan.hybrid(
            g, cl, dp=2, tp=2, pp=3, microbatch_size=2, global_batch=16,
            stage_meshes=[(2, 2), (4, 2), (1, 2)],
        )  # fmt: skip


def test_stage_tp_choices_and_with_stage_tp_by_hand():
    from graphs.layout import stage_tp_choices, with_stage_tp

    lay = HybridLayout(dp=2, tp=4, pp=2, microbatch_size=2, global_batch=16,
                       stage_layers=((0, 2), (2, 4)))  # fmt: skip
    # stage 1 has 8 GPUs; the microbatch has 4 samples: dp in {1, 2, 4} -> tp in {2, 4, 8};
    # tp 8 needs 8 heads and 8 kv heads; 2 kv heads allow tp 1 and 2 only (Megatron-LM
    # divides the kv heads among the tp ranks; tp 4 and 8 were taken until 27 Nov 2026)
    assert stage_tp_choices(lay, 1, heads=8, kv_heads=8, max_tp=8) == [2, 4, 8]
    assert stage_tp_choices(lay, 1, heads=8, kv_heads=2, max_tp=8) == [2]
    assert stage_tp_choices(lay, 1, heads=4, kv_heads=4, max_tp=8) == [2, 4]
    assert stage_tp_choices(lay, 1, heads=8, kv_heads=8, max_tp=4) == [2, 4]
    assert stage_tp_choices(lay, 2, heads=8, kv_heads=2, max_tp=8) == []
    het = with_stage_tp(lay, 1, 8)
    assert het.stage_meshes == ((2, 4), (1, 8)) and het.microbatch_size == 2
    back = with_stage_tp(het, 1, 4)
    assert back == lay and not back.heterogeneous
    # the first stage's change moves dp, tp and the per-replica microbatch with it
    first = with_stage_tp(lay, 0, 2)
    assert (first.dp, first.tp, first.microbatch_size) == (4, 2, 1)
    assert first.stage_meshes == ((4, 2), (2, 4)) and first.num_microbatches == 4
    sp = HybridLayout(
        dp=4, tp=2, pp=2, microbatch_size=2, global_batch=16, sequence_parallel=True,
        stage_layers=((0, 2), (2, 4)), stage_meshes=((4, 2), (8, 1)),
    )  # fmt: skip
    assert not with_stage_tp(sp, 0, 1).sequence_parallel  # no stage has tp > 1 left


def test_per_stage_arguments_may_be_numpy_and_a_string_is_refused():
    """Found by fuzzing: numpy arrays as stage_meshes / stage_zero raised numpy's "truth value
    of an array is ambiguous", numpy integers in stage_layers were refused, and a string
    stage_recompute was read one character per stage."""
    g = zoo.build("gpt", hidden=1024, layers=8, heads=16, vocab=51200, seq=1024, batch=32)
    cl = clusters.load("dgx_a100_80g")
    kw = dict(dp=4, tp=1, pp=2, microbatch_size=1, global_batch=16, recompute="full", zero=1)
    lists = Plan.hybrid(
        g, cl, **kw, stage_meshes=[[4, 1], [2, 2]], stage_zero=[1, 3], stage_layers=[[0, 5], [5, 8]],
        stage_recompute=["full", "none"], sequence_parallel=True,
    ).layout  # fmt: skip
    arrays = Plan.hybrid(
        g, cl, **kw, stage_meshes=np.array([[4, 1], [2, 2]]), stage_zero=np.array([1, 3]),
        stage_layers=np.array([[0, 5], [5, 8]]), stage_recompute=np.array(["full", "none"]),
        sequence_parallel=np.bool_(True),
    ).layout  # fmt: skip
    assert arrays == lists and arrays.to_dict() == lists.to_dict()
    assert json.dumps(arrays.to_dict())  # plain Python values
    with pytest.raises(ValueError, match=r"Plan.hybrid: stage_recompute = 'full': expected a list"):
        Plan.hybrid(g, cl, **kw, stage_recompute="full")
    with pytest.raises(ValueError, match=r"Plan.hybrid: stage_zero = 3: expected a list"):
        Plan.hybrid(g, cl, **kw, stage_zero=3)
