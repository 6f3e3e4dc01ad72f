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


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reject_constant(name: str) -> Any:
    raise ValueError(f'non-standard JSON constant {name} (write null or the string "inf")')


def _read_json(path: str | Path) -> Any:
    """Parse a (possibly gzipped) JSON file; ``ValueError`` naming the file when it is not JSON."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read file ({exc.strerror})") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{path}: not a valid gzip file ({exc})") from None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc})") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def _write_json(obj: Any, path: str | Path, indent: int | None) -> None:
    path = Path(path)
    text = json.dumps(obj, indent=indent, allow_nan=False)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    else:
        path.write_text(text)


class _Schema:
    """Field checks that raise ``ValueError("<source>: field 'x' ...")``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, msg: str) -> ValueError:
        return ValueError(f"{self.source}: field {field!r} {msg}")

    def mapping(self, d: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
        if key not in d:
            raise self.fail(prefix + key, "is missing; expected an object")
        v = d[key]
        if not isinstance(v, Mapping):
            raise self.fail(prefix + key, f"must be an object, got {type(v).__name__}")
        return v

    def array(
        self, d: Mapping[str, Any], key: str, n: int | None, what: str, ok, prefix: str = ""
    ) -> list[Any]:
        field = prefix + key
        if key not in d:
            raise self.fail(field, f"is missing; expected a list of {what}")
        v = d[key]
        if not isinstance(v, list):
            raise self.fail(field, f"must be a list of {what}, got {type(v).__name__}")
        if n is not None and len(v) != n:
            raise self.fail(field, f"has length {len(v)}, expected {n}")
        for i, x in enumerate(v):
            if not ok(x):
                raise self.fail(field, f"item {i} is {x!r}; expected {what}")
        return v


def _opt_float_ok(x: Any) -> bool:
    return x is None or _is_num(x) or x in ("inf", "-inf")


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

    Raises ``ValueError`` naming ``source``, the field and what was expected
    (missing key, wrong type, wrong length, unknown format or version), or the
    node / edge that :class:`CompGraph` validation refuses.
    """
    if not isinstance(d, Mapping):
        raise ValueError(
            f"{source}: expected a JSON object at the top level, got {type(d).__name__}"
        )
    if d.get("format") != GRAPH_FORMAT:
        raise ValueError(
            f"{source}: field 'format' is {d.get('format')!r}; expected {GRAPH_FORMAT!r}"
        )
    if d.get("version") != GRAPH_VERSION:
        raise ValueError(
            f"{source}: field 'version' is {d.get('version')!r}; this reader supports version {GRAPH_VERSION}"
        )
    s = _Schema(source)
    nodes = s.mapping(d, "nodes")
    names = s.array(nodes, "name", None, "strings", lambda x: isinstance(x, str), "nodes.")
    n = len(names)
    if "num_nodes" in d and d["num_nodes"] != n:
        raise s.fail("num_nodes", f"is {d['num_nodes']!r} but 'nodes.name' has {n} entries")
    arrays: dict[str, Any] = {}
    for f in _NODE_FLOATS:
        arrays[f] = s.array(nodes, f, n, "numbers", _is_num, "nodes.")
    arrays["kind"] = s.array(
        nodes,
        "kind",
        n,
        "0 (fwd), 1 (bwd) or 2 (opt)",
        lambda x: _is_int(x) and 0 <= x <= 2,
        "nodes.",
    )
    for f in ("group", "layer"):
        arrays[f] = s.array(nodes, f, n, "integers", _is_int, "nodes.")
    module = (
        s.array(nodes, "module", n, "strings", lambda x: isinstance(x, str), "nodes.")
        if "module" in nodes
        else None
    )
    edges = s.mapping(d, "edges")
    src = s.array(edges, "src", None, "integers", _is_int, "edges.")
    m = len(src)
    if "num_edges" in d and d["num_edges"] != m:
        raise s.fail("num_edges", f"is {d['num_edges']!r} but 'edges.src' has {m} entries")
    dst = s.array(edges, "dst", m, "integers", _is_int, "edges.")
    ebytes = s.array(edges, "bytes", m, "numbers", _is_num, "edges.")
    times_in = d.get("times") or {}
    if not isinstance(times_in, Mapping):
        raise s.fail(
            "times", f"must be an object {{device_kind: list}}, got {type(times_in).__name__}"
        )
    times = {
        str(k): _decode_opt_floats(
            s.array(times_in, k, n, 'numbers, null or "inf"', _opt_float_ok, "times.")
        )
        for k in times_in
    }
    edge_time = None
    if d.get("edge_time") is not None:
        edge_time = _decode_opt_floats(s.array(d, "edge_time", m, "numbers or null", _opt_float_ok))
    meta = d.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise s.fail("meta", f"must be an object, got {type(meta).__name__}")
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
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def save(graph: CompGraph, path: str | Path, *, indent: int | None = None) -> None:
    """Write ``graph`` as JSON (gzip-compressed when ``path`` ends in ``.gz``)."""
    _write_json(to_dict(graph), path, indent)


def load(path: str | Path) -> CompGraph:
    """Read a graph written by :func:`save`; ``ValueError`` naming the file and field on bad input."""
    return from_dict(_read_json(path), source=str(path))


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
    d = _read_json(path)
    if not isinstance(d, Mapping):
        raise ValueError(f"{path}: expected a JSON object at the top level, got {type(d).__name__}")
    if "format" in d and d["format"] != CLUSTER_FORMAT:
        raise ValueError(f"{path}: field 'format' is {d['format']!r}; expected {CLUSTER_FORMAT!r}")
    if "version" in d and d["version"] != CLUSTER_VERSION:
        raise ValueError(
            f"{path}: field 'version' is {d['version']!r}; this reader supports version {CLUSTER_VERSION}"
        )
    for key, typ in (("devices", list), ("links", list), ("switches", list)):
        if key in d and not isinstance(d[key], typ):
            raise ValueError(f"{path}: field {key!r} must be a list, got {type(d[key]).__name__}")
    try:
        return Cluster.from_dict(
            {k: v for k, v in d.items() if k not in ("format", "version")}, source=str(path)
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: malformed cluster ({type(exc).__name__}: {exc})") from None


# ============================================================ Fiddle importer
def _stem(path: Path) -> str:
    """File name without ``.json`` / ``.json.gz``."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "fiddle"


def _fiddle_flag(s: _Schema, node: Mapping[str, Any], key: str, where: str) -> bool:
    if key not in node:
        raise s.fail(f"{where}.{key}", "is missing; expected true/false or 0/1")
    v = node[key]
    if isinstance(v, bool):
        return v
    if _is_int(v) and v in (0, 1):
        return bool(v)
    raise s.fail(f"{where}.{key}", f"is {v!r}; expected true/false or 0/1")


def _fiddle_number(
    s: _Schema, node: Mapping[str, Any], key: str, where: str, default=None
) -> float:
    if key not in node:
        if default is not None:
            return default
        raise s.fail(f"{where}.{key}", "is missing; expected a non-negative number")
    v = node[key]
    if not _is_num(v) or not math.isfinite(v) or v < 0:
        raise s.fail(f"{where}.{key}", f"is {v!r}; expected a finite non-negative number")
    return float(v)


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
    path = Path(path)
    source = str(path)
    d = _read_json(path)
    s = _Schema(source)
    if not isinstance(d, Mapping):
        raise ValueError(
            f"{source}: expected a JSON object at the top level, got {type(d).__name__}"
        )
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"):
        if key not in d:
            raise s.fail(
                key, "is missing (Fiddle format: maxSizePerFPGA, maxFPGAs, maxCPUs, nodes, edges)"
            )
    max_size = d["maxSizePerFPGA"]
    if not _is_num(max_size) or not max_size > 0:
        raise s.fail("maxSizePerFPGA", f"is {max_size!r}; expected a positive number of bytes")
    n_fpga, n_cpu = d["maxFPGAs"], d["maxCPUs"]
    for key, v in (("maxFPGAs", n_fpga), ("maxCPUs", n_cpu)):
        if not _is_int(v) or v < 0:
            raise s.fail(key, f"is {v!r}; expected a non-negative integer")
    if n_fpga + n_cpu == 0:
        raise s.fail("maxFPGAs", "and 'maxCPUs' are both 0; expected at least one device")
    if not isinstance(d["nodes"], list) or not isinstance(d["edges"], list):
        bad = "nodes" if not isinstance(d["nodes"], list) else "edges"
        raise s.fail(bad, f"must be a list, got {type(d[bad]).__name__}")

    # ---- nodes
    index: dict[int, int] = {}
    kind, cpu_t, fpga_t, size, group = [], [], [], [], []
    color_group: dict[int, int] = {}
    next_group = 0
    for i, node in enumerate(d["nodes"]):
        where = f"nodes[{i}]"
        if not isinstance(node, Mapping):
            raise s.fail(where, f"must be an object, got {type(node).__name__}")
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
        if not isinstance(e, Mapping):
            raise s.fail(where, f"must be an object, got {type(e).__name__}")
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
