"""JSON I/O for graphs and clusters (own versioned format) and the Fiddle (Tarnawski et al. 2020) importer."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import BWD, FWD, CompGraph
from graphs.layout import dims_from_mapping
from graphs.schema import Fields, check_path, read_json

GRAPH_FORMAT = "devplace.graph"
GRAPH_VERSION = 1
CLUSTER_FORMAT = "devplace.cluster"
CLUSTER_VERSION = 1

#: Float node arrays of the graph format, in file order.
_NODE_FLOATS = ("flops", "bytes_accessed", "out_bytes", "param_bytes", "act_bytes")
#: Integer node arrays of the graph format.
_NODE_INTS = ("kind", "group", "layer")

#: Two outgoing edge costs of one Fiddle node count as equal within this (as in the reference code).
FIDDLE_COST_TOL = 1e-6
#: Most devices (``maxFPGAs + maxCPUs``) a Fiddle file may ask for.
FIDDLE_MAX_DEVICES = 4096
#: Node keys of the Fiddle format (msr-fiddle/dnn-partitioning reads these, ignores others).
FIDDLE_NODE_KEYS = (
    "id",
    "name",
    "supportedOnFpga",
    "cpuLatency",
    "fpgaLatency",
    "isBackwardNode",
    "hasBackwardNode",
    "colorClass",
    "size",
    "layerId",
)


# ====================================================================== helpers
def _jsonable(x: Any, where: str) -> Any:
    """Plain JSON value of ``x`` (numpy scalars/arrays, tuples); ``ValueError`` naming ``where`` otherwise."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist(), where)
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"{where}={x!r} cannot be written to JSON; use a finite number or None")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise ValueError(f"{where} has type {type(x).__name__}, which cannot be written to JSON")


def _encode_opt_floats(arr: np.ndarray) -> list[float | str | None]:
    """Floats that may be NaN (-> null) or +inf (-> "inf")."""
    out: list[float | str | None] = []
    for v in arr.tolist():
        if math.isnan(v):
            out.append(None)
        elif v == math.inf:
            out.append("inf")
        elif v == -math.inf:
            out.append("-inf")
        else:
            out.append(v)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _write_json(obj: Any, path: str | Path, indent: int | None) -> None:
    path = check_path(path)
    text = json.dumps(obj, indent=indent, allow_nan=False)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        path.write_text(text)


def _decode_opt_floats(v: list[Any]) -> np.ndarray:
    return np.array([np.nan if x is None else float(x) for x in v], dtype=np.float64).reshape(-1)


# ================================================================ graph format
def to_dict(graph: CompGraph) -> dict[str, Any]:
    """The versioned JSON form of ``graph`` (see module docs / ``docs/graphs.md``).

    Node and edge arrays are lists in graph order. ``kind`` is 0 fwd / 1 bwd /
    2 opt. In ``times`` and ``edge_time`` (which may hold NaN = "no value" and
    +inf = "cannot run there") NaN is written as ``null`` and infinity as the
    string ``"inf"``, since JSON has neither.
    """
    nodes: dict[str, Any] = {"name": list(graph.name), "module": list(graph.module)}
    for f in _NODE_FLOATS:
        nodes[f] = getattr(graph, f).tolist()
    for f in _NODE_INTS:
        nodes[f] = getattr(graph, f).tolist()
    return {
        "format": GRAPH_FORMAT,
        "version": GRAPH_VERSION,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "nodes": nodes,
        "edges": {
            "src": graph.src.tolist(),
            "dst": graph.dst.tolist(),
            "bytes": graph.edge_bytes.tolist(),
        },
        "times": {k: _encode_opt_floats(v) for k, v in graph.times.items()},
        "edge_time": None if graph.edge_time is None else _encode_opt_floats(graph.edge_time),
        "meta": _jsonable(dict(graph.meta), "meta"),
    }


