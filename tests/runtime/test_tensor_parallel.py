"""Tensor-parallel plans: Megatron styles by data flow, whole heads per rank, fused QKV layout, refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.launch import spawn
from runtime.model import load_model
from runtime.tensor_parallel import check_tensor_parallel, fused_permutation
from tests.runtime import _workers
from tests.runtime._reference import BERT, GPT2, check_grads

pytestmark = pytest.mark.timeout(180)


def with_config(model: dict, **changes) -> dict:
    return {**model, "config": {**model["config"], **changes}}


def test_gpt2_styles_fused_qkv():
    plan = check_tensor_parallel(GPT2, ["h"], 2)
    assert plan.styles() == {
        "h.0.attn.c_attn": "colwise(fused x3)",
        "h.0.attn.c_proj": "rowwise",
        "h.0.mlp.c_fc": "colwise",
        "h.0.mlp.c_proj": "rowwise",
    }
    assert plan.fused == {"h.0.attn.c_attn.weight": 3, "h.0.attn.c_attn.bias": 3}


def test_bert_styles_follow_data_flow_not_registration_order():
    # all six linears share one parent: registration order would make attn_out and
    # intermediate column-parallel; data flow pairs them correctly
    plan = check_tensor_parallel(BERT, ["layers.0"], 2)
    assert plan.styles() == {
        "layers.0.query": "colwise",
        "layers.0.key": "colwise",
        "layers.0.value": "colwise",
        "layers.0.attn_out": "rowwise",
        "layers.0.intermediate": "colwise",
        "layers.0.output": "rowwise",
    }
    assert not plan.fused


def test_heads_not_divisible_are_refused():
    # 16 features split 4 ways is fine, but 2 heads cannot be dealt out whole to 4 ranks
    with pytest.raises(ValueError, match="head count 2 is not divisible by tp degree 4"):
        check_tensor_parallel(with_config(GPT2, n_head=2), ["h"], 4)
    with pytest.raises(ValueError, match="head count 2 is not divisible by tp degree 4"):
        check_tensor_parallel(with_config(BERT, n_head=2), ["layers"], 4)


def test_features_not_divisible_are_refused():
    with pytest.raises(ValueError, match="'h.0.attn.c_attn' has each of its 3 fused chunks of 16"):
        check_tensor_parallel(GPT2, ["h"], 3)
    with pytest.raises(ValueError, match="no linear op"):
        check_tensor_parallel(GPT2, ["nothing.here"], 2)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_fused_permutation_deals_whole_chunks(chunks, degree, per, cols):
    rows = chunks * degree * per
    w = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)
    p = fused_permutation(w, chunks, degree)
    assert torch.equal(fused_permutation(p, chunks, degree, inverse=True), w)
    c = rows // chunks
    for r, block in enumerate(p.chunk(degree)):  # rank r's shard: its slice of every chunk
        expect = torch.cat([w[i * c + r * per : i * c + (r + 1) * per] for i in range(chunks)])
        assert torch.equal(block, expect)


def test_whole_heads_per_rank_and_no_gather():
    """2 ranks: GPT-2 (fused QKV) and BERT (separate Q/K/V) attention + MLP sharded.

    Loss and every gradient equal one process; each rank's Q/K/V weight shard is whole
    heads (rows of heads 2r, 2r+1 of each of Q, K, V); and no collective gathers an
    activation (attention runs on local heads; only row-parallel reductions)."""
    cases = [(GPT2, ["h"]), (BERT, ["layers"])]
    qkvs = [["h.0.attn.c_attn.weight"], [f"layers.0.{m}.weight" for m in ("query", "key", "value")]]
    per_rank = spawn(_workers.tp_steps_with_comms, 2, (cases,), timeout_s=150)
    for k, ((model, _), qkv) in enumerate(zip(cases, qkvs)):
        results = [r[k] for r in per_rank]
        check_grads([r["grads"] for r in results], model, results[0]["loss"])
        full = dict(load_model_weights(model))
        d, hd = 16, 4
        for rank, r in enumerate(results):
            assert r["comms"].get("c10d_functional.all_gather_into_tensor", 0) == 0, r["comms"]
            assert r["comms"].get("c10d_functional.all_reduce", 0) >= 2  # row-parallel sums
            local = torch.cat([torch.tensor(r["local"][n]) for n in qkv])
            w = full[qkv[0]] if len(qkv) == 1 else torch.cat([full[n] for n in qkv])
            heads = slice(rank * 2 * hd, (rank + 1) * 2 * hd)  # heads 2r and 2r+1
            expect = torch.cat([w[i * d : (i + 1) * d][heads] for i in range(3)])
            assert torch.equal(local, expect)


def load_model_weights(model: dict) -> dict[str, torch.Tensor]:
    from runtime.dist import seed_everything

    seed_everything(0)
    return {n: p.detach() for n, p in load_model(model).module.named_parameters()}
