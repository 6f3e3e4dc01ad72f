"""Extract a training CompGraph from a PyTorch module with torch.export on meta/fake tensors."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import flop_registry

from graphs.compgraph import CompGraph
from graphs.training import with_backward

#: Persistent bytes per parameter, by (precision, optimizer).
STATE_BYTES: dict[tuple[str, str], float] = {
    ("mixed", "adam"): 16.0,  # fp16 weight + fp16 grad + fp32 master + fp32 m + fp32 v
    ("mixed", "sgd"): 12.0,  # fp16 weight + fp16 grad + fp32 master + fp32 momentum
    ("fp32", "adam"): 16.0,  # weight + grad + m + v
    ("fp32", "sgd"): 12.0,  # weight + grad + momentum
    ("bf16", "adam"): 8.0,  # bf16 weight + grad + m + v (pure bf16 training)
    ("bf16", "sgd"): 6.0,
}
#: Optimizer flops per parameter per step.
OPT_FLOPS: dict[str, float] = {"adam": 12.0, "sgd": 4.0}
#: Bytes per element of floating-point activations and gradients.
ACT_ELEM_BYTES: dict[str, int] = {"mixed": 2, "fp32": 4, "bf16": 2}

# ops folded into their producer (no compute; consumers read the producer's output)
VIEW_OPS = frozenset(
    """view reshape _unsafe_view expand expand_as permute transpose t slice select
    unsqueeze squeeze getitem split split_with_sizes chunk unbind narrow as_strided alias
    detach flatten unflatten view_as contiguous clone to _to_copy type_as lift_fresh_copy
    dropout_eval""".split()
)
# ops that do not touch tensor data at all (asserts, shape queries)
SKIP_OPS = frozenset(
    "_assert_tensor_metadata _assert_scalar sym_size sym_numel sym_stride "
    "sym_constrain_range_for_size".split()
)
# matmul-like ops: flops = 2 * out.numel() * K (K = contraction length)
MATMUL_OPS = frozenset("linear matmul mm bmm addmm baddbmm einsum".split())
# flops per output element of elementwise/normalisation ops (not in FlopCounterMode)
ELEM_FLOPS: dict[str, float] = {
    **dict.fromkeys(
        "add sub mul div neg rsub abs where masked_fill clamp clamp_min clamp_max minimum "
        "maximum eq ne lt le gt ge logical_not logical_and bitwise_not fill zeros_like ones_like "
        "full_like new_zeros new_ones relu relu_ threshold hardtanh leaky_relu square reciprocal "
        "embedding index_select gather index scatter_add index_add scatter add_ mul_ copy_".split(),
        1.0,
    ),
    **dict.fromkeys("sqrt rsqrt exp log pow sigmoid tanh sin cos erf silu mish".split(), 4.0),
    **dict.fromkeys("gelu softplus".split(), 8.0),
    **dict.fromkeys("softmax log_softmax _softmax _log_softmax".split(), 5.0),
    **dict.fromkeys("layer_norm native_layer_norm group_norm".split(), 8.0),
    **dict.fromkeys("rms_norm _fused_rms_norm".split(), 5.0),
    **dict.fromkeys(
        "batch_norm native_batch_norm _native_batch_norm_legit "
        "_native_batch_norm_legit_functional _native_batch_norm_legit_no_training".split(),
        8.0,
    ),
    **dict.fromkeys("dropout native_dropout".split(), 2.0),
    **dict.fromkeys("cat stack copy arange full zeros ones empty topk sort cumsum".split(), 0.0),
}
# ops whose flops scale with the input size (reductions, pooling, losses)
INPUT_FLOPS: dict[str, float] = {
    **dict.fromkeys("sum mean amax amin max min prod var std norm logsumexp argmax".split(), 1.0),
    **dict.fromkeys(
        "max_pool2d max_pool2d_with_indices avg_pool2d adaptive_avg_pool2d".split(), 1.0
    ),
    **dict.fromkeys("cross_entropy_loss nll_loss nll_loss_forward mse_loss".split(), 6.0),
    **dict.fromkeys("topk sort".split(), 2.0),
}
ATTENTION_OPS = frozenset(
    "scaled_dot_product_attention _scaled_dot_product_flash_attention "
    "_scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention_for_cpu".split()
)
# ops whose backward needs none of their inputs (the saved-activation rule)
SAVES_NOTHING = frozenset(
    "add sub neg rsub cat stack copy sum mean arange full zeros ones empty zeros_like ones_like "
    "full_like new_zeros new_ones fill eq ne lt le gt ge logical_not logical_and bitwise_not "
    "topk sort argmax cumsum".split()
)
# binary products: the gradient of one operand needs the other (a constant scalar saves nothing)
SAVES_OTHER_OPERAND = frozenset("mul div".split())
# selects: backward needs only the boolean condition (a constant mask saves nothing)
SAVES_CONDITION = frozenset("where masked_fill".split())
SAVES_OUTPUT = frozenset(
    "softmax _softmax log_softmax _log_softmax exp sigmoid tanh relu relu_ sqrt rsqrt".split()
)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []


def _op_name(target: Any) -> str:
    """'aten.linear.default' -> 'linear'; python callables -> their __name__."""
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def _is_identity_dropout(node: torch.fx.Node) -> bool:
    """``aten.dropout(x, p, train)`` with ``p == 0`` or ``train=False`` is the identity."""
    args = list(node.args) + [None, None]
    p = node.kwargs.get("p", args[1])
    train = node.kwargs.get("train", args[2])
    return p == 0 or train is False


def _is_bool(node: torch.fx.Node) -> bool:
    vals = _tensors(node.meta.get("val"))
    return bool(vals) and all(t.dtype == torch.bool for t in vals)


def _numel(t: torch.Tensor) -> int:
    return int(math.prod(int(s) for s in t.shape))


class WithLoss(nn.Module):
    """Wraps ``model`` so that ``forward(*inputs)`` returns ``loss_fn(model(*inputs), *inputs)``."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.model(*inputs), *inputs)


