"""Export-and-split: partitions keyed by (cross-device depth, device) are acyclic and compute the same loss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.dist import seed_everything
from runtime.program import (
    assign,
    compute_nodes,
    cross_device_depth,
    export_with_loss,
    loss_node,
    split,
)
from runtime.toy import branchy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def program():
    seed_everything(0)
    zm = branchy()
    gm = export_with_loss(zm.module, zm.example_inputs, zm.loss_fn)
    with torch.no_grad():
        ref = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs).item()
    return gm, zm.example_inputs, ref


def run_partitions(parts, placeholders, inputs, loss_name):
    """Execute partitions in order in one process (what the ranks do together)."""
    vals = dict(zip(placeholders, inputs))
    for p in parts:
        outs = p.module(*[vals[n] for n in p.inputs])
        vals.update(zip(p.outputs, outs))
    return float(vals[loss_name].detach())


def test_export_names_and_loss(program):
    gm, inputs, ref = program
    names = [n.name for n in compute_nodes(gm)]
    assert names[:5] == ["linear", "relu", "linear_1", "tanh", "add"]
    assert loss_node(gm).name == "mean"
    with torch.no_grad():
        assert gm(*inputs).item() == pytest.approx(ref, abs=1e-6)


def test_depth_hand_computed(program):
    gm, _, _ = program
    # ping-pong: linear(0) relu(1) linear_1(0) tanh(1) add(0) ...
    dev = assign(gm, {"linear": 0, "relu": 1, "linear_1": 0, "tanh": 1, "add": 0}, default=0)
    depth = cross_device_depth(gm, dev)
    # linear 0 -> relu 1 (depth 1) -> add on 0 (depth 2); linear_1 -> tanh (depth 1)
    assert depth["linear"] == 0 and depth["linear_1"] == 0
    assert depth["relu"] == 1 and depth["tanh"] == 1
    assert depth["add"] == 2
    # unplaced nodes inherit from their first placed input
    assert dev["linear_2"] == 0


def test_assign_inherits_and_defaults(program):
    gm, _, _ = program
    out = assign(gm, {"relu": 1}, default=0)
    assert out["relu"] == 1
    assert out["linear"] == 1  # no placed input: takes its first user's value
    assert out["add"] == 1  # the largest value among its computed inputs (relu: 1)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=13, max_size=13))
def test_any_placement_splits_into_a_dag_with_the_same_loss(program, devs):
    gm, inputs, ref = program
    names = [n.name for n in compute_nodes(gm)]
    dev = assign(gm, dict(zip(names, devs)))
    depth = cross_device_depth(gm, dev)
    parts = split(gm, {n: (depth[n], dev[n]) for n in dev}, dev)  # raises if not topological
    assert sorted(n for p in parts for n in p.nodes) == sorted(names)
    for p in parts:
        assert {dev[n] for n in p.nodes} == {p.device}
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    assert run_partitions(parts, placeholders, inputs, loss_node(gm).name) == pytest.approx(
        ref, abs=1e-6
    )


def test_split_refuses_a_non_topological_key(program):
    gm, _, _ = program
    names = [n.name for n in compute_nodes(gm)]
    dev = {n: 0 for n in names}
    key = {n: (1,) if n == "linear" else (0,) for n in names}  # producer after consumer
    with pytest.raises(ValueError, match="not topological"):
        split(gm, key, dev)


def test_parameters_are_shared_with_the_model(program):
    gm, _, _ = program
    params = dict(gm.named_parameters())
    assert any(k.startswith("model.") for k in params)
    w = gm.get_parameter("model.a.weight")
    assert isinstance(w, torch.nn.Parameter)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.booleans(), min_size=13, max_size=13), st.integers(1, 12))
def test_inherited_stages_stay_monotone(program, named, cut):
    """Ops missing from the plan never create an edge from a later stage to an earlier one."""
    gm, _, _ = program
    nodes = compute_nodes(gm)
    known = {n.name: int(i >= cut) for i, n in enumerate(nodes) if named[i]}
    stage = assign(gm, known)
    for n in nodes:
        for a in n.all_input_nodes:
            if a.op == "call_function":
                assert stage[a.name] <= stage[n.name]


def test_tied_parameters_get_one_name():
    """GPT-2's LM head reads ``lm_head.weight``, the same parameter as ``wte.weight``: a
    partition holding only the head must list it as ``wte.weight`` (so its gradient is
    summed with the embedding's), not as a second parameter."""
    from runtime.model import load_model
    from runtime.program import canonical_params
    from tests.runtime._reference import GPT2

    seed_everything(0)
    zm = load_model(GPT2)
    gm = export_with_loss(zm.module, zm.example_inputs, zm.loss_fn)
    canon = canonical_params(gm)
    assert canon["model.lm_head.weight"] == canon["model.wte.weight"] == "wte.weight"
    names = [n.name for n in compute_nodes(gm)]
    head = names.index("linear_4")  # the LM head and the loss on device 1
    dev = {n: int(i >= head) for i, n in enumerate(names)}
    parts = split(gm, {n: (dev[n],) for n in dev}, dev)
    assert [p.device for p in parts] == [0, 1]
    assert parts[1].params == ["wte.weight"] and "wte.weight" in parts[0].params
