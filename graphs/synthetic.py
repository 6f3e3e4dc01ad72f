"""Seeded random training graphs (layered DAGs, series-parallel graphs, NASNet-like cells) for policy training."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphs.compgraph import CompGraph
from graphs.schema import is_number, is_whole

#: Bytes per activation element (fp16/bf16 under mixed precision).
BYTES_PER_ELEMENT = 2.0
#: Persistent bytes per parameter (mixed-precision Adam: fp32 master + 2 moments + fp16 weight/grad).
BYTES_PER_PARAM = 16.0

RngLike = np.random.Generator | int | None


def _whole(who: str, name: str, v: Any, lo: int) -> int:
    """``v`` as an int when it is an integer (numpy too, never a bool) >= ``lo``; else one
    ``ValueError`` naming it (2.5, "3" and None were numpy or comparison TypeErrors, and NaN
    ``reduction_every`` silently no reduction cell; 2 Dec 2026)."""
    if not is_whole(v, lo):
        raise ValueError(f"{who}: {name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _flag(who: str, name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):  # "no" was taken as true
        raise ValueError(f"{who}: {name} must be true or false, got {v!r}")
    return bool(v)


def _rng(rng: RngLike) -> np.random.Generator:
    """``rng`` itself, or a generator seeded with ``rng`` (``None`` = seed 0, so results are reproducible)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng(0)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        if rng < 0:  # numpy's "expected non-negative integer", rng not named
            raise ValueError(f"rng: a seed must be an integer >= 0, got {rng!r}")
        return np.random.default_rng(int(rng))
    raise ValueError(
        f"rng must be a numpy Generator, an int seed or None, got {type(rng).__name__}"
    )


# ============================================================== op cost model
@dataclass(frozen=True)
class _Shape:
    """Activation of one op: ``tokens`` rows (batch x positions) by ``channels``."""

    tokens: float
    channels: float

    @property
    def elems(self) -> float:
        return self.tokens * self.channels


#: (flops, bytes_accessed, params, act_elems) of an op from its input and output shapes and kernel size.
_CostFn = Callable[[_Shape, _Shape, int], tuple[float, float, float, float]]


