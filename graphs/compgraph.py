"""CompGraph: an immutable, array-backed DAG of training-step operations."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Node kinds. Stored as small integers in ``CompGraph.kind``.
FWD, BWD, OPT = 0, 1, 2
KIND_NAMES: tuple[str, ...] = ("fwd", "bwd", "opt")

_FLOAT_NODE_FIELDS = ("flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes")


def _as_float(name: str, values: Any, n: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1).copy()
    if arr.shape != (n,):
        raise ValueError(f"CompGraph: node array '{name}' has length {arr.shape[0]}, expected {n}")
    return arr


def _as_int(name: str, values: Any, dtype: Any = np.int64) -> np.ndarray:
    """Whole numbers as ``dtype``; a fraction or a value out of range is refused (until 29 Nov
    2026 ``kind=256`` wrapped to 0, ``group=0.5`` and an edge ``(0.7, 1.2)`` were truncated)."""
    arr = np.asarray(values)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype.kind == "f"):
        if arr.size:  # an empty list is float64 / object-free: fine
            raise ValueError(f"CompGraph: '{name}' must hold integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and arr.size:
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            v = arr.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])]
            raise ValueError(f"CompGraph: '{name}' must hold integers, got {float(v)!r}")
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        v = arr.min() if arr.min() < info.min else arr.max()
        raise ValueError(f"CompGraph: '{name}' value {v.item()!r} is out of range")
    return arr.astype(dtype)


def _texts(name: str, values: Sequence[Any]) -> tuple[str, ...]:
    """Node names / modules as strings; another type is refused (``name=['a', 5]`` was
    accepted and then broke ``content_hash`` and the JSON round trip)."""
    out = tuple(values)
    for i, v in enumerate(out):
        if not isinstance(v, str):
            raise ValueError(f"CompGraph: {name}[{i}] is {v!r}; expected a string")
    return out


def _check_costs(name: str, arr: np.ndarray, labels: Sequence[str], what: str) -> None:
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"CompGraph: {what} {labels[i]!r} has {name}={float(arr[i])!r}; "
            "costs must be finite and non-negative"
        )


@dataclass(frozen=True, eq=False)
class CompGraph:
    """A training-step computation graph: forward, backward and optimizer ops.

    All per-node quantities describe the *whole global batch*; a simulator that
    splits a step into ``M`` microbatches divides the batch-proportional ones
    (``flops``, ``bytes_accessed``, ``out_bytes``, ``act_bytes``, edge bytes,
    explicit times) by ``M``. ``param_bytes`` is persistent training state
    (weights + gradients + optimizer state, ``meta["bytes_per_param"]`` bytes per
    parameter) and is carried by the node that owns the weights (a forward node).

    Node arrays (length ``n``)::

        flops           float64  floating-point operations
        bytes_accessed  float64  bytes read + written (roofline memory term)
        out_bytes       float64  bytes of the node's output tensor(s)
        param_bytes     float64  persistent state bytes (weights+grads+optimizer)
        act_bytes       float64  activation bytes kept from forward until backward
        kind            int8     0 fwd, 1 bwd, 2 opt
        group           int64    colocation group: equal ids must share a device
        layer           int64    layer index (-1 if none), for expert splits
        name            tuple[str]  unique node names
        module          tuple[str]  module path ("" if none)

    Edge arrays (length ``e``)::

        src, dst        int64    node indices, src -> dst
        edge_bytes      float64  tensor bytes moved along the edge

    Optional overrides:

        times      {device_kind: float64[n]} measured compute time in microseconds;
                   NaN = no measurement (use the cost model), +inf = the node
                   cannot run on that kind of device.
        edge_time  float64[e] explicit transfer time in microseconds (NaN = use the
                   link model).

    Construction validates: array lengths, ids in range, no self loops, finite
    non-negative costs, acyclicity. Errors are ``ValueError`` naming the node or
    edge. Use :meth:`CompGraph.build` for keyword construction with defaults.
    """

    flops: np.ndarray
    bytes_accessed: np.ndarray
    out_bytes: np.ndarray
    param_bytes: np.ndarray
    act_bytes: np.ndarray
    kind: np.ndarray
    group: np.ndarray
    layer: np.ndarray
    name: tuple[str, ...]
    module: tuple[str, ...]
    src: np.ndarray
    dst: np.ndarray
    edge_bytes: np.ndarray
    times: Mapping[str, np.ndarray] = field(default_factory=dict)
    edge_time: np.ndarray | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(
        cls,
        n: int,
        edges: Sequence[tuple[int, int]] | np.ndarray = (),
        *,
        flops: Any = 0.0,
        bytes_accessed: Any = 0.0,
        out_bytes: Any = 0.0,
        param_bytes: Any = 0.0,
        act_bytes: Any = 0.0,
        kind: Any = FWD,
        group: Any = None,
        layer: Any = -1,
        name: Sequence[str] | None = None,
        module: Sequence[str] | None = None,
        edge_bytes: Any = None,
        times: Mapping[str, Any] | None = None,
        edge_time: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> CompGraph:
        """Build a graph from ``n`` nodes and ``(src, dst)`` edges; scalars broadcast.

        ``group`` defaults to every node in its own group; ``edge_bytes`` defaults
        to the source node's ``out_bytes``; ``kind`` accepts ints or "fwd"/"bwd"/"opt".
        """
        if n < 0:
            raise ValueError(f"CompGraph: number of nodes must be >= 0, got {n}")
        e = _as_int("edges", edges).reshape(-1, 2) if len(edges) else np.zeros((0, 2), np.int64)

        def full(v: Any) -> Any:
            return np.broadcast_to(np.asarray(v), (n,)) if np.ndim(v) == 0 else v

        if isinstance(kind, str) or (np.ndim(kind) > 0 and len(kind) and isinstance(kind[0], str)):
            kinds = [kind] * n if isinstance(kind, str) else list(kind)
            try:
                kind = [KIND_NAMES.index(k) for k in kinds]
            except ValueError as exc:
                raise ValueError(
                    f"CompGraph: unknown node kind in {sorted(set(kinds))}; expected {KIND_NAMES}"
                ) from exc
        out = _as_float("out_bytes", full(out_bytes), n)
        src, dst = e[:, 0].copy(), e[:, 1].copy()
        if edge_bytes is None:
            ok = (src >= 0) & (src < n)
            eb = np.zeros(len(src))
            eb[ok] = out[src[ok]]
        else:
            eb = edge_bytes
        return cls(
            flops=_as_float("flops", full(flops), n),
            bytes_accessed=_as_float("bytes_accessed", full(bytes_accessed), n),
            out_bytes=out,
            param_bytes=_as_float("param_bytes", full(param_bytes), n),
            act_bytes=_as_float("act_bytes", full(act_bytes), n),
            kind=_as_int("kind", full(kind), np.int8).copy(),
            group=np.arange(n, dtype=np.int64)
            if group is None
            else _as_int("group", full(group)).copy(),
            layer=_as_int("layer", full(layer)).copy(),
            name=_texts("name", name) if name is not None else tuple(f"n{i}" for i in range(n)),
            module=_texts("module", module) if module is not None else ("",) * n,
            src=src,
            dst=dst,
            edge_bytes=np.asarray(eb, dtype=np.float64).reshape(-1).copy(),
            times={
                k: np.asarray(v, dtype=np.float64).reshape(-1).copy()
                for k, v in (times or {}).items()
            },
            edge_time=None
            if edge_time is None
            else np.asarray(edge_time, dtype=np.float64).reshape(-1).copy(),
            meta=dict(meta or {}),
        )

    # ------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        # the integer and text fields as `build` makes them, for graphs made directly or by
        # dataclasses.replace: group=0.5 was taken, name=(..., 3) broke the hash and the JSON
        # round trip, float edges a numpy cast error (fuzzing, 2 Dec 2026)
        for f, dtype in (("kind", np.int8), ("group", np.int64), ("layer", np.int64),
                         ("src", np.int64), ("dst", np.int64)):  # fmt: skip
            v = getattr(self, f)
            if not (isinstance(v, np.ndarray) and v.dtype == dtype):
                object.__setattr__(self, f, _as_int(f, v, dtype).copy())
        for f in ("name", "module"):
            v = getattr(self, f)
            if not isinstance(v, tuple) or not all(isinstance(x, str) for x in v):
                object.__setattr__(self, f, _texts(f, v))
        n = len(self.name)
        for f in _FLOAT_NODE_FIELDS:
            arr = getattr(self, f)
            if not isinstance(arr, np.ndarray) or arr.shape != (n,):
                raise ValueError(
                    f"CompGraph: node array '{f}' must have shape ({n},), got {np.shape(arr)}"
                )
        for f in ("kind", "group", "layer"):
            if np.shape(getattr(self, f)) != (n,):
                raise ValueError(
                    f"CompGraph: node array '{f}' must have shape ({n},), got {np.shape(getattr(self, f))}"
                )
        if len(self.module) != n:
            raise ValueError(f"CompGraph: 'module' has length {len(self.module)}, expected {n}")
        if len(set(self.name)) != n:
            seen: set[str] = set()
            dup = next(x for x in self.name if x in seen or seen.add(x))  # type: ignore[func-returns-value]
            raise ValueError(f"CompGraph: node name {dup!r} is used twice; names must be unique")
        for f in _FLOAT_NODE_FIELDS:
            _check_costs(f, getattr(self, f), self.name, "node")
        badk = (self.kind < 0) | (self.kind > 2)
        if badk.any():
            i = int(np.flatnonzero(badk)[0])
            raise ValueError(
                f"CompGraph: node {self.name[i]!r} has kind {int(self.kind[i])}; expected 0 (fwd), 1 (bwd) or 2 (opt)"
            )
        m = len(self.src)
        if self.dst.shape != (m,) or self.edge_bytes.shape != (m,):
            raise ValueError(f"CompGraph: edge arrays src/dst/edge_bytes must all have length {m}")
        bad = (self.src < 0) | (self.src >= n) | (self.dst < 0) | (self.dst >= n)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"CompGraph: edge {j} ({int(self.src[j])} -> {int(self.dst[j])}) is dangling: node ids must be in [0, {n})"
            )
        loops = self.src == self.dst
        if loops.any():
            j = int(np.flatnonzero(loops)[0])
            raise ValueError(
                f"CompGraph: edge {j} is a self loop on node {self.name[self.src[j]]!r}"
            )
        edge_labels = (
            [
                f"{j} ({self.name[s]} -> {self.name[d]})"
                for j, (s, d) in enumerate(zip(self.src, self.dst))
            ]
            if m and not (np.isfinite(self.edge_bytes).all() and (self.edge_bytes >= 0).all())
            else []
        )
        if edge_labels:
            _check_costs("bytes", self.edge_bytes, edge_labels, "edge")
        for k, t in self.times.items():
            if t.shape != (n,):
                raise ValueError(f"CompGraph: times[{k!r}] has shape {t.shape}, expected ({n},)")
            badt = (t < 0) | (t == -np.inf)
            if badt.any():
                i = int(np.flatnonzero(badt)[0])
                raise ValueError(
                    f"CompGraph: node {self.name[i]!r} has negative times[{k!r}]={t[i]!r}"
                )
        if self.edge_time is not None:
            if self.edge_time.shape != (m,):
                raise ValueError(
                    f"CompGraph: edge_time has shape {self.edge_time.shape}, expected ({m},)"
                )
            badt = (self.edge_time < 0) | np.isinf(self.edge_time)
            if badt.any():
                j = int(np.flatnonzero(badt)[0])
                raise ValueError(
                    f"CompGraph: edge {j} has invalid edge_time={self.edge_time[j]!r}; must be finite and >= 0 (NaN = none)"
                )
        order = self._toposort()
        object.__setattr__(self, "_topo", order)
        for arr in (
            self.flops,
            self.bytes_accessed,
            self.out_bytes,
            self.param_bytes,
            self.act_bytes,
            self.kind,
            self.group,
            self.layer,
            self.src,
            self.dst,
            self.edge_bytes,
            *self.times.values(),
        ):
            arr.flags.writeable = False
        if self.edge_time is not None:
            self.edge_time.flags.writeable = False

    def _toposort(self) -> np.ndarray:
        n = self.num_nodes
        indeg = np.bincount(self.dst, minlength=n).astype(np.int64)
        order_e = np.argsort(self.src, kind="stable")
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.src, minlength=n), out=ptr[1:])
        succ = self.dst[order_e]
        stack = list(np.flatnonzero(indeg == 0)[::-1])
        out = np.empty(n, dtype=np.int64)
        k = 0
        indeg = indeg.tolist()
        ptr_l, succ_l = ptr.tolist(), succ.tolist()
        while stack:
            u = stack.pop()
            out[k] = u
            k += 1
            for v in succ_l[ptr_l[u] : ptr_l[u + 1]]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    stack.append(v)
        if k != n:
            left = [i for i in range(n) if indeg[i] > 0]
            raise ValueError(
                f"CompGraph: the graph has a cycle through node {self.name[left[0]]!r} "
                f"({len(left)} nodes on or behind cycles)"
            )
        return out

    # ------------------------------------------------------------- properties
    @property
    def num_nodes(self) -> int:
        return len(self.name)

    @property
    def num_edges(self) -> int:
        return len(self.src)

    @property
    def topo_order(self) -> np.ndarray:
        """A topological order of the nodes (int64 array, read-only)."""
        return self._topo  # type: ignore[attr-defined]

    @property
    def num_groups(self) -> int:
        """Number of distinct colocation groups."""
        return len(np.unique(self.group))

    @property
    def bytes_per_param(self) -> float:
        return float(self.meta.get("bytes_per_param", 16.0))

    @property
    def num_params(self) -> float:
        """Parameter count = total persistent state bytes / bytes per parameter, plus the
        frozen parameters (``meta["frozen_params"]``: weights only, ``frozen_param_bytes``)."""
        frozen = float(self.meta.get("frozen_params", 0.0))
        fbytes = float(self.meta.get("frozen_param_bytes", 0.0))
        return (float(self.param_bytes.sum()) - fbytes) / self.bytes_per_param + frozen

    def total_flops(self, kind: int | None = None) -> float:
        if kind is None:
            return float(self.flops.sum())
        return float(self.flops[self.kind == kind].sum())

    def group_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(group_ids, inverse)``: sorted unique colocation ids and, per node, its unit index."""
        ids, inv = np.unique(self.group, return_inverse=True)
        return ids, inv.astype(np.int64)

    def predecessors(self, i: int) -> np.ndarray:
        return self.src[self.dst == i]

    def successors(self, i: int) -> np.ndarray:
        return self.dst[self.src == i]

    def index(self, name: str) -> int:
        """Node index of ``name``; ``KeyError`` listing a few names if absent."""
        try:
            return self._name_index()[name]
        except KeyError:
            raise KeyError(
                f"CompGraph has no node named {name!r} (e.g. {list(self.name[:5])})"
            ) from None

    def _name_index(self) -> dict[str, int]:
        d = self.__dict__.get("_name_idx")
        if d is None:
            d = {s: i for i, s in enumerate(self.name)}
            object.__setattr__(self, "_name_idx", d)
        return d

    # ---------------------------------------------------------------- hashing
    def content_hash(self) -> str:
        """SHA-256 (hex, 16 chars) of everything that affects placement and cost: the node and
        edge arrays, names, measured times and, for parametric models, ``meta["model_dims"]``
        and ``meta["grad_bytes_per_param"]``."""
        h = self.__dict__.get("_hash")
        if h is None:
            m = hashlib.sha256()
            for arr in (
                self.flops,
                self.bytes_accessed,
                self.out_bytes,
                self.param_bytes,
                self.act_bytes,
                self.kind,
                self.group,
                self.layer,
                self.src,
                self.dst,
                self.edge_bytes,
            ):
                m.update(np.ascontiguousarray(arr).tobytes())
            m.update("\x00".join(self.name).encode())
            for k in sorted(self.times):
                m.update(k.encode())
                m.update(np.ascontiguousarray(self.times[k]).tobytes())
            if self.edge_time is not None:
                m.update(np.ascontiguousarray(self.edge_time).tobytes())
            # what the hybrid model reads besides the arrays (absent: the hash as before).
            # Until 29 Nov 2026 left out: a GPT with FlashAttention and one without had one
            # hash and 1.9 against 3.3 GB peaks (found by fuzzing)
            if "model_dims" in self.meta:
                cost = {k: self.meta.get(k) for k in ("model_dims", "grad_bytes_per_param")}
                m.update(json.dumps(cost, sort_keys=True, default=repr).encode())
            h = m.hexdigest()[:16]
            object.__setattr__(self, "_hash", h)
        return h

    # ---------------------------------------------------------------- convert
    def to_networkx(self):  # -> nx.DiGraph
        """A ``networkx.DiGraph`` view: node attributes are the node arrays, edge attribute ``bytes``."""
        import networkx as nx

        g = nx.DiGraph(**{k: v for k, v in self.meta.items() if isinstance(v, (str, int, float))})
        for i in range(self.num_nodes):
            g.add_node(
                i,
                name=self.name[i],
                module=self.module[i],
                flops=float(self.flops[i]),
                bytes_accessed=float(self.bytes_accessed[i]),
                out_bytes=float(self.out_bytes[i]),
                param_bytes=float(self.param_bytes[i]),
                act_bytes=float(self.act_bytes[i]),
                kind=KIND_NAMES[int(self.kind[i])],
                group=int(self.group[i]),
                layer=int(self.layer[i]),
            )
        for j in range(self.num_edges):
            g.add_edge(int(self.src[j]), int(self.dst[j]), bytes=float(self.edge_bytes[j]))
        return g

    def replace(self, **changes: Any) -> CompGraph:
        """A new validated graph with some fields replaced."""
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        fields = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in fields.items()}
        return CompGraph(**fields)

    def __repr__(self) -> str:
        return (
            f"CompGraph(nodes={self.num_nodes}, edges={self.num_edges}, groups={self.num_groups}, "
            f"tflops={self.total_flops() / 1e12:.3f}, params={self.num_params / 1e6:.2f}M, "
            f"name={self.meta.get('name', '?')!r})"
        )

    def __len__(self) -> int:
        return self.num_nodes
