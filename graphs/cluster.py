"""Cluster: compute devices, network nodes and directed links, with topology routing."""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

#: Reference message size used to pick routes (bytes): routes minimise latency + REF/bandwidth.
ROUTE_REF_BYTES = 1 << 20
#: Clusters of at most this many devices compute (and so check) every route at
#: construction; larger ones compute the routes from a device when first asked.
EAGER_ROUTE_DEVICES = 512
#: Numeric fields of a Device (stored as floats).
DEVICE_FIGURES = (
    "peak_flops",
    "mem_bw",
    "memory",
    "efficiency",
    "launch_overhead",
    "transfer_overhead",
    "receive_overhead",
)


@dataclass(frozen=True)
class Device:
    """One placement target.

    Attributes:
        name: unique name, e.g. ``"gpu0"``.
        kind: device kind, e.g. ``"v100"``, ``"cpu"``; keys ``CompGraph.times``.
        peak_flops: peak FLOP/s at the training precision.
        mem_bw: memory bandwidth, bytes/s.
        memory: memory capacity, bytes (``inf`` = unbounded).
        efficiency: achievable fraction of ``peak_flops`` (0, 1].
        launch_overhead: fixed cost per op, seconds.
        transfer_overhead: compute-stream seconds the device spends per transfer it
            sends or receives (LogP's ``o``; default 0). Left out of the JSON/YAML form
            and of ``Cluster.content_hash`` when 0, so older clusters keep their hash.
        receive_overhead: further compute-stream seconds per transfer the device
            receives (e.g. a rendezvous wait every blocking receive pays; default 0,
            left out of the JSON form and hash when 0 like ``transfer_overhead``).
    """

    name: str
    kind: str
    peak_flops: float
    mem_bw: float
    memory: float
    efficiency: float = 1.0
    launch_overhead: float = 0.0
    transfer_overhead: float = 0.0
    receive_overhead: float = 0.0

    def __post_init__(self) -> None:
        # store figures as floats so that equal clusters hash equal whether built from ints or floats
        for f in DEVICE_FIGURES:
            object.__setattr__(self, f, float(getattr(self, f)))
        for f in ("peak_flops", "mem_bw"):
            v = getattr(self, f)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"Device {self.name!r}: {f} must be finite and > 0, got {v!r}")
        if not (self.memory > 0):
            raise ValueError(
                f"Device {self.name!r}: memory must be > 0 (inf allowed), got {self.memory!r}"
            )
        if not (0 < self.efficiency <= 1):
            raise ValueError(
                f"Device {self.name!r}: efficiency must be in (0, 1], got {self.efficiency!r}"
            )
        if not (np.isfinite(self.launch_overhead) and self.launch_overhead >= 0):
            raise ValueError(
                f"Device {self.name!r}: launch_overhead must be finite and >= 0, got {self.launch_overhead!r}"
            )
        for f in ("transfer_overhead", "receive_overhead"):
            v = getattr(self, f)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"Device {self.name!r}: {f} must be finite and >= 0, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form; ``transfer_overhead`` and ``receive_overhead`` only when not 0."""
        d = asdict(self)
        for f in ("transfer_overhead", "receive_overhead"):
            if d[f] == 0.0:
                del d[f]
        return d


