"""Export a model with its loss to an FX graph and cut it into per-device / per-stage sub-modules."""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from graphs.extraction import WithLoss  # the extractor's wrapper: same export, same node names

#: Prefix of the wrapped model's parameters in the exported program.
MODEL_PREFIX = "model."


def export_with_loss(
    model: nn.Module, inputs: Sequence[torch.Tensor], loss_fn: Callable[..., torch.Tensor]
) -> fx.GraphModule:
    """``torch.export`` of ``loss_fn(model(*inputs), *inputs)``, unlifted: parameters are
    ``get_attr`` nodes that share storage with ``model``'s parameters.

    Compute nodes keep their ``torch.export`` names (``linear``, ``relu_1``, ...), the
    names graph extraction gives forward nodes. The returned graph has one output:
    the scalar loss.
    """
    ep = torch.export.export(WithLoss(model, loss_fn), tuple(inputs))
    gm = ep.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    out = next(n for n in gm.graph.nodes if n.op == "output")
    vals = out.args[0]
    if isinstance(vals, (tuple, list)):
        if len(vals) != 1:
            raise ValueError(
                f"export_with_loss: loss_fn must return one scalar tensor, the graph returns {len(vals)} values"
            )
    return gm


def compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The ``call_function`` nodes of ``gm`` in graph (topological) order."""
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def loss_node(gm: fx.GraphModule) -> fx.Node:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    v = out.args[0]
    v = v[0] if isinstance(v, (tuple, list)) else v
    if not isinstance(v, fx.Node) or v.op != "call_function":
        raise ValueError("exported program: the loss must be computed by an op of the graph")
    return v


def param_name(target: str) -> str:
    """A model parameter's name (``fc1.weight``) from its get_attr target (``model.fc1.weight``)."""
    return target[len(MODEL_PREFIX) :] if target.startswith(MODEL_PREFIX) else target


def canonical_params(gm: nn.Module) -> dict[str, str]:
    """Every parameter target of ``gm`` (``model.lm_head.weight``) -> the model's name of that
    parameter (``wte.weight``): tied parameters reached under several names map to the first,
    the name ``named_parameters()`` of the model gives them."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for target, p in gm.named_parameters(remove_duplicate=False):
        out[target] = first.setdefault(id(p), param_name(target))
    return out


def _is_tuple_source(n: fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (tuple, list))


def assign(gm: fx.GraphModule, known: Mapping[str, int], *, default: int = 0) -> dict[str, int]:
    """Give every compute node of ``gm`` a value (device or stage) from ``known`` (by node name).

    Nodes missing from ``known`` (ops the graph extraction folded away, such as views)
    take the largest value of their already-valued inputs, else the smallest value of
    their users, else ``default``; so inherited values never make a monotone
    (pipeline-stage) assignment non-monotone. ``getitem`` nodes always follow their
    tuple-producing source, so tuples never cross a boundary.
    """
    nodes = compute_nodes(gm)
    out: dict[str, int] = {}
    for n in nodes:
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            src = n.args[0]
            if src.name in out:
                out[n.name] = out[src.name]
                continue
        if n.name in known:
            out[n.name] = int(known[n.name])
            continue
        preds = [
            out[a.name] for a in n.all_input_nodes if a.op == "call_function" and a.name in out
        ]
        if preds:
            out[n.name] = max(preds)
    for n in reversed(nodes):
        if n.name not in out:
            users = [out[u.name] for u in n.users if u.name in out]
            out[n.name] = min(users) if users else int(default)
    # tuple producers and their getitems share a value (set from the producer)
    for n in nodes:
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            if n.args[0].name in out:
                out[n.name] = out[n.args[0].name]
    return out


def cross_device_depth(gm: fx.GraphModule, device: Mapping[str, int]) -> dict[str, int]:
    """Per compute node, the largest number of device changes on any path reaching it.

    Every edge ``u -> v`` has ``depth(v) >= depth(u) + [device(u) != device(v)]``, so
    partitions keyed by ``(depth, device)`` and ordered by that key never form a cycle.
    """
    depth: dict[str, int] = {}
    for n in compute_nodes(gm):
        d = 0
        for a in n.all_input_nodes:
            if a.name in depth:
                d = max(d, depth[a.name] + int(device[a.name] != device[n.name]))
        depth[n.name] = d
    return depth


@dataclass
class Partition:
    """A connected piece of the program that runs on one device.

    ``inputs`` are names of values produced elsewhere (other partitions or graph
    placeholders); ``outputs`` are names of values this partition produces that
    are needed elsewhere (including the loss). ``module(*inputs) -> tuple(outputs)``.
    """

    key: tuple[int, ...]
    device: int
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    module: fx.GraphModule
    params: list[str] = field(default_factory=list)


def build_submodule(
    gm: fx.GraphModule, nodes: Sequence[str], inputs: Sequence[str], outputs: Sequence[str]
) -> fx.GraphModule:
    """A GraphModule computing ``outputs`` from ``inputs`` with ``nodes`` of ``gm``.

    Parameters (``get_attr``) are copied into the sub-graph and shared with ``gm``.
    An output may also be an input (passed through).
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for name in inputs:
        env[name] = g.placeholder(name)
    for name in nodes:
        node = by_name[name]
        for a in node.all_input_nodes:
            if a.name not in env:
                if a.op != "get_attr":
                    raise ValueError(
                        f"build_submodule: node {name!r} needs {a.name!r}, which is neither "
                        "an input nor computed in this partition"
                    )
                env[a.name] = g.node_copy(a)
        env[name] = g.node_copy(node, lambda x: env[x.name])
    g.output(tuple(env[o] for o in outputs))
    return fx.GraphModule(gm, g)


