"""Cluster: compute devices, network nodes and directed links, with topology routing."""

from __future__ import annotations

import hashlib
import heapq
import json
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
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "cluster") -> Cluster:
        """Build a cluster from a mapping (the YAML preset / JSON form).

        Form::

            name: str
            device_types: {TYPE: {kind, peak_flops, mem_bw, memory, efficiency, launch_overhead,
                                  transfer_overhead}}  # optional
            devices: [{name, type: TYPE} | {name, kind, peak_flops, mem_bw, memory, ...}, ...]
            switches: [name, ...]                      # optional non-compute nodes
            link_types: {TYPE: {bandwidth, latency}}   # optional
            links: [{src, dst, type: TYPE | bandwidth, latency, name?, directed?: false}, ...]

        Links are bidirectional (two directed links) unless ``directed: true``.
        ``mult: k`` multiplies a link's bandwidth (e.g. 2 bonded NVLinks).
        Numbers may be written as strings such as ``"25e9"``.
        """

        def num(x: Any, what: str) -> float:
            try:
                return float(x)
            except (TypeError, ValueError):
                raise ValueError(f"{source}: {what} must be a number, got {x!r}") from None

        for key in ("name", "devices"):
            if key not in d:
                raise ValueError(f"{source}: missing required key {key!r}")
        types = d.get("device_types") or {}
        devices = []
        dev_fields = ("kind", *DEVICE_FIGURES)
        for i, dv in enumerate(d["devices"]):
            spec: dict[str, Any] = {}
            if "type" in dv:
                if dv["type"] not in types:
                    raise ValueError(
                        f"{source}: device {i} has unknown type {dv['type']!r}; known: {sorted(types)}"
                    )
                spec.update(types[dv["type"]])
            spec.update({k: v for k, v in dv.items() if k not in ("type",)})
            unknown = set(spec) - set(dev_fields) - {"name"}
            if unknown:
                raise ValueError(
                    f"{source}: device {i} has unknown fields {sorted(unknown)}; valid: {['name', *dev_fields]}"
                )
            for k in ("name", "kind", "peak_flops", "mem_bw", "memory"):
                if k not in spec:
                    raise ValueError(f"{source}: device {i} is missing {k!r}")
            devices.append(
                Device(
                    name=str(spec["name"]),
                    kind=str(spec["kind"]),
                    peak_flops=num(spec["peak_flops"], f"device {spec['name']}.peak_flops"),
                    mem_bw=num(spec["mem_bw"], f"device {spec['name']}.mem_bw"),
                    memory=num(spec["memory"], f"device {spec['name']}.memory"),
                    efficiency=num(
                        spec.get("efficiency", 1.0), f"device {spec['name']}.efficiency"
                    ),
                    launch_overhead=num(
                        spec.get("launch_overhead", 0.0), f"device {spec['name']}.launch_overhead"
                    ),
                    transfer_overhead=num(
                        spec.get("transfer_overhead", 0.0),
                        f"device {spec['name']}.transfer_overhead",
                    ),
                    receive_overhead=num(
                        spec.get("receive_overhead", 0.0),
                        f"device {spec['name']}.receive_overhead",
                    ),
                )
            )
        switches = tuple(str(s) for s in d.get("switches", ()) or ())
        names = [dv.name for dv in devices] + list(switches)
        idx = {s: i for i, s in enumerate(names)}
        ltypes = d.get("link_types") or {}
        links: list[Link] = []
        for i, ln in enumerate(d.get("links", ()) or ()):
            spec = dict(ltypes.get(ln["type"], {})) if "type" in ln else {}
            if "type" in ln and ln["type"] not in ltypes:
                raise ValueError(
                    f"{source}: link {i} has unknown type {ln['type']!r}; known: {sorted(ltypes)}"
                )
            spec.update({k: v for k, v in ln.items() if k != "type"})
            for end in ("src", "dst"):
                if spec.get(end) not in idx:
                    raise ValueError(
                        f"{source}: link {i} {end}={spec.get(end)!r} is not a device or switch; known: {names}"
                    )
            bw = num(spec.get("bandwidth"), f"link {i}.bandwidth") * num(
                spec.get("mult", 1), f"link {i}.mult"
            )
            lat = num(spec.get("latency", 0.0), f"link {i}.latency")
            label = str(spec.get("name", ln.get("type", "")))
            a, b = idx[spec["src"]], idx[spec["dst"]]
            links.append(Link(a, b, bw, lat, label))
            if not spec.get("directed", False):
                links.append(Link(b, a, bw, lat, label))
        meta = dict(d.get("meta") or {})
        for k in ("description", "source"):
            if k in d:
                meta[k] = d[k]
        return cls(str(d["name"]), tuple(devices), tuple(links), switches, meta)

    def content_hash(self) -> str:
        """SHA-256 (hex, 16 chars) of the devices and links."""
        h = self.__dict__.get("_hash")
        if h is None:
            payload = self.to_dict()
            payload.pop("meta")
            payload.pop("name")
            h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
            object.__setattr__(self, "_hash", h)
        return h

    def __repr__(self) -> str:
        kinds = sorted(set(self.kinds))
        return f"Cluster({self.name!r}, devices={self.num_devices}, kinds={kinds}, links={len(self.links)})"
