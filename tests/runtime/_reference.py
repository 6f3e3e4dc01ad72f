"""Single-process references and comparison helpers for the multi-rank equivalence tests."""

from __future__ import annotations

import pytest
import torch

from runtime.dist import seed_everything
from runtime.launch import spawn
from runtime.model import load_model
from runtime.program import compute_nodes, export_with_loss
from runtime.spec import RunSpec
from runtime.worker import run_rank

TOL = 1e-5

#: Shape of the tiny transformers below: one block, d=16, 4 heads of 4, vocabulary 32.
TINY = {"batch": 4, "seq": 8, "n_layer": 1, "d_model": 16, "n_head": 4, "vocab": 32, "n_ctx": 8}
#: A one-block GPT-2 (fused QKV attention, tied embedding / LM head).
GPT2 = {"name": "gpt2", "config": TINY}
#: A one-layer BERT (separate Q, K, V; all six linears under one parent module).
BERT = {"name": "bert-base", "config": {**TINY, "d_ff": 32}}


def reference(model: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one full-batch step in this process."""
    seed_everything(0)
    zm = load_model(model)
    loss = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs)
    loss.backward()
    return loss.item(), {n: p.grad for n, p in zm.module.named_parameters()}


def fx_names(model: dict) -> list[str]:
    """Compute-node names of the exported program (full batch)."""
    seed_everything(0)
    zm = load_model(model)
    return [
        n.name for n in compute_nodes(export_with_loss(zm.module, zm.example_inputs, zm.loss_fn))
    ]


def check_grads(grads_by_rank: list[dict], model: dict, loss: float | None = None) -> None:
    """Every gradient any rank reports equals the reference; together they cover every parameter."""
    ref_loss, grads = reference(model)
    if loss is not None:
        assert loss == pytest.approx(ref_loss, abs=TOL)
    seen: set[str] = set()
    for r in grads_by_rank:
        for name, g in r.items():
            torch.testing.assert_close(torch.tensor(g), grads[name], atol=TOL, rtol=0)
            seen.add(name)
    assert seen == set(grads)  # every parameter's gradient was produced by some rank


def check_against_reference(results: list[dict], model: dict) -> None:
    check_grads([r["grads"] for r in results], model, results[0]["loss"])


def run(spec: RunSpec) -> list[dict]:
    """Run ``spec`` on ``spec.world_size`` spawned ranks; per-rank records with gradients."""
    return spawn(run_rank, spec.world_size, (spec.to_json(), None, True), timeout_s=170)