def export_program(
    module: nn.Module,
    example_inputs: Sequence[Any],
    loss_fn: Callable[..., torch.Tensor] | None = None,
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` (with ``loss_fn`` appended if given), as used by :func:`extract`.

    The FX node names of this program are the forward node names of the
    extracted graph, so a runtime can map graph nodes to ops by name. Works on
    real, meta or fake tensors alike.
    """
    root = WithLoss(module, loss_fn) if loss_fn is not None else module
    return torch.export.export(root, tuple(example_inputs), strict=False)


def _module_path(node: torch.fx.Node, strip: str) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\['self'\]\.?", "", path)
    if strip and (path == strip or path.startswith(strip + ".")):
        path = path[len(strip) + 1 :]
    return path


def _layer_ids(modules: Sequence[str]) -> np.ndarray:
    """Layer index per node: order of first appearance of the module prefix up to its first number."""
    ids: dict[str, int] = {}
    out = np.full(len(modules), -1, dtype=np.int64)
    for i, m in enumerate(modules):
        match = re.match(r"^(.*?\.\d+)(\.|$)", m)
        if match:
            out[i] = ids.setdefault(match.group(1), len(ids))
    return out


def _op_flops(
    op: str, args: Sequence[Any], kwargs: dict[str, Any], out: list[torch.Tensor]
) -> float:
    out_numel = sum(_numel(t) for t in out)
    ins = _tensors(list(args)) + _tensors(list(kwargs.values()))
    if op in ("mm", "addmm", "bmm", "baddbmm"):
        packet = getattr(torch.ops.aten, op)
        a = [x for x in args if isinstance(x, torch.Tensor)]
        if op in ("addmm", "baddbmm"):
            a = a[1:]
        return float(flop_registry[packet](a[0].shape, a[1].shape, out_shape=out[0].shape))
    if op in MATMUL_OPS and op != "einsum":
        k = int(ins[0].shape[-1]) if ins and ins[0].dim() else 1
        return 2.0 * out_numel * k
    if op in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose2d"):
        w = ins[1]
        per_out = math.prod(int(s) for s in w.shape[1:])
        if op == "conv_transpose2d":
            return 2.0 * _numel(ins[0]) * int(w.shape[1]) * math.prod(int(s) for s in w.shape[2:])
        return 2.0 * out_numel * per_out
    if op in ATTENTION_OPS:
        q, k, v = ins[0], ins[1], ins[2]
        lq, lk = int(q.shape[-2]), int(k.shape[-2])
        batch = math.prod(int(s) for s in q.shape[:-2])
        return 2.0 * batch * lq * lk * (int(q.shape[-1]) + int(v.shape[-1])) + 5.0 * batch * lq * lk
    if op == "lstm_cell":
        x, h = ins[0], ins[1]
        return 2.0 * _numel(x) / x.shape[-1] * 4 * h.shape[-1] * (x.shape[-1] + h.shape[-1])
    if op in INPUT_FLOPS:
        return INPUT_FLOPS[op] * (_numel(ins[0]) if ins else out_numel)
    return ELEM_FLOPS.get(op, 1.0) * out_numel


def extract(
    module: nn.Module,
    example_inputs: Sequence[Any],
    *,
    name: str | None = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    precision: str = "mixed",
    optimizer: str = "adam",
    training: bool = True,
    batch: int | None = None,
) -> CompGraph:
    """Training graph of ``module`` on ``example_inputs`` via ``torch.export``.

    Build ``module`` under ``torch.device("meta")`` (and pass meta inputs) so
    that no weights are allocated; real tensors work as well, only slower.

    Forward nodes are the compute ops of the exported program (see
    :func:`export_program`), named by their FX node names; view-like ops
    (``VIEW_OPS``: view, reshape, permute, transpose, slice, getitem, ...) are
    folded into their producers, so an edge goes from the op that computed a
    tensor to each op that reads it (bytes = the smaller of the produced tensor
    and the view read, summed over views of one producer read by one op).

    Costs per forward op:

    * ``flops``: matmul-like ops ``2 * out.numel() * K``; mm/addmm/bmm from
      ``torch.utils.flop_counter``; convolution ``2 * out.numel() * Cin/g * kh * kw``;
      attention ``2 * B*H * Lq * Lk * (Dqk + Dv) + 5 * B*H*Lq*Lk``; elementwise,
      softmax, norms, dropout, embedding ``c * out.numel()`` with ``c`` from
      ``ELEM_FLOPS``; reductions, pooling, losses ``c * in.numel()``.
    * ``bytes_accessed``: bytes of the distinct input tensors (parameters
      included) + output bytes; ``out_bytes``: output bytes. Floating tensors
      count ``ACT_ELEM_BYTES[precision]`` bytes per element (2 for mixed
      precision), others their dtype size.
    * ``param_bytes``: ``bytes_per_param`` (``STATE_BYTES[precision, optimizer]``,
      16 for mixed-precision Adam) per parameter, on the first op that reads
      the parameter; tied parameters are counted once; the other ops reading a
      shared parameter are listed in ``meta["shared_params"]``. A frozen
      parameter (``requires_grad=False``) counts its weight bytes only, needs no
      gradient, optimizer node or grad-weight work; ``meta["frozen_params"]`` /
      ``meta["frozen_param_bytes"]`` total them.
    * ``act_bytes`` (saved for backward), for ops that need gradients: the
      output for ops in ``SAVES_OUTPUT`` (softmax, exp, tanh, relu, ...),
      nothing for ``SAVES_NOTHING`` (add, sum, cat, ...), for ``mul``/``div``
      each activation operand whose partner needs a gradient (so scaling by a
      constant saves nothing), for ``where``/``masked_fill`` only a computed
      boolean condition (a constant mask saves nothing), otherwise the
      activation inputs (not parameters); dropout saves a 1-byte mask per
      element, embedding its indices. A tensor saved by several ops is
      counted once, on the first.

    Backward and optimizer nodes come from :func:`graphs.training.with_backward`
    with a per-op backward factor: 2 for ops reading parameters (grad-input and
    grad-weight), 2 for attention, else 1. ``training=False`` returns the
    forward graph only.
    """
    key = (precision, optimizer)
    if key not in STATE_BYTES:
        raise ValueError(
            f"extract: unsupported precision/optimizer {key}; expected one of {sorted(STATE_BYTES)}"
        )
    elem_bytes = ACT_ELEM_BYTES[precision]
    bpp = STATE_BYTES[key]
    ep = export_program(module, example_inputs, loss_fn)
    strip = "model" if loss_fn is not None else ""
    sig = ep.graph_signature
    param_of = dict(sig.inputs_to_parameters)  # placeholder name -> parameter FQN
    root = WithLoss(module, loss_fn) if loss_fn is not None else module
    pid = {n: id(p) for n, p in root.named_parameters(remove_duplicate=False)}
    # frozen parameters (requires_grad=False: fine-tuning, adapters) hold their weights only:
    # no gradient, no optimizer state, no grad-weight work (until 29 Nov 2026 they were
    # charged as trainable; found by fuzzing)
    trainable = {n for n, p in root.named_parameters(remove_duplicate=False) if p.requires_grad}
    frozen_count = 0.0
    frozen_bytes = 0.0

    def nbytes(t: torch.Tensor) -> float:
        size = elem_bytes if t.dtype.is_floating_point else t.element_size()
        return float(_numel(t) * size)

    # ---- walk the FX graph: compute nodes, view folding
    names: list[str] = []
    mods: list[str] = []
    flops: list[float] = []
    bacc: list[float] = []
    outb: list[float] = []
    actb: list[float] = []
    pbytes: list[float] = []
    ptrain: list[float] = []  # parameters per op that the optimizer updates
    needs_grad: list[bool] = []
    bwd_factor: list[float] = []
    edges: dict[tuple[int, int], float] = {}
    # fx node -> (compute index or -1, produced bytes of the root, bytes of this view, requires_grad)
    src_of: dict[torch.fx.Node, tuple[int, float, float, bool]] = {}
    param_owner: dict[int, int] = {}
    param_root: dict[torch.fx.Node, torch.fx.Node] = {}  # param placeholder behind a view
    shared: dict[int, list[str]] = {}
    saved: set[int] = set()  # compute indices whose output is already saved for backward
    unknown: set[str] = set()
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            vals = _tensors(node.meta.get("val"))
            b = sum(nbytes(t) for t in vals)
            is_param = node.name in param_of
            if is_param:
                param_root[node] = node
            src_of[node] = (-1, b, b, is_param and param_of[node.name] in trainable)
            continue
        if node.op != "call_function":
            continue
        op = _op_name(node.target)
        if op in SKIP_OPS:
            continue
        out = _tensors(node.meta.get("val"))
        inputs = [a for a in node.all_input_nodes if a in src_of]
        if op in VIEW_OPS or (op == "dropout" and _is_identity_dropout(node)):
            base = inputs[0] if inputs else None
            if base is None:
                continue
            i, rb, vb, rg = src_of[base]
            src_of[node] = (i, rb, min(vb, sum(nbytes(t) for t in out)) if out else vb, rg)
            if base in param_root:
                param_root[node] = param_root[base]
            continue
        k = len(names)
        names.append(node.name)
        mods.append(_module_path(node, strip))
        if op not in ELEM_FLOPS and op not in INPUT_FLOPS and op not in MATMUL_OPS:
            if op not in ATTENTION_OPS and not op.startswith("conv") and op != "lstm_cell":
                unknown.add(op)
        args_val = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
        kw_val = {
            kk: (a.meta.get("val") if isinstance(a, torch.fx.Node) else a)
            for kk, a in node.kwargs.items()
        }
        flops.append(_op_flops(op, args_val, kw_val, out))
        ob = sum(nbytes(t) for t in out)
        outb.append(ob)
        own = 0.0
        own_train = 0.0
        reads_param = False
        rg_any = False
        per_src: dict[int, float] = {}
        act_in = 0.0
        read = 0.0
        for a in inputs:
            i, rb, vb, rg = src_of[a]
            rg_any |= rg
            if i >= 0:
                per_src[i] = min(rb, per_src.get(i, 0.0) + vb)
                if i not in saved:
                    act_in += vb
            elif a in param_root:
                read += vb
                ph = param_root[a]
                is_trained = param_of[ph.name] in trainable
                reads_param |= is_trained  # grad-weight work only for a trained parameter
                p = pid.get(param_of[ph.name], id(ph))
                if p not in param_owner:
                    param_owner[p] = k
                    t0 = _tensors(ph.meta.get("val"))[0]
                    if is_trained:
                        own += _numel(t0) * bpp
                        own_train += _numel(t0)
                    else:
                        own += nbytes(t0)
                        frozen_count += _numel(t0)
                        frozen_bytes += nbytes(t0)
                shared.setdefault(p, []).append(node.name)
            else:
                read += vb
        for i, b in per_src.items():
            edges[(i, k)] = b
            read += b
        bacc.append(read + ob)
        pbytes.append(own)
        ptrain.append(own_train)
        rg_out = rg_any and any(t.dtype.is_floating_point for t in out)
        needs_grad.append(rg_out or own_train > 0)
        if not rg_out and own_train == 0:
            act = 0.0
        elif op in SAVES_NOTHING:
            act = 0.0
        elif op in SAVES_OUTPUT:
            act = ob
        elif op in ("dropout", "native_dropout"):
            act = ob / elem_bytes
        elif op == "embedding":
            act = sum(src_of[a][2] for a in inputs if a not in param_root)
        elif op in SAVES_OTHER_OPERAND:
            keep = [
                a
                for a in inputs
                if src_of[a][0] >= 0
                and src_of[a][0] not in saved
                and any(src_of[b][3] for b in inputs if b is not a)
            ]
            act = sum(src_of[a][2] for a in keep)
        elif op in SAVES_CONDITION:
            cond = [a for a in inputs if _is_bool(a)]
            act = sum(src_of[a][2] for a in cond if src_of[a][0] >= 0 and src_of[a][0] not in saved)
        else:
            act = act_in
        if op in SAVES_OUTPUT and act > 0:
            saved.add(k)
        elif op in SAVES_OTHER_OPERAND and act > 0:
            saved.update(src_of[a][0] for a in keep)
        elif op in SAVES_CONDITION and act > 0:
            saved.update(src_of[a][0] for a in inputs if _is_bool(a) and src_of[a][0] >= 0)
        elif op not in SAVES_NOTHING and act > 0:
            saved.update(src_of[a][0] for a in inputs if src_of[a][0] >= 0)
        actb.append(act)
        bwd_factor.append(2.0 if reads_param or op in ATTENTION_OPS else 1.0)
        src_of[node] = (k, ob, ob, rg_out or own_train > 0)

    n = len(names)
    e = np.array(list(edges), dtype=np.int64).reshape(-1, 2)
    meta: dict[str, Any] = {
        "name": name or type(module).__name__,
        "batch": int(batch)
        if batch is not None
        else int(_tensors(list(example_inputs))[0].shape[0])
        if _tensors(list(example_inputs))
        else 1,
        "bytes_per_param": bpp,
        "grad_bytes_per_param": float(elem_bytes),
        "precision": precision,
        "optimizer": optimizer,
        "act_elem_bytes": elem_bytes,
        "shared_params": [v for v in shared.values() if len(v) > 1],
        "unknown_ops": sorted(unknown),
        "source": "torch.export",
    }
    if frozen_count:
        meta["frozen_params"] = frozen_count
        meta["frozen_param_bytes"] = frozen_bytes
    fwd = CompGraph.build(
        n,
        e,
        flops=np.array(flops),
        bytes_accessed=np.array(bacc),
        out_bytes=np.array(outb),
        param_bytes=np.array(pbytes),
        act_bytes=np.array(actb),
        name=names,
        module=mods,
        layer=_layer_ids(mods),
        edge_bytes=np.array([edges[tuple(x)] for x in e.tolist()], dtype=np.float64),
        meta=meta,
    )
    if not training:
        return fwd
    return with_backward(
        fwd,
        bwd_flops_factor=np.array(bwd_factor),
        opt_flops_per_param=OPT_FLOPS[optimizer],
        requires_grad=np.array(needs_grad, dtype=bool),
        trainable_params=np.array(ptrain),
    )
