"""Pipeline, op-level and tensor-parallel plans on 2 gloo ranks equal a single-process reference."""

from __future__ import annotations

import pytest
import torch

from runtime.dist import seed_everything
from runtime.launch import spawn
from runtime.model import load_model
from runtime.program import compute_nodes, export_with_loss
from runtime.spec import RunSpec
from runtime.worker import run_rank

pytestmark = pytest.mark.timeout(180)

TOL = 1e-5


def reference(model: dict) -> tuple[float, dict[str, torch.Tensor]]:
    seed_everything(0)
    zm = load_model(model)
    loss = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in zm.module.named_parameters()}


def fx_names(model: dict) -> list[str]:
    seed_everything(0)
    zm = load_model(model)
    return [
        n.name for n in compute_nodes(export_with_loss(zm.module, zm.example_inputs, zm.loss_fn))
    ]


def check_against_reference(results: list[dict], model: dict) -> None:
    loss, grads = reference(model)
    assert results[0]["loss"] == pytest.approx(loss, abs=TOL)
    seen: set[str] = set()
    for r in results:
        for name, g in r["grads"].items():
            torch.testing.assert_close(torch.tensor(g), grads[name], atol=TOL, rtol=0)
            seen.add(name)
    assert seen == set(grads)  # every parameter's gradient was produced by some rank


def run(spec: RunSpec) -> list[dict]:
    return spawn(run_rank, spec.world_size, (spec.to_json(), None, True), timeout_s=150)


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


def test_tensor_parallel_mlp():
    model = {"factory": "runtime.toy:mlp", "config": {"batch": 8, "d": 8, "hidden": 16}}
    spec = RunSpec(
        mode="tp",
        world_size=2,
        devices=[0, 1],
        model=model,
        tp_degree=2,
        tp_modules=["mlp"],
        microbatches=2,
        steps=1,
        warmup=0,
    )
    results = run(spec)
    check_against_reference(results, model)
