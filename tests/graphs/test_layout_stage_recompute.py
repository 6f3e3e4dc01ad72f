"""HybridLayout.stage_recompute: a recomputation mode per pipeline stage (Aceso's per-stage
recomputation), in the layout, the step model and the Alpa-style planner."""

from __future__ import annotations

import json

import numpy as np
import pytest

from graphs.layout import HybridLayout
from graphs.plan import Plan
from placement_env.oracles import Simulator
from placement_env.oracles.hybrid import HybridModel


def _lay(**kw):
    base = dict(
        dp=2, tp=2, pp=4, microbatch_size=1, global_batch=32, recompute="full",
        stage_layers=((0, 6), (6, 12), (12, 18), (18, 24)),
        stage_recompute=("full", "full", "selective", "none"),
    )  # fmt: skip
    base.update(kw)
    return HybridLayout(**base)


def test_fields_json_and_stage_view():
    lay = _lay()
    assert lay.heterogeneous and lay.recomputes == ("full", "full", "selective", "none")
    assert lay.mesh_shape == (4, 2, 2)  # one submesh shape: the mesh is defined
    d = json.loads(json.dumps(lay.to_dict()))
    assert d["stage_recompute"] == ["full", "full", "selective", "none"]
    assert "stage_meshes" not in d and HybridLayout.from_dict(d) == lay
    v = lay.stage_view(3)
    assert v.recompute == "none" and not v.heterogeneous and "stage_recompute" not in v.to_dict()
    uni = _lay(stage_recompute=())
    assert not uni.heterogeneous and "stage_recompute" not in uni.to_dict()
    assert uni.recomputes == ("full",) * 4


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(stage_recompute=("full", "none")), "stage_recompute .*pp = 4 modes"),
        (dict(stage_recompute=("full", "full", "some", "none")), r"stage_recompute\[2\].*one of"),
        (dict(stage_recompute=("none", "full", "full", "none")), r"stage_recompute\[0\].*first"),
        (
            dict(
                virtual_stages=2,
                schedule="interleaved",
                stage_layers=tuple((3 * i, 3 * i + 3) for i in range(8)),
            ),
            "virtual_stages.*own recomputation",
        ),  # fmt: skip
    ],
)
def test_bad_stage_recompute_is_named(change, match):
    assert_refused_by_name(_lay, change, match)


def assert_refused_by_name(make, change: dict, match: str) -> None:
    """``make(**change)`` raises ``match``; the same change to ``make()``'s JSON form is
    refused by ``HybridLayout.from_dict`` naming its source."""
    with pytest.raises(ValueError, match=match):
        make(**change)
    d = make().to_dict()
    d.update({k: ([list(r) for r in v] if k == "stage_layers" else list(v) if
                  isinstance(v, tuple) else v) for k, v in change.items()})  # fmt: skip
    with pytest.raises(ValueError, match="plan.json"):
        HybridLayout.from_dict(d, source="plan.json")


def test_each_stage_computes_and_keeps_what_its_uniform_view_does(small):
    g, cl = small
    model = HybridModel(g, cl)
    lay = _lay()
    r = model.evaluate(lay)
    per_rank = r.peak_memory.reshape(4, -1)
    for p in range(4):
        v = model.evaluate(lay.stage_view(p))
        assert per_rank[p, 0] == pytest.approx(v.peak_memory.reshape(4, -1)[p, 0], rel=1e-12)
        assert r.breakdown["layer_bwd_per_rank"][p] == pytest.approx(
            v.breakdown["layer_bwd_per_rank"][p], rel=1e-12
        )
    # the same mode on every stage scores exactly as the uniform layout
    for rc in ("none", "selective", "full"):
        uni = _lay(recompute=rc, stage_recompute=())
        same = _lay(recompute=rc, stage_recompute=(rc,) * 4)
        a, b = model.evaluate(uni), model.evaluate(same)
        assert a.step_time == b.step_time and np.array_equal(a.peak_memory, b.peak_memory)


def test_recompute_costs_and_hardware_flops_by_hand(small):
    # full recomputation adds one forward per backward on its stages only; hardware FLOPs
    # count the recomputed forwards of exactly those layers (6 of 24 here), selective the
    # attention scores of its layers
    g, cl = small
    model = HybridModel(g, cl)
    d = model.dims
    rcs = ("full", "none", "selective", "none")
    r = model.evaluate(_lay(stage_recompute=rcs))
    none = model.evaluate(_lay(recompute="none", stage_recompute=()))
    fwd, bwd = r.breakdown["layer_fwd_per_rank"], r.breakdown["layer_bwd_per_rank"]
    nb = none.breakdown["layer_bwd_per_rank"]
    assert bwd[0] == pytest.approx(nb[0] + fwd[0]) and bwd[1] == pytest.approx(nb[1])
    assert nb[2] < bwd[2] < nb[2] + fwd[2] and bwd[3] == pytest.approx(nb[3])
    tokens = 32 * 2048
    want = d.model_flops(32) + 6 * d.layer_flops(tokens) + 6 * 4.0 * tokens * 2048 * 2048
    assert r.hardware_flops_per_device * r.step_time * 16 == pytest.approx(want, rel=1e-9)
    # a stage without recomputation keeps more, and is faster than under full
    assert (
        r.peak_memory.reshape(4, -1)[1, 0]
        > model.evaluate(_lay(stage_recompute=())).peak_memory.reshape(4, -1)[1, 0]
    )  # noqa: E501
    assert r.step_time < model.evaluate(_lay(stage_recompute=())).step_time


def test_plan_hybrid_json_and_simulator(small, tmp_path):
    g, cl = small
    plan = Plan.hybrid(g, cl, dp=2, tp=2, pp=4, microbatch_size=1, global_batch=32,
                       recompute="full", stage_recompute=("full", "full", "none", "none"))  # fmt: skip
    plan.save(tmp_path / "p.json")
    back = Plan.load(tmp_path / "p.json")
    assert back.layout.stage_recompute == ("full", "full", "none", "none")
    res = Simulator(g, cl).evaluate(back)
    assert res.step_time == pytest.approx(HybridModel(g, cl).evaluate(plan.layout).step_time)
    # the runtime executes it: tests/runtime/test_hybrid.py
