"""Tests for graphs.extraction on tiny modules with hand-computed costs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from graphs.compgraph import BWD, FWD, OPT
from graphs.extraction import export_program, extract


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _mlp_graph():
    with torch.device("meta"):
        m = MLP()
    x = torch.empty(2, 4, device="meta")
    return extract(m, (x,), name="mlp", loss_fn=lambda out, x: out.sum())


def test_mlp_forward_costs_by_hand() -> None:
    g = _mlp_graph()
    f = g.kind == FWD
    assert [g.name[i] for i in np.flatnonzero(f)] == ["linear", "relu", "linear_1", "sum_1"]
    # linear 2*B*out*in, relu 1/elem, linear_1, sum 6/elem of its input (loss rule)
    np.testing.assert_allclose(g.flops[f], [2 * 2 * 8 * 4, 16, 2 * 2 * 3 * 8, 6])
    np.testing.assert_allclose(g.out_bytes[f], [32, 32, 12, 2])  # fp16 activations
    np.testing.assert_allclose(g.param_bytes[f], [40 * 16, 0, 27 * 16, 0])
    # relu saves its output; linear_1 reads that same tensor (counted once); the user input
    # x is not an activation of the graph
    np.testing.assert_allclose(g.act_bytes[f], [0, 32, 0, 0])
    # bytes accessed: fp16 inputs (parameters included) + output
    np.testing.assert_allclose(g.bytes_accessed[f], [16 + 80 + 32, 64, 32 + 54 + 12, 14])
    assert g.num_params == 67
    assert g.module[:3] == ("fc1", "", "fc2")
    assert g.meta["bytes_per_param"] == 16.0 and g.meta["name"] == "mlp"


def test_mlp_training_nodes() -> None:
    g = _mlp_graph()
    assert (g.kind == BWD).sum() == 4 and (g.kind == OPT).sum() == 2
    assert g.total_flops(BWD) == pytest.approx(2 * 128 + 16 + 2 * 96 + 6)
    assert g.total_flops(OPT) == pytest.approx(12 * 67)
    assert g.group[g.index("bwd:linear")] == g.group[g.index("linear")]
    edges = {(g.name[s], g.name[d]): b for s, d, b in zip(g.src, g.dst, g.edge_bytes)}
    assert edges[("linear", "relu")] == 32 and edges[("bwd:relu", "bwd:linear")] == 32


def test_frozen_parameters_hold_weights_only_and_need_no_gradient_or_optimizer() -> None:
    # fc1 frozen (fine-tuning the head): its 40 parameters are 40 fp16 weights (80 bytes),
    # no gradient or Adam state; fc1 needs no backward at all (its input is the user's
    # data), so relu needs none either; fc2 (27 parameters) trains as before
    with torch.device("meta"):
        m = MLP()
    m.fc1.requires_grad_(False)
    g = extract(m, (torch.empty(2, 4, device="meta"),), loss_fn=lambda out, x: out.sum())
    f = g.kind == FWD
    np.testing.assert_allclose(g.param_bytes[f], [40 * 2, 0, 27 * 16, 0])
    assert g.num_params == 67 and g.meta["frozen_params"] == 40
    assert [g.name[i] for i in np.flatnonzero(g.kind == BWD)] == ["bwd:linear_1", "bwd:sum_1"]
    assert [g.name[i] for i in np.flatnonzero(g.kind == OPT)] == ["opt:linear_1"]
    assert g.total_flops(OPT) == pytest.approx(12 * 27)
    # frozen fc2 behind a trained fc1: fc2 still needs grad-input (factor 1, no grad-weight)
    with torch.device("meta"):
        m = MLP()
    m.fc2.requires_grad_(False)
    g = extract(m, (torch.empty(2, 4, device="meta"),), loss_fn=lambda out, x: out.sum())
    assert g.flops[g.index("bwd:linear_1")] == pytest.approx(2 * 2 * 3 * 8)
    assert g.flops[g.index("bwd:linear")] == pytest.approx(2 * 2 * 2 * 8 * 4)
    assert [g.name[i] for i in np.flatnonzero(g.kind == OPT)] == ["opt:linear"]
    assert g.num_params == 67 and g.meta["frozen_params"] == 27


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(x).split(8, dim=-1)
        q, k, v = (t.view(2, 5, 2, 4).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (att @ v).transpose(1, 2).reshape(2, 5, 8)


def test_views_are_folded_into_producers() -> None:
    with torch.device("meta"):
        m = Views()
    g = extract(m, (torch.empty(2, 5, 8, device="meta"),), training=False)
    assert g.name == ("linear", "matmul", "softmax", "matmul_1")
    edges = {(g.name[s], g.name[d]): b for s, d, b in zip(g.src, g.dst, g.edge_bytes)}
    # q and k (80 elements each, fp16) come from linear's 240-element output
    assert edges[("linear", "matmul")] == 2 * 80 * 2
    assert edges[("linear", "matmul_1")] == 80 * 2  # v
    assert edges[("softmax", "matmul_1")] == 2 * 2 * 5 * 5 * 2
    assert g.flops[1] == 2 * (2 * 2 * 5 * 5) * 4  # 2 * out.numel() * head_dim


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


def test_tied_parameters_counted_once() -> None:
    with torch.device("meta"):
        m = Tied()
    g = extract(m, (torch.empty(2, 3, dtype=torch.long, device="meta"),), training=False)
    assert g.num_params == 40
    assert g.param_bytes[g.index("embedding")] == 40 * 16
    assert g.meta["shared_params"] == [["embedding", "linear"]]


def test_meta_and_real_tensors_give_the_same_graph_and_names() -> None:
    torch.manual_seed(0)
    real = MLP()
    x = torch.randn(2, 4)
    g_real = extract(real, (x,), loss_fn=lambda out, x: out.sum())
    assert g_real.content_hash() == _mlp_graph().content_hash()
    ep = export_program(real, (x,), lambda out, x: out.sum())
    fx_names = [n.name for n in ep.graph.nodes if n.op == "call_function"]
    assert set(g_real.name[: (g_real.kind == FWD).sum()]) <= set(fx_names)


def test_precision_options_and_errors() -> None:
    with torch.device("meta"):
        m = MLP()
    x = torch.empty(2, 4, device="meta")
    g = extract(m, (x,), precision="fp32", optimizer="sgd", training=False)
    assert g.meta["bytes_per_param"] == 12.0 and g.out_bytes[0] == 2 * 8 * 4
    with pytest.raises(ValueError, match="unsupported precision/optimizer"):
        extract(m, (x,), precision="fp8")


class ScaledAttentionLike(nn.Module):
    """q = fc(x); s = softmax(where(mask, q * 0.5, -inf)); y = s * q (an activation product)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4, 4, dtype=torch.bool).tril())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.fc(x)
        s = torch.softmax(torch.where(self.mask, q * 0.5, float("-inf")), dim=-1)
        return s * torch.tanh(q)


def test_saved_activation_rules_scalar_mul_constant_mask_and_shared_save() -> None:
    with torch.device("meta"):
        m = ScaledAttentionLike()
    g = extract(
        m, (torch.empty(4, 4, device="meta"),), name="sal", loss_fn=lambda out, x: out.sum()
    )
    f = np.flatnonzero(g.kind == FWD)
    act = {g.name[i]: g.act_bytes[i] for i in f}
    elem = 16 * 2  # a (4, 4) fp16 activation
    assert act["linear"] == 0  # its input x is the user's input, not an activation of the graph
    assert act["mul"] == 0  # scaling by a constant saves nothing
    assert act["where"] == 0  # the condition is a constant buffer
    assert act["softmax"] == elem  # softmax saves its output
    assert act["tanh"] == elem  # tanh saves its output
    # s * tanh(q): both operands need gradients, both are already saved by their producers
    assert act["mul_1"] == 0