@dataclass(frozen=True)
class Link:
    """A directed link between two network nodes (indices into ``Cluster.node_names``).

    Attributes:
        src, dst: network-node indices (devices first, then switches/hosts).
        bandwidth: bytes/s.
        latency: seconds.
        name: a label such as ``"nvlink"``, ``"pcie"``, ``"ib"``.
    """

    src: int
    dst: int
    bandwidth: float
    latency: float
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", float(self.bandwidth))
        object.__setattr__(self, "latency", float(self.latency))
        object.__setattr__(self, "src", int(self.src))
        object.__setattr__(self, "dst", int(self.dst))
        if not (np.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise ValueError(
                f"Link {self.src}->{self.dst}: bandwidth must be finite and > 0, got {self.bandwidth!r}"
            )
        if not (np.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(
                f"Link {self.src}->{self.dst}: latency must be finite and >= 0, got {self.latency!r}"
            )


#: Valid range of each figure of a cluster file: (low, low excluded, high, +inf allowed).
_FIGURE_RANGE: dict[str, tuple[float, bool, float | None, bool]] = {
    "peak_flops": (0.0, True, None, False),
    "mem_bw": (0.0, True, None, False),
    "memory": (0.0, True, None, True),
    "efficiency": (0.0, True, 1.0, False),
    "launch_overhead": (0.0, False, None, False),
    "transfer_overhead": (0.0, False, None, False),
    "receive_overhead": (0.0, False, None, False),
    "bandwidth": (0.0, True, None, False),
    "latency": (0.0, False, None, False),
    "mult": (0.0, True, None, False),
}


def _figure(f: Any, value: Any, path: str, key: str) -> float:
    """A cluster figure: a number, or a string holding one (``"25e9"``: YAML 1.1 reads
    ``25e9`` as a string); ``"inf"`` only where unbounded is meaningful (``memory``)."""
    lo, lo_open, hi, allow_inf = _FIGURE_RANGE[key]
    x = value
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            x = value
    try:
        return f.number(x, path, lo=lo, lo_open=lo_open, hi=hi, allow_inf=allow_inf)
    except ValueError:
        raise f.error(path, value, _expect(key)) from None


def _expect(key: str) -> str:
    lo, lo_open, hi, allow_inf = _FIGURE_RANGE[key]
    out = 'a number (or "inf")' if allow_inf else "a finite number"
    out += f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        out += f" and <= {hi:g}"
    return out + (' (a string such as "25e9" is read as a number)')


#: ``Cluster.meta`` entries that change routes or costs, so part of the content hash:
#: routing through devices, the hybrid model's GEMM efficiency (as a device's
#: ``efficiency``) and gradient overlap, the node size of hierarchical collectives. A CPU
#: cluster's ``hybrid_calibration`` is left out on purpose: measurements of the same
#: machine, so plans made before a calibration stay valid for it.
COST_META = ("device_forwarding", "gemm_efficiency", "overlap_grad_reduce", "gpus_per_node")


@dataclass(frozen=True, eq=False)
class Cluster:
    """Devices plus a directed link graph over devices and switch/host nodes.

    Network nodes are ``devices`` (indices ``0..D-1``) followed by ``switches``
    (non-compute nodes such as host CPUs, PCIe or NVSwitch fabrics, NICs).
    Routing between two devices is the path minimising
    ``sum(latency + ROUTE_REF_BYTES / bandwidth)`` over its links (Dijkstra, ties
    broken by fewer hops then lower link ids), computed once at construction.
    Routes pass only through switches (a device does not forward other
    devices' traffic) unless ``meta["device_forwarding"]`` is true. Every
    ordered pair of distinct devices must be connected: checked at construction
    for clusters of up to :data:`EAGER_ROUTE_DEVICES` devices, and for larger ones
    (thousands of GPUs) when a route from a device is first asked for.
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    switches: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError(f"Cluster {self.name!r}: needs at least one device")
        names = [d.name for d in self.devices] + list(self.switches)
        if len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise ValueError(f"Cluster {self.name!r}: network node name {dup!r} is used twice")
        nn = len(names)
        for i, ln in enumerate(self.links):
            if not (0 <= ln.src < nn and 0 <= ln.dst < nn) or ln.src == ln.dst:
                raise ValueError(
                    f"Cluster {self.name!r}: link {i} ({ln.src}->{ln.dst}) must join two distinct nodes in [0, {nn})"
                )
        adj: list[list[tuple[int, int]]] = [[] for _ in range(nn)]
        for li, ln in enumerate(self.links):
            adj[ln.src].append((ln.dst, li))
        object.__setattr__(self, "_adj", adj)
        object.__setattr__(self, "_route_rows", {})
        if len(self.devices) <= EAGER_ROUTE_DEVICES:
            for s in range(len(self.devices)):  # every route now: a disconnected cluster fails here
                self._route_row(s)

    # -------------------------------------------------------------- routing
    def _route_row(self, s: int) -> list[tuple[int, ...]]:
        """Routes from device ``s`` to every device (Dijkstra, cached per source)."""
        rows: dict[int, list[tuple[int, ...]]] = self._route_rows  # type: ignore[attr-defined]
        row = rows.get(s)
        if row is not None:
            return row
        adj: list[list[tuple[int, int]]] = self._adj  # type: ignore[attr-defined]
        D = len(self.devices)
        forwarding = bool(self.meta.get("device_forwarding", False))
        dist: dict[int, tuple[float, int]] = {s: (0.0, 0)}
        prev: dict[int, tuple[int, int]] = {}
        heap = [(0.0, 0, s)]
        done: set[int] = set()
        while heap:
            d, h, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            if u < D and u != s and not forwarding:
                continue  # devices do not forward traffic: routes pass through switches only
            for v, li in adj[u]:
                ln = self.links[li]
                nd = d + ln.latency + ROUTE_REF_BYTES / ln.bandwidth
                key = (nd, h + 1)
                if v not in dist or key < dist[v] or (key == dist[v] and li < prev[v][1]):
                    dist[v] = key
                    prev[v] = (u, li)
                    heapq.heappush(heap, (nd, h + 1, v))
        row = [() for _ in range(D)]
        for t in range(D):
            if t == s:
                continue
            if t not in dist:
                raise ValueError(
                    f"Cluster {self.name!r}: no route from device {self.devices[s].name!r} "
                    f"to {self.devices[t].name!r}"
                )
            path = []
            v = t
            while v != s:
                u, li = prev[v]
                path.append(li)
                v = u
            row[t] = tuple(reversed(path))
        rows[s] = row
        return row

    def route(self, a: int, b: int) -> tuple[int, ...]:
        """Link indices on the route from device ``a`` to device ``b`` (empty if ``a == b``)."""
        D = self.num_devices
        if not (0 <= a < D and 0 <= b < D):
            raise ValueError(
                f"Cluster {self.name!r}: device index out of range in route({a}, {b}); have {D} devices"
            )
        return self._route_row(a)[b]

    def transfer_time(self, a: int, b: int, nbytes: float) -> float:
        """Uncontended time (s) to move ``nbytes`` from device a to b: sum of latencies + bytes / bottleneck bandwidth."""
        r = self.route(a, b)
        if not r:
            return 0.0
        lat = sum(self.links[i].latency for i in r)
        bw = min(self.links[i].bandwidth for i in r)
        return lat + nbytes / bw

    # ------------------------------------------------------------ properties
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices) + tuple(self.switches)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(d.kind for d in self.devices)

    @property
    def peak_flops(self) -> np.ndarray:
        return np.array([d.peak_flops for d in self.devices])

    @property
    def effective_flops(self) -> np.ndarray:
        return np.array([d.peak_flops * d.efficiency for d in self.devices])

    @property
    def mem_bw(self) -> np.ndarray:
        return np.array([d.mem_bw for d in self.devices])

    @property
    def memory(self) -> np.ndarray:
        return np.array([d.memory for d in self.devices])

    def bandwidth_matrix(self) -> np.ndarray:
        """(D, D) bottleneck bandwidth of each route, bytes/s (diagonal = inf)."""
        D = self.num_devices
        out = np.full((D, D), np.inf)
        for a in range(D):
            for b in range(D):
                if a != b:
                    out[a, b] = min(self.links[i].bandwidth for i in self.route(a, b))
        return out

    def latency_matrix(self) -> np.ndarray:
        """(D, D) summed latency of each route, seconds (diagonal = 0)."""
        D = self.num_devices
        out = np.zeros((D, D))
        for a in range(D):
            for b in range(D):
                if a != b:
                    out[a, b] = sum(self.links[i].latency for i in self.route(a, b))
        return out

    def subset(self, device_ids: Sequence[int], name: str | None = None) -> Cluster:
        """A cluster of some devices, keeping all switches and the links among kept nodes."""
        keep = list(device_ids)
        D = self.num_devices
        mapping = {old: new for new, old in enumerate(keep)}
        for j in range(len(self.switches)):
            mapping[D + j] = len(keep) + j
        links = tuple(
            Link(mapping[ln.src], mapping[ln.dst], ln.bandwidth, ln.latency, ln.name)
            for ln in self.links
            if ln.src in mapping and ln.dst in mapping
        )
        return Cluster(
            name or f"{self.name}[{','.join(map(str, keep))}]",
            tuple(self.devices[i] for i in keep),
            links,
            self.switches,
            dict(self.meta),
        )

    def with_endpoint_costs(self, transfer: float, receive: float = 0.0) -> Cluster:
        """This cluster with every device's ``transfer_overhead`` set to ``transfer`` and
        ``receive_overhead`` to ``receive`` (seconds; see :class:`Device`)."""
        devices = tuple(
            replace(d, transfer_overhead=transfer, receive_overhead=receive) for d in self.devices
        )
        return Cluster(self.name, devices, self.links, self.switches, dict(self.meta))

    def with_memory_fraction(self, fraction: float) -> Cluster:
        """This cluster with every device's memory capacity scaled by ``fraction``
        (``0 < fraction <= 1``): the share of each device a plan may use, the rest left for
        what the simulator does not count -- the CUDA context, the caching allocator's
        reserved but unallocated blocks, communication buffers (``docs/hybrid.md``, "Memory
        headroom"). Unbounded memories stay unbounded; ``meta["memory_fraction"]`` records
        the product of the fractions applied."""
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not (math.isfinite(fraction) and 0 < fraction <= 1)
        ):
            raise ValueError(
                f"Cluster {self.name!r}: memory_fraction must be a number in (0, 1], got "
                f"{fraction!r}"
            )
        if fraction == 1:
            return self
        devices = tuple(replace(d, memory=d.memory * fraction) for d in self.devices)
        meta = {
            **self.meta,
            "memory_fraction": float(self.meta.get("memory_fraction", 1.0)) * fraction,
        }
        return Cluster(self.name, devices, self.links, self.switches, meta)

    # ------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        """Explicit JSON form (see :meth:`from_dict`)."""
        names = self.node_names
        return {
            "name": self.name,
            "devices": [d.to_dict() for d in self.devices],
            "switches": list(self.switches),
            "links": [
                {
                    "src": names[ln.src],
                    "dst": names[ln.dst],
                    "bandwidth": ln.bandwidth,
                    "latency": ln.latency,
                    "name": ln.name,
                    "directed": True,
                }
                for ln in self.links
            ],
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "cluster") -> Cluster:
        """Build a cluster from a mapping (the YAML preset / JSON form), checking it strictly.

        Form::

            name: str
            description: str                          # optional, kept in meta
            source: str                               # optional, kept in meta
            device_types: {TYPE: {kind, peak_flops, mem_bw, memory, efficiency, launch_overhead,
                                  transfer_overhead, receive_overhead}}  # optional
            devices: [{name, type: TYPE, ...overrides} | {name, kind, peak_flops, mem_bw, memory, ...}]
            switches: [name, ...]                      # optional non-compute nodes
            link_types: {TYPE: {bandwidth, latency, mult, name}}  # optional
            links: [{src, dst, type: TYPE | bandwidth, latency, name?, mult?, directed?: false}, ...]
            meta: {...}                                # optional, free-form (the extension field)
            format: devplace.cluster, version: 1       # optional (written by graphs.io)

        Links are bidirectional (two directed links) unless ``directed: true``.
        ``mult: k`` multiplies a link's bandwidth (e.g. 2 bonded NVLinks).
        Numbers may be written as strings such as ``"25e9"`` (YAML reads ``25e9`` as a
        string); ``memory`` may be ``"inf"`` (unbounded). Anything else is one
        ``ValueError`` naming ``source``, the field (``devices[2].memory``) and the value:
        an unknown key, a wrong type (``true`` is not a number), a non-finite or
        out-of-range figure, no devices, a repeated name, a link to an unknown node or
        to itself, or a device another cannot reach.
        """
        from graphs.schema import Fields

        f = Fields(source)
        f.depth(d, allow_inf=True)  # memory may be unbounded
        if isinstance(d, Mapping) and "format" in d and d["format"] != "devplace.cluster":
            raise f.error("format", d["format"], "'devplace.cluster'")
        f.obj(
            d,
            "",
            required=("name", "devices"),
            optional=(
                "description",
                "source",
                "device_types",
                "switches",
                "link_types",
                "links",
                "meta",
                "format",
                "version",
            ),
        )
        if "version" in d and not (type(d["version"]) is int and d["version"] == 1):
            raise f.fail("version", f"is {d['version']!r}; this reader supports version 1")
        name = f.string(d["name"], "name")
        for k in ("description", "source"):
            if k in d:
                f.text(d[k], k)
        types = f.obj(d.get("device_types") or {}, "device_types", free=True)
        for t, spec in types.items():
            f.obj(spec, f"device_types.{t}", optional=("kind", *DEVICE_FIGURES))
        dev_list = f.array(d["devices"], "devices", lambda v, p: v, what="devices", nonempty=True)
        devices = []
        for i, dv in enumerate(dev_list):
            where = f"devices[{i}]"
            f.obj(dv, where, required=("name",), optional=("type", "kind", *DEVICE_FIGURES))
            spec: dict[str, Any] = {}
            origin: dict[str, str] = {}
            if "type" in dv:
                t = f.string(dv["type"], f"{where}.type")
                if t not in types:
                    raise f.error(f"{where}.type", t, f"a key of device_types {sorted(types)}")
                spec.update(types[t])
                origin.update({k: f"device_types.{t}.{k}" for k in types[t]})
            spec.update({k: v for k, v in dv.items() if k != "type"})
            origin.update({k: f"{where}.{k}" for k in dv if k != "type"})
            for k in ("kind", "peak_flops", "mem_bw", "memory"):
                if k not in spec:
                    raise f.fail(f"{where}.{k}", "is missing (not in the device nor its type)")
            fig = {k: _figure(f, spec[k], origin[k], k) for k in DEVICE_FIGURES if k in spec}
            devices.append(
                Device(
                    name=f.string(spec["name"], f"{where}.name"),
                    kind=f.string(spec["kind"], origin["kind"]),
                    **fig,
                )
            )
        f.unique([dv.name for dv in devices], "devices", ".name")
        switches = tuple(f.array(d.get("switches") or [], "switches", f.string, what="node names"))
        names = [dv.name for dv in devices] + list(switches)
        for j, sw in enumerate(switches):
            if sw in names[: len(devices) + j]:
                raise f.fail(f"switches[{j}]", f"is {sw!r}, already the name of another node")
        idx = {s: i for i, s in enumerate(names)}
        ltypes = f.obj(d.get("link_types") or {}, "link_types", free=True)
        link_keys = ("bandwidth", "latency", "mult", "name")
        for t, spec in ltypes.items():
            f.obj(spec, f"link_types.{t}", optional=link_keys)
        links: list[Link] = []
        joined: dict[tuple[int, int], str] = {}  # (src, dst) -> the link entry that joins them
        link_list = f.array(d.get("links") or [], "links", lambda v, p: v, what="links")
        for i, ln in enumerate(link_list):
            where = f"links[{i}]"
            f.obj(ln, where, required=("src", "dst"), optional=("type", "directed", *link_keys))
            spec = {}
            origin = {}
            if "type" in ln:
                t = f.string(ln["type"], f"{where}.type")
                if t not in ltypes:
                    raise f.error(f"{where}.type", t, f"a key of link_types {sorted(ltypes)}")
                spec.update(ltypes[t])
                origin.update({k: f"link_types.{t}.{k}" for k in ltypes[t]})
            spec.update({k: v for k, v in ln.items() if k != "type"})
            origin.update({k: f"{where}.{k}" for k in ln if k != "type"})
            for end in ("src", "dst"):
                if not isinstance(spec[end], str) or spec[end] not in idx:
                    raise f.error(f"{where}.{end}", spec[end], f"a device or switch name {names}")
            if spec["src"] == spec["dst"]:
                raise f.error(f"{where}.dst", spec["dst"], "a node other than its src")
            if "bandwidth" not in spec:
                raise f.fail(f"{where}.bandwidth", "is missing (not in the link nor its type)")
            bw = _figure(f, spec["bandwidth"], origin["bandwidth"], "bandwidth")
            mult = _figure(f, spec.get("mult", 1), origin.get("mult", ""), "mult")
            lat = _figure(f, spec.get("latency", 0.0), origin.get("latency", ""), "latency")
            label = f.text(spec.get("name", ln.get("type", "")), origin.get("name", where))
            directed = f.boolean(spec.get("directed", False), f"{where}.directed")
            a, b = idx[spec["src"]], idx[spec["dst"]]
            if not (math.isfinite(bw * mult) and bw * mult > 0):  # 1e200 x 1e200, 1e-200 x 1e-200
                raise f.fail(
                    where,
                    f"has bandwidth {bw!r} x mult {mult!r} = {bw * mult!r} bytes/s; the product "
                    "must be finite and > 0",
                )
            for pair in [(a, b)] if directed else [(a, b), (b, a)]:
                if pair in joined:  # two links of one direction: which one the routes took was
                    # an accident of order (found by fuzzing, 29 Nov 2026)
                    raise f.fail(
                        where,
                        f"links {spec['src']!r} and {spec['dst']!r} again ({joined[pair]} "
                        "already does in this direction); give bonded links as one link with "
                        "mult: k",
                    )
                joined[pair] = where
            links.append(Link(a, b, bw * mult, lat, label))
            if not directed:
                links.append(Link(b, a, bw * mult, lat, label))
        meta_in = d.get("meta")
        meta = {} if meta_in is None else dict(f.obj(meta_in, "meta", free=True))
        # the meta keys the code reads, checked here rather than at first use
        for k in ("device_forwarding", "overlap_grad_reduce"):
            if k in meta:
                f.boolean(meta[k], f"meta.{k}")
        if "gemm_efficiency" in meta:
            f.number(meta["gemm_efficiency"], "meta.gemm_efficiency", lo=0, lo_open=True, hi=1)
        if "gpus_per_node" in meta:
            f.integer(meta["gpus_per_node"], "meta.gpus_per_node", lo=1)
            if len(devices) % int(meta["gpus_per_node"]):  # 5 on 4 devices was clamped to 4
                raise f.fail(
                    "meta.gpus_per_node",
                    f"is {meta['gpus_per_node']}, which does not divide the cluster's "
                    f"{len(devices)} devices into whole nodes",
                )
        for k in ("description", "source"):
            if k in d:
                meta[k] = d[k]
        try:
            return cls(name, tuple(devices), tuple(links), switches, meta)
        except ValueError as exc:  # a device that cannot reach another
            raise f.fail("links", f"leave a pair of devices unconnected: {exc}") from None

    def content_hash(self) -> str:
        """SHA-256 (hex, 16 chars) of the devices and links, and of the ``meta`` entries
        that change routes or costs (:data:`COST_META`; ``gpus_per_node`` only when the
        devices span several nodes). Until 29 Nov 2026 ``meta`` was left out, so a cluster
        with ``device_forwarding`` (other routes, found by fuzzing: 100x another transfer
        time) had the hash of the one without: a plan made for one passed the other's check."""
        h = self.__dict__.get("_hash")
        if h is None:
            payload = self.to_dict()
            meta = payload.pop("meta")
            payload.pop("name")
            cost = {k: meta[k] for k in COST_META if k in meta}
            if int(cost.get("gpus_per_node", 0)) >= self.num_devices:
                cost.pop("gpus_per_node")  # one node: as if unset
            if cost:
                payload["cost_meta"] = cost
            text = json.dumps(payload, sort_keys=True, default=repr)
            h = hashlib.sha256(text.encode()).hexdigest()[:16]
            object.__setattr__(self, "_hash", h)
        return h

    def __repr__(self) -> str:
        kinds = sorted(set(self.kinds))
        return f"Cluster({self.name!r}, devices={self.num_devices}, kinds={kinds}, links={len(self.links)})"
