"""HybridLayout.stage_zero: a ZeRO stage per pipeline stage, each over that stage's own
data-parallel group, in the layout, its JSON and the step model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs.layout import HybridLayout, with_stage_zero
from graphs.plan import Plan
from placement_env.oracles import Simulator
from placement_env.oracles.hybrid import OPTIMIZER_BYTES, WEIGHT_BYTES, HybridModel
from tests.graphs.test_layout_stage_recompute import assert_refused_by_name


def _lay(**kw):
    base = dict(
        dp=2, tp=2, pp=4, microbatch_size=1, global_batch=32, recompute="full", zero=3,
        stage_layers=((0, 6), (6, 12), (12, 18), (18, 24)), stage_zero=(3, 3, 1, 0),
    )  # fmt: skip
    base.update(kw)
    return HybridLayout(**base)


def test_fields_json_stage_view_and_with_stage_zero():
    lay = _lay()
    assert lay.heterogeneous and lay.zeros == (3, 3, 1, 0)
    d = json.loads(json.dumps(lay.to_dict()))
    assert d["stage_zero"] == [3, 3, 1, 0] and HybridLayout.from_dict(d) == lay
    v = lay.stage_view(2)
    assert v.zero == 1 and not v.heterogeneous and "stage_zero" not in v.to_dict()
    uni = _lay(stage_zero=())
    assert not uni.heterogeneous and "stage_zero" not in uni.to_dict() and uni.zeros == (3,) * 4
    # one stage changed; back on one stage everywhere, the field is dropped again
    assert with_stage_zero(uni, 3, 1).stage_zero == (3, 3, 3, 1)
    assert with_stage_zero(_lay(stage_zero=(3, 1, 1, 1)), 0, 1) == _lay(zero=1, stage_zero=())
    with pytest.raises(ValueError, match=r"with_stage_zero: zero 4"):
        with_stage_zero(uni, 0, 4)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(stage_zero=(3, 1)), "stage_zero .*pp = 4 ZeRO stages"),
        (dict(stage_zero=(3, 3, 5, 0)), r"stage_zero\[2\] = 5.*one of"),
        (dict(stage_zero=(3, 3, True, 0)), r"stage_zero\[2\] = True.*one of"),
        (dict(stage_zero=(1, 3, 1, 0)), r"stage_zero\[0\].*first stage"),
        (
            dict(
                virtual_stages=2,
                schedule="interleaved",
                stage_layers=tuple((3 * i, 3 * i + 3) for i in range(8)),
            ),
            "virtual_stages.*own ZeRO stages",
        ),  # fmt: skip
    ],
)
def test_bad_stage_zero_is_named(change, match):
    assert_refused_by_name(_lay, change, match)


def test_each_stage_keeps_and_sends_what_its_uniform_view_does(small):
    g, cl = small
    model = HybridModel(g, cl)
    lay = _lay()
    r = model.evaluate(lay)
    per_rank = r.peak_memory.reshape(4, -1)
    for p in range(4):
        v = model.evaluate(lay.stage_view(p))
        assert per_rank[p, 0] == pytest.approx(v.peak_memory.reshape(4, -1)[p, 0], rel=1e-12)
        for key in ("layer_fwd_per_rank", "layer_bwd_per_rank"):
            assert r.breakdown[key][p] == pytest.approx(v.breakdown[key][p], rel=1e-12)
    # the same stage everywhere scores exactly as the uniform layout
    for z in range(4):
        a = model.evaluate(_lay(zero=z, stage_zero=()))
        b = model.evaluate(_lay(zero=z, stage_zero=(z,) * 4))
        assert a.step_time == b.step_time and np.array_equal(a.peak_memory, b.peak_memory)


def test_state_bytes_per_stage_by_hand(small):
    # ZeRO-3 on stage 0 only, ZeRO-0 elsewhere: stage 0's weights, gradients and Adam
    # state are divided by dp = 2 (and it holds two gathered layers), the other stages
    # keep all of theirs; the step pays stage 0's all-gathers and the others' all-reduce
    g, cl = small
    model = HybridModel(g, cl)
    d, dp, tp, gb = model.dims, 2, 2, model.grad_bytes
    mixed = model.evaluate(_lay(stage_zero=(3, 0, 0, 0))).peak_memory.reshape(4, -1)[:, 0]
    none = model.evaluate(_lay(zero=0, stage_zero=())).peak_memory.reshape(4, -1)[:, 0]
    lp = d.layer_params() / tp
    params0 = 6 * lp + d.embedding_params() / tp
    full_state = params0 * (WEIGHT_BYTES + gb + OPTIMIZER_BYTES)
    sharded = params0 * (WEIGHT_BYTES + gb + OPTIMIZER_BYTES) / dp + 2 * lp * WEIGHT_BYTES
    assert none[0] - mixed[0] == pytest.approx(full_state - sharded, rel=1e-9)
    assert np.array_equal(mixed[1:], none[1:])


def test_plan_hybrid_json_and_simulator(small, tmp_path):
    g, cl = small
    plan = Plan.hybrid(g, cl, dp=2, tp=2, pp=4, microbatch_size=1, global_batch=32,
                       recompute="full", zero=3, stage_zero=(3, 3, 1, 1))  # fmt: skip
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")
    assert back.layout.stage_zero == (3, 3, 1, 1)
    res = Simulator(g, cl).evaluate(back)
    assert res.step_time == pytest.approx(HybridModel(g, cl).evaluate(plan.layout).step_time)
    # the runtime executes it: tests/runtime/test_hybrid.py
