"""runners.train on a hybrid-parallel env: a hybrid planner's layout, step time, TFLOP/s, MFU and memory in result.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphs.plan import Plan
from runners.train import train
from tests.runners.conftest import compose

SMALL = [
    "+env=gpt3_175b_a100_1024",
    # a 1.3B GPT on 2 DGX A100 nodes keeps the test fast; the env's entry point is the same
    "env.model_config={hidden: 2048, layers: 24, heads: 16, vocab: 51200, seq: 2048, batch: 64}",
    "env.cluster=dgx_a100_80g_x2",
    "env.baselines=[alpa]",
    "logger=none",
    "train.progress=false",
]


@pytest.mark.timeout(600)
def test_megatron_grid_run_writes_the_layout(tmp_path: Path) -> None:
    cfg = compose([*SMALL, "agent=megatron_grid"])
    res = train(cfg, tmp_path, echo=lambda s: None)
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["layout"] == res["layout"]
    lay = res["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 16 and lay["global_batch"] == 64
    assert not res["oom"] and res["best_step_time"] == pytest.approx(res["step_time"])
    assert 0 < res["mfu"] < 1 and res["tflops_per_gpu"] == pytest.approx(res["mfu"] * 312)
    assert 0 < res["memory_per_gpu"] <= 80 * 2**30
    assert res["lower_bound"] < res["best_step_time"]
    # alpa searches a superset of the grid's v = 1 layouts, the grid all v: neither beats the other by much
    assert res["speedup_vs"]["alpa"] == pytest.approx(1.0, rel=0.1)
    plan = Plan.load(tmp_path / "best_plan.json")
    assert plan.layout is not None and plan.layout.to_dict() == lay
    assert plan.meta["algorithm"] == "megatron_grid"


def test_op_placement_agent_is_refused_on_a_hybrid_env(tmp_path: Path) -> None:
    cfg = compose([*SMALL, "env.baselines=[]", "agent=round_robin"])
    with pytest.raises(ValueError, match="layout"):
        train(cfg, tmp_path, echo=lambda s: None)