def from_dict(d: Any, *, source: str = "graph") -> CompGraph:
    """Rebuild a graph from :func:`to_dict`'s form, checking the schema first.

    Raises one ``ValueError`` naming ``source``, the field (e.g. ``nodes.flops[2]``) and
    the value for: a missing or unknown key (only ``meta`` is free-form), a wrong type
    (``true`` or ``"3"`` for a number, ``2.0`` for an integer), a wrong length, an empty
    graph, a repeated node name, a negative, non-finite or out-of-range value, an edge
    out of range or a self loop, an unknown format or version, or a cycle.
    """
    f = Fields(source)
    f.depth(d)
    if isinstance(d, Mapping) and d.get("format") != GRAPH_FORMAT:
        raise f.error("format", d.get("format"), repr(GRAPH_FORMAT))
    f.obj(
        d,
        "",
        required=("format", "version", "nodes", "edges"),
        optional=("num_nodes", "num_edges", "times", "edge_time", "meta"),
    )
    if not (_is_int(d["version"]) and d["version"] == GRAPH_VERSION):
        raise f.fail(
            "version", f"is {d['version']!r}; this reader supports version {GRAPH_VERSION}"
        )
    nodes = f.obj(
        d["nodes"], "nodes", required=("name", *_NODE_FLOATS, *_NODE_INTS), optional=("module",)
    )
    names = f.array(nodes["name"], "nodes.name", f.string, what="node names", nonempty=True)
    f.unique(names, "nodes.name")
    n = len(names)
    if "num_nodes" in d and not (_is_int(d["num_nodes"]) and d["num_nodes"] == n):
        raise f.error("num_nodes", d["num_nodes"], f"{n}, the length of 'nodes.name'")
    cost = lambda v, p: f.number(v, p, lo=0)  # noqa: E731
    arrays: dict[str, Any] = {}
    for k in _NODE_FLOATS:
        arrays[k] = f.array(
            nodes[k], f"nodes.{k}", cost, length=n, what="finite non-negative numbers"
        )
    arrays["kind"] = f.array(
        nodes["kind"],
        "nodes.kind",
        lambda v, p: f.integer(v, p, lo=0, hi=2),
        length=n,
        what="0 (fwd), 1 (bwd) or 2 (opt)",
    )
    arrays["group"] = f.array(nodes["group"], "nodes.group", f.integer, length=n, what="integers")
    arrays["layer"] = f.array(
        nodes["layer"],
        "nodes.layer",
        lambda v, p: f.integer(v, p, lo=-1),
        length=n,
        what="layer indices >= 0, or -1 (no layer)",
    )
    module = (
        f.array(nodes["module"], "nodes.module", f.text, length=n, what="strings")
        if "module" in nodes
        else None
    )
    edges = f.obj(d["edges"], "edges", required=("src", "dst", "bytes"))
    node_id = lambda v, p: f.integer(v, p, lo=0, hi=n - 1)  # noqa: E731
    src = f.array(edges["src"], "edges.src", node_id, what=f"node indices in [0, {n - 1}]")
    m = len(src)
    if "num_edges" in d and not (_is_int(d["num_edges"]) and d["num_edges"] == m):
        raise f.error("num_edges", d["num_edges"], f"{m}, the length of 'edges.src'")
    dst = f.array(
        edges["dst"], "edges.dst", node_id, length=m, what=f"node indices in [0, {n - 1}]"
    )
    for j, (a, b) in enumerate(zip(src, dst)):
        if a == b:
            raise f.error(f"edges.dst[{j}]", b, f"a node other than edges.src[{j}] (no self loops)")
    ebytes = f.array(edges["bytes"], "edges.bytes", cost, length=m, what="non-negative numbers")
    times_in = d.get("times")
    times_in = {} if times_in is None else f.obj(times_in, "times", free=True)
    times = {
        str(k): _decode_opt_floats(
            f.array(
                v,
                f"times.{k}",
                lambda x, p: x if x is None or x == "inf" else f.number(x, p, lo=0),
                length=n,
                what='non-negative numbers, null (no value) or "inf" (cannot run there)',
            )
        )
        for k, v in times_in.items()
    }
    edge_time = None
    if d.get("edge_time") is not None:
        edge_time = _decode_opt_floats(
            f.array(
                d["edge_time"],
                "edge_time",
                lambda x, p: x if x is None else f.number(x, p, lo=0),
                length=m,
                what="non-negative numbers or null",
            )
        )
    meta = d.get("meta")
    meta = {} if meta is None else f.obj(meta, "meta", free=True)
    for k in ("bytes_per_param", "grad_bytes_per_param"):  # meta keys the code reads
        if k in meta:
            f.number(meta[k], f"meta.{k}", lo=0, lo_open=True)
    if "name" in meta:
        f.text(meta["name"], "meta.name")
    if meta.get("batch") is not None:  # the runtime splits it into microbatches
        f.integer(meta["batch"], "meta.batch", lo=1)
    if "shared_params" in meta:  # groups of module names sharing one parameter (extraction)
        f.array(
            meta["shared_params"], "meta.shared_params",
            lambda v, p: f.array(v, p, f.string, what="module names"), what="lists of names",
        )  # fmt: skip
    if "model_dims" in meta:  # what hybrid layouts read: checked here, not at first use
        try:
            dims_from_mapping(meta["model_dims"])
        except ValueError as exc:
            raise f.fail("meta.model_dims", f"does not describe a model: {exc}") from None
    try:
        return CompGraph(
            flops=np.asarray(arrays["flops"], dtype=np.float64).reshape(-1),
            bytes_accessed=np.asarray(arrays["bytes_accessed"], dtype=np.float64).reshape(-1),
            out_bytes=np.asarray(arrays["out_bytes"], dtype=np.float64).reshape(-1),
            param_bytes=np.asarray(arrays["param_bytes"], dtype=np.float64).reshape(-1),
            act_bytes=np.asarray(arrays["act_bytes"], dtype=np.float64).reshape(-1),
            kind=np.asarray(arrays["kind"], dtype=np.int8).reshape(-1),
            group=np.asarray(arrays["group"], dtype=np.int64).reshape(-1),
            layer=np.asarray(arrays["layer"], dtype=np.int64).reshape(-1),
            name=tuple(names),
            module=tuple(module) if module is not None else ("",) * n,
            src=np.asarray(src, dtype=np.int64).reshape(-1),
            dst=np.asarray(dst, dtype=np.int64).reshape(-1),
            edge_bytes=np.asarray(ebytes, dtype=np.float64).reshape(-1),
            times=times,
            edge_time=edge_time,
            meta=dict(meta),
        )
    except ValueError as exc:  # a cycle: the only check left to CompGraph
        raise ValueError(f"{source}: {exc}") from None