def _matmul(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    p = i.channels * o.channels + o.channels
    return 2 * i.tokens * i.channels * o.channels, i.elems + p + o.elems, p, i.elems


def _conv(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    p = k * k * i.channels * o.channels + o.channels
    return 2 * o.tokens * k * k * i.channels * o.channels, i.elems + p + o.elems, p, i.elems


def _sepconv(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    p = k * k * i.channels + i.channels * o.channels
    flops = 2 * o.tokens * (k * k * i.channels + i.channels * o.channels)
    return flops, 2 * i.elems + p + o.elems, p, 2 * i.elems


def _elementwise(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return 4 * o.elems, i.elems + o.elems, 0.0, i.elems


def _add(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return o.elems, 3 * o.elems, 0.0, 0.0


def _norm(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return 8 * o.elems, i.elems + o.elems + 2 * i.channels, 2 * i.channels, i.elems


def _attention(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    # scores + softmax + context over a window of k positions per token (k = sequence length)
    return 4 * i.tokens * k * i.channels + 5 * i.tokens * k, 3 * i.elems + o.elems, 0.0, 3 * i.elems


def _pool(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return k * k * o.elems, i.elems + o.elems, 0.0, 0.0


def _identity(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return 0.0, 0.0, 0.0, 0.0


def _concat(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    return 0.0, 2 * o.elems, 0.0, 0.0


def _embedding(i: _Shape, o: _Shape, k: int) -> tuple[float, float, float, float]:
    # k = vocabulary size: a gather of one row per token
    p = k * o.channels
    return o.elems, 2 * o.elems, p, 0.0


OPS: dict[str, _CostFn] = {
    "matmul": _matmul,
    "conv": _conv,
    "sepconv": _sepconv,
    "elementwise": _elementwise,
    "add": _add,
    "norm": _norm,
    "attention": _attention,
    "pool": _pool,
    "identity": _identity,
    "concat": _concat,
    "embedding": _embedding,
}

#: Op mixes of the two domains a random graph may imitate.
_DOMAINS: dict[str, dict[str, float]] = {
    "language": {"matmul": 0.35, "elementwise": 0.25, "norm": 0.15, "add": 0.15, "attention": 0.10},
    "vision": {"conv": 0.40, "elementwise": 0.25, "norm": 0.15, "add": 0.12, "pool": 0.08},
}


#: Output width of weighted ops, as multiples of the graph width (FFN up-projections are 4x).
_OUT_MULT: dict[str, tuple[float, ...]] = {
    "matmul": (1.0, 1.0, 1.0, 4.0),
    "conv": (0.5, 1.0, 1.0, 2.0),
    "sepconv": (1.0,),
    "embedding": (1.0,),
}


@dataclass(frozen=True)
class _Scale:
    """Per-graph magnitudes: batch x positions, model width, domain."""

    domain: str
    tokens: float
    width: float
    seq: int
    batch: int

    @staticmethod
    def draw(rng: np.random.Generator, domain: str | None = None) -> _Scale:
        domain = domain or str(rng.choice(sorted(_DOMAINS)))
        if domain not in _DOMAINS:
            raise ValueError(f"unknown domain {domain!r}; expected one of {sorted(_DOMAINS)}")
        if domain == "language":
            seq = int(rng.choice([128, 256, 512, 1024, 2048]))
            batch = int(rng.choice([1, 2, 4, 8, 16]))
            width = float(
                rng.choice(
                    [256, 512, 768, 1024, 1536, 2048, 4096],
                    p=[0.1, 0.15, 0.2, 0.2, 0.15, 0.12, 0.08],
                )
            )
            return _Scale(domain, float(seq * batch), width, seq, batch)
        side = int(rng.choice([14, 28, 56]))  # feature-map side inside a CNN
        batch = int(rng.choice([16, 32, 64, 128]))
        width = float(rng.choice([64, 128, 256, 512]))
        return _Scale(domain, float(batch * side * side), width, 0, batch)


def _costed_graph(
    n: int,
    edges: list[tuple[int, int]],
    ops: Sequence[str],
    scale: _Scale,
    rng: np.random.Generator,
    *,
    layer: Sequence[int],
    module: Sequence[str],
    meta: dict,
    out_channels: Sequence[float] | None = None,
    stride: Sequence[int] | None = None,
    kernel: Sequence[int] | None = None,
) -> CompGraph:
    """Forward graph with per-op costs: shapes flow in topological order from the sources.

    A weighted op (matmul, conv, sepconv, embedding) outputs ``out_channels[i]``
    channels, or a random multiple of the graph width (so widths never compound
    along a chain); other ops keep their input's channels (concat sums them).
    ``stride[i]`` divides the positions by ``stride**2``; ``kernel[i] > 0`` fixes
    the kernel size (else drawn per op).
    """
    for i, op in enumerate(ops):
        if op not in OPS:
            raise ValueError(f"node {i}: unknown op {op!r}; expected one of {sorted(OPS)}")
    topo = CompGraph.build(n, edges).topo_order
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in edges:
        preds[d].append(s)
    shapes: list[_Shape | None] = [None] * n
    cols = {
        f: np.zeros(n) for f in ("flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes")
    }
    for i in topo.tolist():
        op = ops[i]
        if preds[i]:
            ins = [shapes[p] for p in preds[i]]
            tin = min(s.tokens for s in ins)  # type: ignore[union-attr]
            cin = (
                sum(s.channels for s in ins)  # type: ignore[union-attr]
                if op == "concat"
                else max(s.channels for s in ins)  # type: ignore[union-attr]
            )
        else:
            tin, cin = scale.tokens, scale.width
        i_shape = _Shape(tin, cin)
        st = stride[i] if stride is not None else 1
        tout = max(1.0, tin / (st * st))
        if op in _OUT_MULT:
            if out_channels is not None:
                cout = float(out_channels[i])
            else:
                cout = scale.width * float(rng.choice(_OUT_MULT[op]))
        else:
            cout = cin
        if op == "pool" and stride is None:
            tout = max(1.0, tin / 4)
        o_shape = _Shape(tout, cout)
        if kernel is not None and kernel[i] > 0:
            k = int(kernel[i])
        elif op == "conv" or op == "pool" or op == "sepconv":
            k = int(rng.choice([1, 3, 3, 3, 5])) if op != "pool" else 3
        elif op == "attention":
            k = scale.seq or 512
        elif op == "embedding":
            k = int(rng.choice([8192, 32000, 50257]))
        else:
            k = 1
        flops, acc_elems, params, act = OPS[op](i_shape, o_shape, k)
        shapes[i] = o_shape
        cols["flops"][i] = flops
        cols["bytes_accessed"][i] = acc_elems * BYTES_PER_ELEMENT
        cols["out_bytes"][i] = (
            0.0 if op == "identity" and not preds[i] else o_shape.elems * BYTES_PER_ELEMENT
        )
        cols["param_bytes"][i] = params * BYTES_PER_PARAM
        cols["act_bytes"][i] = act * BYTES_PER_ELEMENT
    names = [f"{ops[i]}_{i}" for i in range(n)]
    meta = {
        "bytes_per_param": BYTES_PER_PARAM,
        "domain": scale.domain,
        "tokens": scale.tokens,
        "width": scale.width,
        "batch": scale.batch,
        **meta,
    }
    return CompGraph.build(
        n, edges, name=names, module=list(module), layer=list(layer), meta=meta, **cols
    )


def _finish(fwd: CompGraph, training: bool) -> CompGraph:
    if not training:
        return fwd
    from graphs.training import with_backward

    return with_backward(fwd, bwd_flops_factor=2.0, optimizer=True)


def _draw_ops(rng: np.random.Generator, scale: _Scale, n: int) -> list[str]:
    mix = _DOMAINS[scale.domain]
    names = sorted(mix)
    p = np.array([mix[k] for k in names])
    return [names[j] for j in rng.choice(len(names), size=n, p=p / p.sum())]


# ================================================================ generators
def layered_dag(
    n_layers: int,
    width: int | Sequence[int],
    *,
    edge_prob: float = 0.3,
    skip_prob: float = 0.05,
    domain: str | None = None,
    training: bool = True,
    rng: RngLike = None,
) -> CompGraph:
    """A random layered DAG: layer ``l`` has ``width[l]`` ops (or 1..``width`` at random).

    Every op of a layer reads one random op of the previous layer, each other op
    of the previous layer with probability ``edge_prob``, and each op of earlier
    layers with probability ``skip_prob`` (residual-like skips). Op types and
    tensor sizes come from the ``domain`` mix ("language" or "vision"; random
    if None). Returns the training graph (``graphs.training.with_backward``)
    unless ``training`` is False.
    """
    gen = _rng(rng)
    n_layers = _whole("layered_dag", "n_layers", n_layers, 1)
    training = _flag("layered_dag", "training", training)
    if is_whole(width):
        width = _whole("layered_dag", "width", width, 1)
        widths = gen.integers(1, int(width) + 1, size=n_layers).tolist()
    else:
        if not isinstance(width, (list, tuple, np.ndarray)):  # "123" was read as [1, 2, 3]
            raise ValueError(
                f"layered_dag: width must be an integer or a list of integers, got {width!r}"
            )
        widths = [_whole("layered_dag", "width[]", w, 1) for w in width]  # 1.9 was 1
        if len(widths) != n_layers or min(widths) < 1:
            raise ValueError(
                f"layered_dag: width list must have {n_layers} entries >= 1, got {widths}"
            )
    for name, p in (("edge_prob", edge_prob), ("skip_prob", skip_prob)):
        if not is_number(p) or not 0 <= p <= 1:  # "x" was a TypeError (fuzzing)
            raise ValueError(f"layered_dag: {name} must be in [0, 1], got {p}")
    scale = _Scale.draw(gen, domain)
    starts = np.concatenate([[0], np.cumsum(widths)]).astype(int)
    n = int(starts[-1])
    edges: list[tuple[int, int]] = []
    layer = np.repeat(np.arange(n_layers), widths).tolist()
    for li in range(1, n_layers):
        prev = range(starts[li - 1], starts[li])
        for v in range(starts[li], starts[li + 1]):
            first = int(gen.integers(prev.start, prev.stop))
            srcs = {first} | {u for u in prev if u != first and gen.random() < edge_prob}
            if li >= 2 and skip_prob > 0:
                early = np.arange(0, starts[li - 1])
                srcs |= set(early[gen.random(len(early)) < skip_prob].tolist())
            edges += [(u, v) for u in sorted(srcs)]
    ops = _draw_ops(gen, scale, n)
    if scale.domain == "language":
        for v in range(widths[0]):
            ops[v] = "embedding"
    fwd = _costed_graph(
        n,
        edges,
        ops,
        scale,
        gen,
        layer=layer,
        module=[f"layer{li}" for li in layer],
        meta={"name": f"layered_{n_layers}x{max(widths)}", "generator": "layered_dag"},
    )
    return _finish(fwd, training)


def series_parallel(
    n: int,
    *,
    p_series: float = 0.6,
    domain: str | None = None,
    training: bool = True,
    rng: RngLike = None,
) -> CompGraph:
    """A random two-terminal series-parallel DAG with exactly ``n`` forward ops (``n >= 2``).

    Starting from one edge ``s -> t``, each step picks a random edge ``u -> v``
    and either subdivides it (series, probability ``p_series``: ``u -> w -> v``)
    or adds a parallel branch beside it (``u -> w -> v`` keeping ``u -> v``).
    Every branch thus forks at one op and joins at another, as in Inception-
    or ResNet-like blocks.
    """
    gen = _rng(rng)
    n = _whole("series_parallel", "n", n, 2)
    training = _flag("series_parallel", "training", training)
    if not is_number(p_series) or not 0 <= p_series <= 1:
        raise ValueError(f"series_parallel: p_series must be in [0, 1], got {p_series}")
    scale = _Scale.draw(gen, domain)
    edges: list[tuple[int, int]] = [(0, 1)]
    for w in range(2, n):
        j = int(gen.integers(len(edges)))
        u, v = edges[j]
        if gen.random() < p_series:
            edges[j] = (u, w)
            edges.append((w, v))
        else:
            edges += [(u, w), (w, v)]
    # depth (longest path from the source) as the layer index
    order = CompGraph.build(n, edges).topo_order.tolist()
    depth = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        succ[u].append(v)
    for u in order:
        for v in succ[u]:
            depth[v] = max(depth[v], depth[u] + 1)
    ops = _draw_ops(gen, scale, n)
    ops[0] = "embedding" if scale.domain == "language" else "conv"
    # where branches join, combine them with an add
    indeg = np.bincount([v for _, v in edges], minlength=n)
    for v in np.flatnonzero(indeg > 1).tolist():
        ops[v] = "add"
    fwd = _costed_graph(
        n,
        edges,
        ops,
        scale,
        gen,
        layer=depth,
        module=[f"depth{d}" for d in depth],
        meta={"name": f"series_parallel_{n}", "generator": "series_parallel"},
    )
    return _finish(fwd, training)


#: NASNet search-space ops applied to block inputs.
_NAS_OPS = ("sepconv", "sepconv", "pool", "pool", "identity", "conv")


def nasnet_cells(
    n_cells: int,
    *,
    blocks: int = 5,
    reduction_every: int = 3,
    max_reductions: int = 2,
    training: bool = True,
    rng: RngLike = None,
) -> CompGraph:
    """A NASNet-like network: a stem conv, ``n_cells`` cells, then global pool and a classifier.

    One normal-cell and one reduction-cell structure are sampled (as a NASNet
    search would) and repeated; every ``reduction_every``-th cell is a
    reduction cell (stride 2, doubled channels), at most ``max_reductions``
    of them (NASNet has 2). A cell takes the outputs of
    the two previous cells, adjusts each with a 1x1 conv, then builds
    ``blocks`` blocks; each block applies one op (separable conv, pool,
    identity or conv) to each of two inputs chosen among the cell inputs and
    earlier blocks, and adds them. The cell output concatenates the blocks no
    other block consumed. Forward ops: ``1 + n_cells * (3 * blocks + 3) + 2``.
    """
    gen = _rng(rng)
    n_cells = _whole("nasnet_cells", "n_cells", n_cells, 1)
    blocks = _whole("nasnet_cells", "blocks", blocks, 1)
    max_reductions = _whole("nasnet_cells", "max_reductions", max_reductions, 0)
    reduction_every = _whole("nasnet_cells", "reduction_every", reduction_every, 1)
    training = _flag("nasnet_cells", "training", training)
    # image side (CIFAR-sized to ImageNet-sized input), batch and NASNet-A filter counts
    side = int(gen.choice([32, 64, 128, 224]))
    batch = int(gen.choice([16, 32, 64]))
    scale = _Scale(
        "vision", float(batch * side * side), float(gen.choice([32, 44, 64, 96])), 0, batch
    )

    def structure() -> list[tuple[int, str, int, str]]:
        # per block: (input a, op a, input b, op b); inputs 0, 1 = cell inputs, 2 + b = block b
        return [
            (
                int(gen.integers(0, 2 + b)),
                str(gen.choice(_NAS_OPS)),
                int(gen.integers(0, 2 + b)),
                str(gen.choice(_NAS_OPS)),
            )
            for b in range(blocks)
        ]

    cells = {"normal": structure(), "reduction": structure()}
    ops: list[str] = ["conv"]
    module: list[str] = ["stem"]
    layer: list[int] = [0]
    chans: list[float] = [scale.width]
    stride: list[int] = [2]
    kern: list[int] = [3]
    edges: list[tuple[int, int]] = []

    def add(
        op: str, mod: str, lay: int, srcs: Sequence[int], ch: float = 0.0, s: int = 1, k: int = 0
    ) -> int:
        kern.append(k)
        ops.append(op)
        module.append(mod)
        layer.append(lay)
        chans.append(ch)
        stride.append(s)
        v = len(ops) - 1
        edges.extend((u, v) for u in srcs)
        return v

    prev, prev2 = 0, 0
    width = scale.width
    n_red = 0
    for c in range(n_cells):
        red = (c + 1) % reduction_every == 0 and n_red < max_reductions
        n_red += red
        kind = "reduction" if red else "normal"
        mod = f"cell{c}"
        width *= 2 if red else 1
        # 1x1 convs adjusting the two inputs (stride 2 and x2 channels in a reduction cell)
        h0 = add("conv", f"{mod}.prep0", c + 1, [prev2], width, 2 if red else 1, 1)
        h1 = add("conv", f"{mod}.prep1", c + 1, [prev], width, 2 if red else 1, 1)
        states = [h0, h1]
        used: set[int] = set()
        for b, (ia, opa, ib, opb) in enumerate(cells[kind]):
            a = add(opa, f"{mod}.block{b}.a", c + 1, [states[ia]], width)
            bb = add(opb, f"{mod}.block{b}.b", c + 1, [states[ib]], width)
            states.append(add("add", f"{mod}.block{b}.add", c + 1, [a, bb]))
            used |= {ia, ib}
        loose = [states[2 + b] for b in range(blocks) if 2 + b not in used]
        out = add("concat", f"{mod}.concat", c + 1, loose)
        prev2, prev = prev, out
    pool = add("pool", "head.pool", n_cells + 1, [prev], s=8)  # global average pool
    add("matmul", "head.fc", n_cells + 1, [pool], 1000.0)  # classifier over 1000 classes
    n = len(ops)
    fwd = _costed_graph(
        n,
        edges,
        ops,
        scale,
        gen,
        layer=layer,
        module=module,
        meta={
            "name": f"nasnet_{n_cells}x{blocks}",
            "generator": "nasnet_cells",
        },
        out_channels=chans,
        stride=stride,
        kernel=kern,
    )
    return _finish(fwd, training)


# ================================================================== sampling
def _sample_layered(gen: np.random.Generator, n: int, training: bool) -> CompGraph:
    n_layers = int(gen.integers(max(2, n // 8), max(3, n // 2) + 1))
    n_layers = min(n_layers, n)
    cuts = np.sort(gen.choice(np.arange(1, n), size=n_layers - 1, replace=False))
    widths = np.diff(np.concatenate([[0], cuts, [n]])).tolist()
    return layered_dag(
        n_layers,
        widths,
        edge_prob=float(gen.uniform(0.1, 0.5)),
        skip_prob=float(gen.uniform(0.0, 0.1)),
        training=training,
        rng=gen,
    )


def _sample_sp(gen: np.random.Generator, n: int, training: bool) -> CompGraph:
    return series_parallel(n, p_series=float(gen.uniform(0.4, 0.8)), training=training, rng=gen)


def _sample_nasnet(gen: np.random.Generator, n: int, training: bool) -> CompGraph:
    blocks = int(gen.integers(2, 6))
    per_cell = 3 * blocks + 3
    n_cells = max(1, round((n - 3) / per_cell))
    return nasnet_cells(
        n_cells, blocks=blocks, reduction_every=int(gen.integers(2, 4)), training=training, rng=gen
    )


SAMPLERS: dict[str, Callable[[np.random.Generator, int, bool], CompGraph]] = {
    "layered": _sample_layered,
    "series_parallel": _sample_sp,
    "nasnet": _sample_nasnet,
}


def sample(
    rng: RngLike = None,
    kind: str = "mixed",
    *,
    min_nodes: int = 20,
    max_nodes: int = 200,
    training: bool = True,
) -> CompGraph:
    """One random graph with ``min_nodes..max_nodes`` forward ops.

    ``kind`` is ``"layered"``, ``"series_parallel"``, ``"nasnet"`` or
    ``"mixed"`` (one of them uniformly). The target size is drawn
    log-uniformly; NASNet graphs come in whole cells and are redrawn until
    they fit the bounds. The same generator state gives the same graph.
    """
    gen = _rng(rng)
    choices = sorted(SAMPLERS)
    if kind != "mixed" and kind not in SAMPLERS:
        raise ValueError(
            f"unknown synthetic graph kind {kind!r}; expected one of {['mixed', *choices]}"
        )
    min_nodes = _whole("sample", "min_nodes", min_nodes, 2)
    max_nodes = _whole("sample", "max_nodes", max_nodes, 2)  # inf: an OverflowError
    training = _flag("sample", "training", training)
    if not 2 <= min_nodes <= max_nodes:
        raise ValueError(
            f"sample: need 2 <= min_nodes <= max_nodes, got min_nodes={min_nodes}, max_nodes={max_nodes}"
        )
    for _ in range(100):
        k = str(gen.choice(choices)) if kind == "mixed" else kind
        n = int(round(np.exp(gen.uniform(np.log(min_nodes), np.log(max_nodes + 1) - 1e-9))))
        n = int(np.clip(n, min_nodes, max_nodes))
        g = SAMPLERS[k](gen, n, training)
        n_fwd = int((g.kind == 0).sum())
        if min_nodes <= n_fwd <= max_nodes:
            return g
    raise ValueError(
        f"sample: could not make a {kind!r} graph with {min_nodes}..{max_nodes} forward ops "
        "(NASNet graphs need room for at least one cell: 9 + 3 * blocks ops)"
    )


__all__ = ["OPS", "layered_dag", "nasnet_cells", "sample", "series_parallel"]
