"""Pipeline, op-level and tensor-parallel plans on 2 gloo ranks equal a single-process reference."""

from __future__ import annotations

import pytest

from runtime.spec import RunSpec
from tests.runtime._reference import GPT2, check_against_reference, fx_names, run

pytestmark = pytest.mark.timeout(180)


def test_oplevel_ping_pong_branchy_model():
    model = {"factory": "runtime.toy:branchy", "config": {"batch": 8}}
    names = fx_names(model)
    ping_pong = {n: i % 2 for i, n in enumerate(names)}  # every edge of the chain crosses devices
    spec = RunSpec(
        mode="oplevel",
        world_size=2,
        devices=[0, 1],
        model=model,
        device_of=ping_pong,
        microbatches=2,
        steps=1,
        warmup=0,
    )
    results = run(spec)
    check_against_reference(results, model)
    # both ranks did work and both communicated
    assert all(r["steps"][0]["compute"] > 0 and r["steps"][0]["comm"] > 0 for r in results)


def test_pipeline_1f1b_tied_weights():
    model = {"factory": "runtime.toy:tiny_lm", "config": {"batch": 8, "n_layer": 2}}
    names = fx_names(model)
    cut = names.index("add")  # stage 1 starts after the first block
    stage_of = {n: int(i > cut) for i, n in enumerate(names)}
    spec = RunSpec(
        mode="pipeline",
        world_size=2,
        devices=[0, 1],
        model=model,
        stage_of=stage_of,
        stage_rank=[0, 1],
        microbatches=4,
        schedule="1f1b",
        steps=1,
        warmup=0,
    )
    results = run(spec)
    check_against_reference(results, model)
    # the tied embedding lives in both stages: both ranks hold its full gradient
    assert "wte.weight" in results[0]["grads"] and "wte.weight" in results[1]["grads"]


def test_tensor_parallel_gpt2_block():
    """The tp runner on a GPT-2 block: fused-QKV attention and MLP sharded, 2 microbatches."""
    spec = RunSpec(
        mode="tp",
        world_size=2,
        devices=[0, 1],
        model=GPT2,
        tp_degree=2,
        tp_modules=["h"],
        microbatches=2,
        steps=1,
        warmup=0,
    )
    results = run(spec)
    check_against_reference(results, GPT2)
