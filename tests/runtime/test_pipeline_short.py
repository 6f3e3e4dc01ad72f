"""1F1B with fewer microbatches than pipeline stages (``runtime.pipeline.OneFOneB``).

``torch.distributed.pipelining.Schedule1F1B`` refuses ``m < stages``; the planners and the
simulator take such plans (e.g. ``pipedream_dp`` on ``gpt2_tiny_cpu4``: 4 stages, 2
microbatches; ``megatron_grid`` layouts with ``pp`` above the microbatch count), and every
rank used to stop with that ``ValueError``. Both runtimes that use torch's schedules (the
stage plans' and the uniform hybrid layouts') now run them, and equal one process."""

from __future__ import annotations

import pytest

from graphs.cpu_cluster import cpu_cluster
from graphs.plan import Plan
from runtime.execute import run_specs
from runtime.model import graph_for_model
from runtime.spec import RunSpec, make_run_spec
from tests.runtime._reference import TINY, check_against_reference, check_grads, fx_names, run

pytestmark = pytest.mark.timeout(600)


def test_stage_plan_with_one_microbatch_on_two_stages_equals_one_process():
    """2 gloo ranks, a 2-block tiny LM cut after its first block, 1 microbatch, 1F1B."""
    model = {"factory": "runtime.toy:tiny_lm", "config": {"batch": 4, "n_layer": 2}}
    names = fx_names(model)
    cut = names.index("add")
    spec = RunSpec(
        mode="pipeline",
        world_size=2,
        devices=[0, 1],
        model=model,
        stage_of={n: int(i > cut) for i, n in enumerate(names)},
        stage_rank=[0, 1],
        microbatches=1,
        schedule="1f1b",
        steps=1,
        warmup=0,
    )
    check_against_reference(run(spec), model)


def test_uniform_hybrid_layout_with_one_microbatch_per_replica_equals_one_process():
    """dp 2 x pp 2, ZeRO 1, one microbatch per replica (4 gloo ranks through
    ``make_run_spec`` / ``run_specs``, the path of ``runners.execute``)."""
    gpt2 = {"name": "gpt2", "config": dict(TINY, n_layer=2, batch=4)}
    graph = graph_for_model(gpt2)
    cluster = cpu_cluster(4, calibration={})
    plan = Plan.hybrid(graph, cluster, dp=2, tp=1, pp=2, microbatch_size=2, global_batch=4,
                       schedule="1f1b", zero=1, meta={"model": gpt2})  # fmt: skip
    assert plan.layout.num_microbatches == 1
    sp = make_run_spec(plan, graph, cluster, steps=1, warmup=0, capture_grads=True, timeout_s=300)
    (res,) = run_specs([sp], timeout_s=580)
    assert (res.mode, res.world_size, res.microbatches) == ("hybrid", 4, 1)
    check_grads([res.extra["grads"]], gpt2, res.loss)