def split(
    gm: fx.GraphModule, key: Mapping[str, tuple[int, ...]], device: Mapping[str, int]
) -> list[Partition]:
    """Cut ``gm`` into partitions by ``key`` (a tuple per compute node), ordered by key.

    The caller guarantees that ordering partitions by key is a topological order
    (true for ``(cross_device_depth, device)`` and for monotone pipeline stages).
    """
    nodes = compute_nodes(gm)
    by_key: dict[Hashable, list[fx.Node]] = {}
    for n in nodes:
        by_key.setdefault(key[n.name], []).append(n)
    lossn = loss_node(gm)
    canon = canonical_params(gm)
    parts = []
    for k in sorted(by_key):
        members = by_key[k]
        names = {n.name for n in members}
        inputs: list[str] = []
        for n in members:
            for a in n.all_input_nodes:
                if (
                    a.op in ("call_function", "placeholder")
                    and a.name not in names
                    and a.name not in inputs
                ):
                    inputs.append(a.name)
        outputs = [
            n.name
            for n in members
            if n is lossn or any(u.op == "call_function" and u.name not in names for u in n.users)
        ]
        params = sorted(
            {
                canon[str(a.target)]
                for n in members
                for a in n.all_input_nodes
                if a.op == "get_attr" and str(a.target) in canon
            }
        )
        devs = {device[n.name] for n in members}
        if len(devs) != 1:
            raise ValueError(f"split: partition {k} spans devices {sorted(devs)}")
        mod = build_submodule(gm, [n.name for n in members], inputs, outputs)
        parts.append(
            Partition(
                tuple(k) if isinstance(k, tuple) else (k,),
                devs.pop(),
                [n.name for n in members],
                inputs,
                outputs,
                mod,
                params,
            )
        )
    for i, p in enumerate(parts):
        for name in p.inputs:
            prod = next((j for j, q in enumerate(parts) if name in q.nodes), None)
            if prod is not None and prod >= i:
                raise ValueError(
                    f"split: partition {p.key} consumes {name!r} from partition {parts[prod].key}, "
                    "which comes later: the partition order is not topological"
                )
    return parts


def value_meta(gm: fx.GraphModule) -> dict[str, Any]:
    """``node.meta['val']`` (fake tensor with shape and dtype) of every placeholder and compute node."""
    return {
        n.name: n.meta.get("val")
        for n in gm.graph.nodes
        if n.op in ("placeholder", "call_function")
    }


def placement_by_name(
    names: Sequence[str], placement: Sequence[int], members: Sequence[Sequence[str]] | None = None
) -> dict[str, int]:
    """Map original (FX) node names to a value: ``names[i] -> placement[i]``, expanding
    coarse nodes through ``members`` (``meta['members']`` of a coarsened graph)."""
    out: dict[str, int] = {}
    for i, nm in enumerate(names):
        for m in members[i] if members is not None else [nm]:
            out[str(m)] = int(placement[i])
    return out