def save(graph: CompGraph, path: str | Path, *, indent: int | None = None) -> None:
    """Write ``graph`` as JSON (gzip-compressed when ``path`` ends in ``.gz``)."""
    _write_json(to_dict(graph), path, indent)


def load(path: str | Path) -> CompGraph:
    """Read a graph written by :func:`save`; ``ValueError`` naming the file and field on bad input."""
    return from_dict(read_json(path), source=str(path))


# ============================================================== cluster files
def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """:meth:`Cluster.to_dict` plus format/version; unbounded memory is written as ``"inf"``."""
    d = cluster.to_dict()
    for dev in d["devices"]:
        for k, v in dev.items():
            if isinstance(v, float) and math.isinf(v):
                dev[k] = "inf" if v > 0 else "-inf"
    out = {"format": CLUSTER_FORMAT, "version": CLUSTER_VERSION, **d}
    out["meta"] = _jsonable(d["meta"], "meta")
    return out


def save_cluster(cluster: Cluster, path: str | Path, *, indent: int | None = 1) -> None:
    """Write ``cluster`` as JSON in the :meth:`Cluster.to_dict` form (explicit directed links)."""
    _write_json(cluster_to_dict(cluster), path, indent)


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster JSON file (from :func:`save_cluster`, or any :meth:`Cluster.from_dict` form)."""
    return Cluster.from_dict(read_json(path), source=str(path))


# ============================================================ Fiddle importer
def _stem(path: Path) -> str:
    """File name without ``.json`` / ``.json.gz``."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "fiddle"


def _fiddle_flag(s: Fields, node: Mapping[str, Any], key: str, where: str) -> bool:
    if key not in node:
        raise s.fail(f"{where}.{key}", "is missing; expected true/false or 0/1")
    v = node[key]
    if isinstance(v, bool):
        return v
    if _is_int(v) and v in (0, 1):
        return bool(v)
    raise s.fail(f"{where}.{key}", f"is {v!r}; expected true/false or 0/1")


