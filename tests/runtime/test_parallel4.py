"""4 gloo ranks: pipeline x tensor parallel (2 x 2) through runtime.execute and an op-level
plan of a branchy model, against single-process references (one failing rank of four:
test_launch.py)."""

from __future__ import annotations

import numpy as np
import pytest

from graphs.compgraph import FWD
from graphs.cpu_cluster import cpu_cluster
from graphs.plan import Plan
from runtime.dist import seed_everything
from runtime.execute import execute
from runtime.model import graph_for_model, load_model
from runtime.oplevel import OpLevelRunner
from runtime.program import export_with_loss
from runtime.spec import RunSpec, make_run_spec
from tests.runtime._reference import GPT2, check_against_reference, check_grads, run

# 4 processes on a shared 2-core machine: a few tens of seconds each
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gpt2_graph():
    return graph_for_model(GPT2)


def pp_tp_plan(graph, cluster, stage_device=(0, 2), tp=2, **kw) -> Plan:
    """Stage 0 = embeddings + attention, stage 1 = MLP + head (cut at ``ln_2``); every
    group of the block tensor-parallel with degree ``tp``."""
    fwd = np.flatnonzero(graph.kind == FWD)
    cut = next(i for i in fwd if graph.name[i] == "layer_norm_1")
    stage_of_group = {int(graph.group[i]): int(i >= cut) for i in fwd}
    stage = np.array([stage_of_group[int(g)] for g in graph.group])
    placement = np.asarray(stage_device)[stage]
    tp_degree = {int(graph.group[i]): tp for i in fwd if graph.module[i].startswith("h.")}
    return Plan.for_graph(
        placement,
        graph,
        cluster,
        stage=stage,
        stage_device=stage_device,
        tp_degree=tp_degree,
        meta={"model": GPT2},
        **kw,
    )


def test_pipeline_x_tensor_parallel_spec(gpt2_graph):
    cluster = cpu_cluster(4, calibration={})
    spec = make_run_spec(pp_tp_plan(gpt2_graph, cluster), gpt2_graph, cluster)
    assert (spec.mode, spec.world_size, spec.devices) == ("pipeline", 4, [0, 1, 2, 3])
    assert spec.stage_rank == [0, 1] and spec.tp_degree == 2
    assert "h.0.attn.c_attn" in spec.tp_modules and "h.0.mlp.c_fc" in spec.tp_modules
    assert spec.stage_of["linear"] == 0 and spec.stage_of["linear_2"] == 1
    # stages listed in device order (2, 0): the pipeline index follows the stage order
    spec = make_run_spec(pp_tp_plan(gpt2_graph, cluster, (2, 0)), gpt2_graph, cluster)
    assert spec.devices == [2, 3, 0, 1] and spec.stage_rank == [0, 1]


def test_pipeline_x_tensor_parallel_refusals(gpt2_graph):
    cluster = cpu_cluster(4, calibration={})
    with pytest.raises(ValueError, match="needs devices 3..4, but cluster"):
        make_run_spec(pp_tp_plan(gpt2_graph, cluster, (0, 3)), gpt2_graph, cluster)
    with pytest.raises(ValueError, match="overlap"):
        make_run_spec(pp_tp_plan(gpt2_graph, cluster, (0, 1)), gpt2_graph, cluster)
    with pytest.raises(ValueError, match="not divisible by tp degree 3"):
        make_run_spec(pp_tp_plan(gpt2_graph, cluster, tp=3), gpt2_graph, cluster)
    with pytest.raises(ValueError, match=r"\(pipeline stages x tp_degree 2\)"):
        execute(pp_tp_plan(gpt2_graph, cluster), gpt2_graph, cluster, nproc=2)
    with pytest.raises(ValueError, match="must use every pipeline index 0..1"):
        RunSpec(
            mode="pipeline", world_size=4, devices=[0, 1, 2, 3], model=GPT2,
            stage_rank=[0, 0], tp_degree=2, tp_modules=["h"],
        ).validate()  # fmt: skip


def test_pipeline_x_tensor_parallel_execute_equals_one_process(gpt2_graph, tmp_path):
    """2 stages x tp 2 under torchrun: loss and every gradient within 1e-5 of one process
    (fused QKV sharded by heads, tied embedding / LM head across the two stages)."""
    cluster = cpu_cluster(4, calibration={})
    plan = pp_tp_plan(gpt2_graph, cluster, microbatches=2, schedule="1f1b")
    res = execute(
        plan, gpt2_graph, cluster, steps=1, warmup=0, capture_grads=True, out_dir=tmp_path
    )
    assert res.world_size == 4 and res.devices == [0, 1, 2, 3] and res.mode == "pipeline"
    check_grads([res.extra["grads"]], GPT2, res.loss)
    assert all((tmp_path / f"rank{r}.json").exists() for r in range(4))


BRANCHY = {"factory": "runtime.toy:branchy", "config": {"batch": 8}}
#: linear/relu on 1, linear_1/tanh on 2, their sum `add` on 0, consumed on 3 (linear_2)
#: and on 1 (add_1); the head on 2, the loss on 0 and 3.
FOUR_WAY = {
    "linear": 1, "relu": 1, "linear_1": 2, "tanh": 2, "add": 0, "linear_2": 3, "relu_1": 3,
    "add_1": 1, "linear_3": 2, "flip": 0, "sub": 0, "pow_1": 3, "mean": 3,
}  # fmt: skip


def test_oplevel_branchy_on_four_ranks():
    seed_everything(0)
    zm = load_model(BRANCHY)
    gm = export_with_loss(zm.module, zm.example_inputs, zm.loss_fn)
    layout = OpLevelRunner(gm, FOUR_WAY, rank=0, world_size=4)
    assert {p.device for p in layout.parts} == {0, 1, 2, 3}
    assert layout.remote_consumers["add"] == [1, 3]  # one value read on two other ranks
    spec = RunSpec(
        mode="oplevel", world_size=4, devices=[0, 1, 2, 3], model=BRANCHY,
        device_of=FOUR_WAY, microbatches=2, steps=1, warmup=0,
    )  # fmt: skip
    results = run(spec)
    check_against_reference(results, BRANCHY)
    assert all(r["steps"][0]["compute"] > 0 and r["steps"][0]["comm"] > 0 for r in results)
