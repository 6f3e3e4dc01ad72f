"""Derive the training graph (forward + backward + optimizer nodes) from a forward-only CompGraph."""

from __future__ import annotations

import numpy as np

from graphs.compgraph import BWD, FWD, OPT, CompGraph

#: Default gradient bytes per parameter (fp16 gradients under mixed precision).
DEFAULT_GRAD_BYTES_PER_PARAM = 2.0


def _per_node(name: str, value: float | np.ndarray, n: int) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    arr = arr.reshape(-1)
    if arr.shape != (n,):
        raise ValueError(
            f"with_backward: {name} has length {arr.shape[0]}, expected a scalar or {n}"
        )
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"with_backward: {name}[{i}]={arr[i]!r}; expected a finite non-negative number"
        )
    return arr


def with_backward(
    fwd: CompGraph,
    *,
    bwd_flops_factor: float | np.ndarray = 2.0,
    optimizer: bool = True,
    opt_flops_per_param: float = 12.0,
    requires_grad: np.ndarray | None = None,
    trainable_params: np.ndarray | None = None,
) -> CompGraph:
    """Return the training graph of a forward-only graph.

    Node order: the ``n`` forward nodes first (same indices), then one backward
    node ``"bwd:" + name`` per forward node that needs gradient work, then (if
    ``optimizer``) one optimizer node ``"opt:" + name`` per forward node with
    parameters to train (``trainable_params``, default ``param_bytes > 0``). A forward node, its backward and its optimizer node
    share the forward node's colocation ``group``, ``layer`` and ``module``.

    Edges: the forward edges; for each forward edge ``u -> v`` with bytes ``b``
    whose ends both have backward nodes, a gradient edge ``bwd:v -> bwd:u`` with
    bytes ``b`` (the gradient has the shape of the tensor); ``fwd:i -> bwd:i``
    carrying ``act_bytes[i]`` (the activations saved for backward, so a backward
    op waits for its forward); ``bwd:i -> opt:i`` carrying the gradient bytes
    (``meta["grad_bytes_per_param"]``, default 2, times the parameter count).

    Costs: a backward node has ``bwd_flops_factor`` times the forward flops and
    bytes accessed (scalar or one value per forward node; 2 = grad-input plus
    grad-weight of a matmul), ``out_bytes`` = the sum of its gradient edges'
    bytes, and no parameter or activation bytes. An optimizer node updating
    ``p`` parameters (``trainable_params``, default ``param_bytes / bytes_per_param``) has
    ``opt_flops_per_param * p`` flops and reads and writes its state
    (``bytes_accessed = 2 * p * bytes_per_param``). Measured forward ``times`` are
    scaled by the factor for backward nodes; optimizer times are NaN (use the
    cost model). Forward ``edge_time`` is copied onto the matching gradient
    edge; new edges get NaN.

    Args:
        fwd: forward-only graph (every node of kind FWD).
        bwd_flops_factor: backward/forward cost ratio, scalar or ``float[n]``.
        optimizer: add optimizer nodes.
        opt_flops_per_param: optimizer flops per parameter (Adam ~12).
        requires_grad: optional ``bool[n]``; forward nodes marked False get no
            backward node (e.g. position ids, masks). Default: all True.
        trainable_params: optional ``float[n]``, the parameters of each node the
            optimizer updates (frozen weights are in ``param_bytes`` but not here).
            Default: ``param_bytes / bytes_per_param``.
    """
    n = fwd.num_nodes
    if n and (fwd.kind != FWD).any():
        i = int(np.flatnonzero(fwd.kind != FWD)[0])
        raise ValueError(
            f"with_backward: node {fwd.name[i]!r} has kind {int(fwd.kind[i])}; "
            "expected a forward-only graph (kind 0 everywhere)"
        )
    factor = _per_node("bwd_flops_factor", bwd_flops_factor, n)
    if not np.isfinite(opt_flops_per_param) or opt_flops_per_param < 0:
        raise ValueError(
            f"with_backward: opt_flops_per_param={opt_flops_per_param!r}; expected >= 0"
        )
    if requires_grad is None:
        rg = np.ones(n, dtype=bool)
    else:
        rg = np.asarray(requires_grad, dtype=bool).reshape(-1)
        if rg.shape != (n,):
            raise ValueError(f"with_backward: requires_grad has length {rg.shape[0]}, expected {n}")

    bwd_of = np.flatnonzero(rg)  # forward index of each backward node
    nb = len(bwd_of)
    bidx = np.full(n, -1, dtype=np.int64)
    bidx[bwd_of] = n + np.arange(nb)
    bpp = fwd.bytes_per_param
    if trainable_params is None:
        nparams = fwd.param_bytes / bpp
    else:
        nparams = np.asarray(trainable_params, dtype=np.float64).reshape(-1)
        if nparams.shape != (n,) or not (np.isfinite(nparams) & (nparams >= 0)).all():
            raise ValueError(
                f"with_backward: trainable_params must be {n} finite counts >= 0, got "
                f"shape {nparams.shape}"
            )
        if (nparams * bpp > fwd.param_bytes * (1 + 1e-9) + 1e-9).any():
            i = int(np.flatnonzero(nparams * bpp > fwd.param_bytes * (1 + 1e-9) + 1e-9)[0])
            raise ValueError(
                f"with_backward: node {fwd.name[i]!r} trains {nparams[i]:g} parameters, "
                f"more than its param_bytes {fwd.param_bytes[i]:g} hold at {bpp:g} bytes each"
            )
    has_opt = (nparams > 0) if optimizer else np.zeros(n, dtype=bool)
    opt_of = np.flatnonzero(has_opt)
    no = len(opt_of)

    gbpp = float(fwd.meta.get("grad_bytes_per_param", DEFAULT_GRAD_BYTES_PER_PARAM))

    # ---- edges: forward, gradient (reversed), fwd->bwd (saved activations), bwd->opt
    src_f, dst_f, eb_f = fwd.src, fwd.dst, fwd.edge_bytes
    keep = rg[src_f] & rg[dst_f]
    g_src, g_dst, g_bytes = bidx[dst_f[keep]], bidx[src_f[keep]], eb_f[keep]
    a_src, a_dst, a_bytes = bwd_of, bidx[bwd_of], fwd.act_bytes[bwd_of]
    # an optimizer node without a backward node (params on a no-grad op) hangs off the forward node
    o_src = np.where(bidx[opt_of] >= 0, bidx[opt_of], opt_of)
    o_dst = n + nb + np.arange(no)
    o_bytes = nparams[opt_of] * gbpp
    src = np.concatenate([src_f, g_src, a_src, o_src]).astype(np.int64)
    dst = np.concatenate([dst_f, g_dst, a_dst, o_dst]).astype(np.int64)
    ebytes = np.concatenate([eb_f, g_bytes, a_bytes, o_bytes])

    # ---- node arrays
    bwd_out = np.bincount(g_src - n, weights=g_bytes, minlength=nb) if nb else np.zeros(0)

    def cat(f: np.ndarray, b: np.ndarray, o: np.ndarray) -> np.ndarray:
        return np.concatenate([f, b, o])

    zb, zo = np.zeros(nb), np.zeros(no)
    flops = cat(
        fwd.flops, fwd.flops[bwd_of] * factor[bwd_of], opt_flops_per_param * nparams[opt_of]
    )
    bytes_acc = cat(
        fwd.bytes_accessed,
        fwd.bytes_accessed[bwd_of] * factor[bwd_of],
        2.0 * nparams[opt_of] * bpp,
    )
    kind = cat(
        fwd.kind.astype(np.int8), np.full(nb, BWD, np.int8), np.full(no, OPT, np.int8)
    ).astype(np.int8)
    times = {}
    for k, t in fwd.times.items():
        times[k] = cat(t, t[bwd_of] * factor[bwd_of], np.full(no, np.nan))
    edge_time = None
    if fwd.edge_time is not None:
        edge_time = np.concatenate(
            [fwd.edge_time, fwd.edge_time[keep], np.full(len(a_src) + no, np.nan)]
        )
    meta = dict(fwd.meta)
    meta.setdefault("bytes_per_param", bpp)
    meta["training"] = {
        "bwd_flops_factor": float(factor.mean()) if n else 0.0,
        "optimizer": bool(optimizer),
        "opt_flops_per_param": float(opt_flops_per_param),
    }
    names = fwd.name
    return CompGraph(
        flops=flops,
        bytes_accessed=bytes_acc,
        out_bytes=cat(fwd.out_bytes, bwd_out, zo),
        param_bytes=cat(fwd.param_bytes, zb, zo),
        act_bytes=cat(fwd.act_bytes, zb, zo),
        kind=kind,
        group=cat(fwd.group, fwd.group[bwd_of], fwd.group[opt_of]).astype(np.int64),
        layer=cat(fwd.layer, fwd.layer[bwd_of], fwd.layer[opt_of]).astype(np.int64),
        name=tuple(names)
        + tuple("bwd:" + names[i] for i in bwd_of)
        + tuple("opt:" + names[i] for i in opt_of),
        module=tuple(fwd.module)
        + tuple(fwd.module[i] for i in bwd_of)
        + tuple(fwd.module[i] for i in opt_of),
        src=src,
        dst=dst,
        edge_bytes=ebytes,
        times=times,
        edge_time=edge_time,
        meta=meta,
    )