def _fiddle_number(s: Fields, node: Mapping[str, Any], key: str, where: str, default=None) -> float:
    if key not in node:
        if default is not None:
            return default
        raise s.fail(f"{where}.{key}", "is missing; expected a non-negative number")
    return s.number(node[key], f"{where}.{key}", lo=0)


def read_fiddle(path: str | Path) -> tuple[CompGraph, Cluster]:
    """Import a workload in the JSON format of Tarnawski et al. (NeurIPS 2020, msr-fiddle/dnn-partitioning).

    Mapping (node order = order in the file):

    - node name ``str(id)``; kind BWD if ``isBackwardNode`` else FWD;
    - ``times = {"fpga": fpgaLatency (+inf when not supportedOnFpga), "cpu": cpuLatency}``,
      values kept exactly (the file's time unit; the simulator reads them as microseconds);
    - ``param_bytes = size`` (0 when absent, as in the reference code); flops and bytes 0;
    - nodes sharing a ``colorClass`` share a ``group``; a node without one is alone;
    - edge ``edge_time = cost`` exactly, ``edge_bytes = 0``;
    - ``meta = {"name": file stem, "format": "fiddle", "bytes_per_param": 1}``.

    The cluster has ``maxFPGAs`` devices ``fpga0..`` of kind ``"fpga"`` with memory
    ``maxSizePerFPGA``, then ``maxCPUs`` devices ``cpu0..`` of kind ``"cpu"`` with
    unbounded memory, joined all-to-all. Their FLOP/s, memory-bandwidth and link
    figures are placeholders: every node and edge carries an explicit time.

    Raises ``ValueError`` naming the file and the field, node id or edge for a
    malformed file: a missing key, a wrong type, a duplicate id, an edge to an
    unknown id, or two different costs on edges out of one node (beyond
    ``FIDDLE_COST_TOL``, the reference code's tolerance).
    """
    path = check_path(path, "read_fiddle: path")
    source = str(path)
    d = read_json(path)
    s = Fields(source)
    s.obj(d, "", required=("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"))
    max_size = s.number(d["maxSizePerFPGA"], "maxSizePerFPGA", lo=0, lo_open=True)
    n_fpga = s.integer(d["maxFPGAs"], "maxFPGAs", lo=0, hi=FIDDLE_MAX_DEVICES)
    n_cpu = s.integer(d["maxCPUs"], "maxCPUs", lo=0, hi=FIDDLE_MAX_DEVICES)
    if n_fpga + n_cpu == 0:
        raise s.fail("maxFPGAs", "and 'maxCPUs' are both 0; expected at least one device")
    if n_fpga + n_cpu > FIDDLE_MAX_DEVICES:
        raise s.error("maxCPUs", n_cpu, f"at most {FIDDLE_MAX_DEVICES} devices in all")
    for key in ("nodes", "edges"):
        if not isinstance(d[key], list):
            raise s.error(key, d[key], "a list")
    if not d["nodes"]:
        raise s.error("nodes", d["nodes"], "at least one node")

    # ---- nodes
    index: dict[int, int] = {}
    kind, cpu_t, fpga_t, size, group = [], [], [], [], []
    color_group: dict[int, int] = {}
    next_group = 0
    for i, node in enumerate(d["nodes"]):
        where = f"nodes[{i}]"
        s.obj(node, where, optional=FIDDLE_NODE_KEYS)
        nid = node.get("id")
        if not _is_int(nid):
            raise s.fail(f"{where}.id", f"is {nid!r}; expected an integer")
        if nid in index:
            raise s.fail(
                f"{where}.id", f"{nid} is used by nodes[{index[nid]}] too; ids must be unique"
            )
        where = f"nodes[{i}] (id {nid})"
        index[nid] = i
        supported = _fiddle_flag(s, node, "supportedOnFpga", where)
        kind.append(BWD if _fiddle_flag(s, node, "isBackwardNode", where) else FWD)
        cpu_t.append(_fiddle_number(s, node, "cpuLatency", where))
        f_lat = _fiddle_number(s, node, "fpgaLatency", where)
        fpga_t.append(f_lat if supported else math.inf)
        size.append(_fiddle_number(s, node, "size", where, default=0.0))
        if "name" in node:
            s.text(node["name"], f"{where}.name")
        if "colorClass" in node:
            cc = node["colorClass"]
            if not _is_int(cc):
                raise s.fail(f"{where}.colorClass", f"is {cc!r}; expected an integer")
            if cc not in color_group:
                color_group[cc] = next_group
                next_group += 1
            group.append(color_group[cc])
        else:
            group.append(next_group)
            next_group += 1

    # ---- edges
    src, dst, cost = [], [], []
    out_cost: dict[int, tuple[float, int]] = {}
    for j, e in enumerate(d["edges"]):
        where = f"edges[{j}]"
        s.obj(e, where, optional=("sourceId", "destId", "cost", "size"))
        ends = []
        for key in ("sourceId", "destId"):
            v = e.get(key)
            if not _is_int(v):
                raise s.fail(f"{where}.{key}", f"is {v!r}; expected an integer node id")
            if v not in index:
                raise s.fail(f"{where}.{key}", f"is {v}, which is not the id of any node")
            ends.append(v)
        c = _fiddle_number(s, e, "cost", f"{where} ({ends[0]} -> {ends[1]})")
        if ends[0] in out_cost and abs(out_cost[ends[0]][0] - c) > FIDDLE_COST_TOL:
            c0, j0 = out_cost[ends[0]]
            raise s.fail(
                f"{where}.cost",
                f"is {c!r} but edges[{j0}] out of the same node {ends[0]} costs {c0!r}; "
                "all edges out of one node must have the same cost",
            )
        out_cost.setdefault(ends[0], (c, j))
        src.append(index[ends[0]])
        dst.append(index[ends[1]])
        cost.append(c)

    n = len(kind)
    names = [str(node["id"]) for node in d["nodes"]]
    try:
        graph = CompGraph.build(
            n,
            list(zip(src, dst)),
            param_bytes=np.asarray(size, dtype=np.float64) if n else 0.0,
            kind=np.asarray(kind, dtype=np.int8) if n else FWD,
            group=np.asarray(group, dtype=np.int64) if n else None,
            name=names,
            edge_bytes=np.zeros(len(src)),
            times={"fpga": np.asarray(fpga_t, float), "cpu": np.asarray(cpu_t, float)},
            edge_time=np.asarray(cost, dtype=np.float64),
            meta={"name": _stem(path), "format": "fiddle", "bytes_per_param": 1},
        )
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return graph, fiddle_cluster(
        n_fpga, n_cpu, float(max_size), name=f"fiddle_{graph.meta['name']}"
    )


def fiddle_cluster(
    n_fpga: int, n_cpu: int, max_size_per_fpga: float, *, name: str = "fiddle"
) -> Cluster:
    """``n_fpga`` accelerators (kind ``"fpga"``, memory ``max_size_per_fpga``) then ``n_cpu``
    CPUs (kind ``"cpu"``, unbounded memory), joined all-to-all by placeholder links."""
    placeholder = {"peak_flops": 1e12, "mem_bw": 1e11}
    devices = tuple(
        Device(f"fpga{i}", "fpga", memory=max_size_per_fpga, **placeholder) for i in range(n_fpga)
    ) + tuple(Device(f"cpu{i}", "cpu", memory=math.inf, **placeholder) for i in range(n_cpu))
    k = len(devices)
    links = tuple(Link(a, b, 1e9, 0.0, "fiddle") for a in range(k) for b in range(k) if a != b)
    meta = {
        "description": f"Fiddle workload cluster: {n_fpga} accelerators + {n_cpu} CPUs",
        "source": "Tarnawski et al., NeurIPS 2020 (msr-fiddle/dnn-partitioning input format)",
        "placeholder_figures": True,
    }
    return Cluster(name, devices, links, (), meta)


__all__ = [
    "CLUSTER_FORMAT",
    "GRAPH_FORMAT",
    "GRAPH_VERSION",
    "cluster_to_dict",
    "fiddle_cluster",
    "from_dict",
    "load",
    "load_cluster",
    "read_fiddle",
    "save",
    "save_cluster",
    "to_dict",
]
