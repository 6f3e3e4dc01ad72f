"""Plan: a placement of a CompGraph on a Cluster, with optional pipeline, tensor-parallel and hybrid-layout fields."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import MAX_LAYOUT_MICROBATCHES, HybridLayout, balanced_stage_layers, model_dims
from graphs.schema import Fields, check_path, is_whole, read_json, show

PLAN_FORMAT = "devplace.plan"
PLAN_VERSION = 1
SCHEDULES = ("gpipe", "1f1b", "interleaved", "in_order")
#: Schedules of op placements only: ``in_order`` is the op-level runtime's static order
#: (``Simulator(schedule="in_order")``), which a hybrid layout cannot have.
OP_ONLY_SCHEDULES = ("in_order",)
#: Largest device index, stage id or tensor-parallel degree a plan file may hold.
MAX_DEVICE = 2**20
#: Most microbatches a plan file may ask for (a hybrid layout: per replica).
MAX_MICROBATCHES = MAX_LAYOUT_MICROBATCHES
#: A content hash as written by ``CompGraph.content_hash`` / ``Cluster.content_hash``.
_HASH = re.compile(r"[0-9a-z]{8,64}")

#: The largest device index a plan can hold (int64).
INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True, eq=False)
class Plan:
    """Where each node of a graph runs.

    Attributes:
        placement: ``int64[n]``, device index of each node in the graph's order.
        graph_hash, cluster_hash: ``content_hash()`` of the graph and cluster the
            plan was made for; :meth:`check` refuses any other pair.
        stage: optional ``int64[n]`` pipeline stage of each node.
        stage_device: optional device of each stage (``len == num_stages``).
        microbatches: microbatches per step (>= 1).
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or, for op placements only,
            ``"in_order"`` (the op-level runtime's static order, as
            ``Simulator(schedule="in_order")`` scores it; such a plan runs op by op,
            its stages, if any, only record how it was found).
        tp_degree: optional ``{colocation group id: tensor-parallel degree}``.
        meta: free-form provenance (algorithm, step time, oracle calls, ...).
        layout: optional :class:`graphs.layout.HybridLayout` (data x tensor x pipeline
            parallel layout of a layered model; see :meth:`hybrid`). ``None`` for
            op-placement plans.
    """

    placement: np.ndarray
    graph_hash: str = ""
    cluster_hash: str = ""
    stage: np.ndarray | None = None
    stage_device: tuple[int, ...] | None = None
    microbatches: int = 1
    schedule: str = "1f1b"
    tp_degree: Mapping[int, int] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    layout: HybridLayout | None = None

    def __post_init__(self) -> None:
        p = np.asarray(self.placement)
        if p.ndim != 1 or p.dtype == bool or (p.size and not np.issubdtype(p.dtype, np.integer)):
            if (
                p.ndim == 1
                and p.size
                and np.issubdtype(p.dtype, np.floating)
                and np.all(np.mod(p, 1) == 0)
            ):
                p = p.astype(np.int64)
            else:
                raise ValueError(
                    f"Plan.placement must be a 1-D integer array, got shape {p.shape} dtype {p.dtype}"
                )
        if p.size and p.max() > INT64_MAX:  # uint64 2**64-1 was cast to -1 without a word
            raise ValueError(
                f"Plan.placement holds device index {int(p.max())}, beyond any cluster "
                "(at most 2**63-1)"
            )
        p = p.astype(np.int64, copy=True)
        _no_negative(p, "Plan.placement", "device indices")
        p.flags.writeable = False
        object.__setattr__(self, "placement", p)
        if self.stage is not None:
            s = np.asarray(self.stage)
            if s.dtype == bool or (s.size and not np.issubdtype(s.dtype, np.integer)):
                raise ValueError(f"Plan.stage must hold integer stage ids, got dtype {s.dtype}")
            s = s.astype(np.int64, copy=True)
            if s.shape != p.shape:
                raise ValueError(f"Plan.stage has shape {s.shape}, expected {p.shape}")
            _no_negative(s, "Plan.stage", "stage ids")
            s.flags.writeable = False
            object.__setattr__(self, "stage", s)
        if self.stage_device is not None:
            object.__setattr__(
                self,
                "stage_device",
                tuple(_whole(x, "Plan.stage_device item", 0) for x in self.stage_device),
            )
        object.__setattr__(self, "microbatches", _whole(self.microbatches, "Plan.microbatches", 1))
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"Plan.schedule {self.schedule!r} is unknown; expected one of {SCHEDULES}"
            )
        object.__setattr__(
            self,
            "tp_degree",
            {
                _whole(k, "Plan.tp_degree group id"): _whole(v, "Plan.tp_degree degree", 1)
                for k, v in dict(self.tp_degree).items()
            },
        )
        if self.layout is not None and not isinstance(self.layout, HybridLayout):
            raise ValueError(
                f"Plan.layout must be a HybridLayout or None, got {type(self.layout).__name__}"
            )
        if self.schedule == "in_order" and any(d > 1 for d in self.tp_degree.values()):
            raise ValueError(
                "Plan.schedule 'in_order' runs op by op, without tensor parallelism; a plan "
                "with tp_degree > 1 runs on the pipeline runtime: use 'gpipe' or '1f1b'"
            )
        if self.layout is not None and self.schedule in OP_ONLY_SCHEDULES:
            raise ValueError(
                f"Plan.schedule {self.schedule!r} is for op placements only; a hybrid layout "
                f"runs {self.layout.schedule!r}"
            )
        if self.layout is not None:  # the layout decides; a file's other fields must agree
            lay = self.layout
            if self.schedule != lay.schedule:
                raise ValueError(
                    f"Plan.schedule {self.schedule!r} differs from its layout's schedule "
                    f"{lay.schedule!r} (a hybrid plan runs its layout's)"
                )
            if self.microbatches != lay.num_microbatches:
                raise ValueError(
                    f"Plan.microbatches {self.microbatches} differs from its layout's "
                    f"{lay.num_microbatches} (global_batch / (dp x microbatch_size))"
                )
            if self.tp_degree:  # an edited file's {"1": 3} was ignored: the layout's tp ran
                raise ValueError(
                    f"Plan.tp_degree {dict(self.tp_degree)} is for op-placement plans; a hybrid "
                    f"plan's tensor parallelism is its layout's tp ({lay.tp}"
                    + (f", per stage {[t for _, t in lay.meshes]}" if lay.stage_meshes else "")
                    + "): leave tp_degree empty"
                )
            if self.stage is not None or self.stage_device is not None:
                raise ValueError(
                    "Plan.stage / stage_device are for op-placement plans; a hybrid plan's "
                    "stages are its layout's stage_layers: leave them out"
                )

    # --------------------------------------------------------------- checks
    @classmethod
    def for_graph(cls, placement: Any, graph: CompGraph, cluster: Cluster, **kw: Any) -> Plan:
        """A plan stamped with the graph's and cluster's hashes, validated against them, and
        read back as :meth:`load` reads its file (``ValueError`` naming the field): a plan
        with ``stage`` but no ``stage_device``, ``microbatches`` over the bound or ``meta``
        that JSON cannot hold was made, and then refused by ``load`` or by ``save`` (2 Dec
        2026)."""
        check_graph_cluster("Plan.for_graph", graph, cluster, kw.get("meta"))
        plan = cls(np.asarray(placement), graph.content_hash(), cluster.content_hash(), **kw)
        plan.check(graph, cluster)
        cls.from_dict(json.loads(json.dumps(plan.to_dict())), source="Plan.for_graph")
        return plan

    @classmethod
    def hybrid(
        cls,
        graph: CompGraph,
        cluster: Cluster,
        *,
        dp: int,
        tp: int,
        pp: int,
        microbatch_size: int,
        global_batch: int,
        virtual_stages: int = 1,
        recompute: str = "none",
        sequence_parallel: bool = False,
        zero: int = 0,
        schedule: str | None = None,
        stage_layers: Any = None,
        stage_meshes: Any = None,
        stage_recompute: Any = None,
        stage_zero: Any = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Plan:
        """A hybrid-parallel plan of a layered (transformer) graph on ``cluster``.

        ``schedule`` defaults to ``"interleaved"`` when ``virtual_stages > 1`` else
        ``"1f1b"``; ``stage_layers`` to an even split of the model's layers into
        ``pp * virtual_stages`` chunks (:func:`graphs.layout.balanced_stage_layers`);
        ``stage_meshes`` (optional) gives each pipeline stage its own ``(dp, tp)`` submesh
        (:class:`graphs.layout.HybridLayout`; ``dp``, ``tp`` and ``microbatch_size`` are
        then the first stage's); ``stage_recompute`` (optional) one recomputation mode per
        stage (``recompute`` is then the first stage's); ``stage_zero`` (optional) one ZeRO
        stage per pipeline stage (``zero`` is then the first stage's). The plan's ``placement`` puts each node on the first device of its pipeline
        stage's ``dp x tp`` submesh (so op-level code sees a valid placement);
        ``microbatches`` is the layout's microbatch count per replica. Raises
        ``ValueError`` naming the field when the layout does not fit.
        """
        check_graph_cluster("Plan.hybrid", graph, cluster, meta)
        # numpy integers (a grid's np.int64 degrees) are integers here, as the planners take them
        dp, tp, pp, microbatch_size, global_batch, virtual_stages, zero = (
            int(v) if is_whole(v) else v
            for v in (dp, tp, pp, microbatch_size, global_batch, virtual_stages, zero)
        )
        if isinstance(sequence_parallel, np.bool_):
            sequence_parallel = bool(sequence_parallel)
        stage_layers, stage_meshes, stage_recompute, stage_zero = (
            _per_stage(f"Plan.hybrid: {name}", value)
            for name, value in (
                ("stage_layers", stage_layers),
                ("stage_meshes", stage_meshes),
                ("stage_recompute", stage_recompute),
                ("stage_zero", stage_zero),
            )
        )
        dims = model_dims(graph)
        if schedule is None:
            schedule = "interleaved" if is_whole(virtual_stages) and virtual_stages > 1 else "1f1b"
        if stage_layers is None:
            if is_whole(pp, 1) and is_whole(virtual_stages, 1):
                if pp * virtual_stages > dims.layers:
                    raise ValueError(
                        f"Plan.hybrid: pp * virtual_stages = {pp} * {virtual_stages} = "
                        f"{pp * virtual_stages} model chunks, more than the model's "
                        f"{dims.layers} layers"
                    )
                stage_layers = balanced_stage_layers(dims.layers, pp * virtual_stages)
            else:  # the layout's own checks name pp / virtual_stages (a TypeError before)
                stage_layers = ()

        def pairs(rows: Any) -> tuple:
            # entries that are not pairs are named by the layout's checks (TypeErrors before)
            return tuple(tuple(r) if isinstance(r, (list, tuple)) else r for r in rows or ())

        layout = HybridLayout(
            dp=dp,
            tp=tp,
            pp=pp,
            microbatch_size=microbatch_size,
            global_batch=global_batch,
            virtual_stages=virtual_stages,
            recompute=recompute,
            sequence_parallel=sequence_parallel,
            zero=zero,
            schedule=schedule,
            stage_layers=pairs(stage_layers),
            stage_meshes=pairs(stage_meshes),
            stage_recompute=tuple(stage_recompute or ()),
            stage_zero=tuple(stage_zero or ()),
        )
        return cls.from_layout(graph, cluster, layout, meta=meta)

    @classmethod
    def from_layout(
        cls,
        graph: CompGraph,
        cluster: Cluster,
        layout: HybridLayout,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> Plan:
        """The plan of :meth:`hybrid` for an existing :class:`HybridLayout`."""
        check_graph_cluster("Plan.from_layout", graph, cluster, meta)
        if not isinstance(layout, HybridLayout):
            raise TypeError(
                f"Plan.from_layout: layout must be a HybridLayout, got {type(layout).__name__}"
            )
        dims = model_dims(graph)
        layout.validate(dims.layers, dims.heads, cluster.num_devices, dims.kv_heads)
        plan = cls(
            hybrid_placement(graph, layout),
            graph.content_hash(),
            cluster.content_hash(),
            microbatches=layout.num_microbatches,
            schedule=layout.schedule,
            meta=dict(meta or {}),
            layout=layout,
        )
        plan.check(graph, cluster)
        return plan

    def check(self, graph: CompGraph, cluster: Cluster) -> None:
        """Raise ``ValueError`` unless this plan fits ``graph`` and ``cluster``."""
        check_placement(self.placement, graph, cluster)
        if self.graph_hash and self.graph_hash != graph.content_hash():
            raise ValueError(
                f"Plan was made for graph {self.graph_hash}, not for {graph.meta.get('name', '?')!r} "
                f"({graph.content_hash()})"
            )
        if self.cluster_hash and self.cluster_hash != cluster.content_hash():
            raise ValueError(
                f"Plan was made for cluster {self.cluster_hash}, not for {cluster.name!r} ({cluster.content_hash()})"
            )
        if self.stage is not None and self.stage_device is not None:
            ns = len(self.stage_device)
            if self.stage.min(initial=0) < 0 or self.stage.max(initial=0) >= ns:
                raise ValueError(f"Plan.stage values must be in [0, {ns}) (one per stage_device)")
            bad = np.asarray(self.stage_device)[self.stage] != self.placement
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"Plan: node {graph.name[i]!r} is in stage {int(self.stage[i])} whose device differs from its placement"
                )
        if self.layout is not None:
            dims = model_dims(graph)
            self.layout.validate(dims.layers, dims.heads, cluster.num_devices, dims.kv_heads)

    def check_layout_placement(self, graph: CompGraph) -> None:
        """A hybrid plan's ``placement`` must be its layout's (:func:`hybrid_placement`): a
        file whose placement was edited is refused by the node (it was ignored). Not part of
        :meth:`check`, which the simulator calls on every evaluation: this costs O(nodes)
        and halved the hybrid evaluations per second; the runtime calls it before a run."""
        if self.layout is None:
            return
        want = hybrid_placement(graph, self.layout)
        if not np.array_equal(want, self.placement):
            i = int(np.flatnonzero(want != self.placement)[0])
            raise ValueError(
                f"Plan.placement differs from its layout's: node {graph.name[i]!r} is on "
                f"device {int(self.placement[i])}, its layout puts it on {int(want[i])}"
            )

    def colocation_violations(self, graph: CompGraph) -> list[int]:
        """Colocation group ids whose nodes are split over several devices."""
        _, inv = graph.group_index()
        order = np.argsort(inv, kind="stable")
        g, p = inv[order], self.placement[order]
        split = (g[1:] == g[:-1]) & (p[1:] != p[:-1])
        return sorted({int(graph.group[order[i]]) for i in np.flatnonzero(split)})

    # ------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "graph_hash": self.graph_hash,
            "cluster_hash": self.cluster_hash,
            "placement": self.placement.tolist(),
            "stage": None if self.stage is None else self.stage.tolist(),
            "stage_device": None if self.stage_device is None else list(self.stage_device),
            "microbatches": int(self.microbatches),
            "schedule": self.schedule,
            "tp_degree": {str(k): v for k, v in self.tp_degree.items()},
            "meta": _jsonable(dict(self.meta)),
            "layout": None if self.layout is None else self.layout.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any, *, source: str = "plan") -> Plan:
        """Read :meth:`to_dict`'s form strictly.

        One ``ValueError`` naming ``source``, the field and the value for: a top level
        that is not an object, an unknown key (``meta`` is the free-form extension
        field), a missing graph or cluster hash, a device index, stage or degree that is
        not a non-negative integer (``0.9``, ``"1"`` and ``true`` are refused, not
        rounded), microbatches that are not a whole number >= 1, an unknown schedule.
        A ``layout`` object is handed to ``graphs.layout.HybridLayout.from_dict``.
        """
        f = Fields(source)
        f.depth(d)
        if not isinstance(d, Mapping):
            raise f.error("(top level)", d, "an object (a devplace plan)")
        if d.get("format") != PLAN_FORMAT:
            raise ValueError(
                f"{source}: not a devplace plan (field 'format' is {show(d.get('format'))}, "
                f"expected {PLAN_FORMAT!r})"
            )
        if not (type(d.get("version")) is int and d["version"] == PLAN_VERSION):
            v = show(d.get("version", "missing"))
            raise ValueError(
                f"{source}: field 'version' is {v}: plan version {v} is not supported "
                f"(expected {PLAN_VERSION})"
            )
        if not isinstance(d.get("placement"), list):
            raise f.error("placement", d.get("placement", "missing"), "a list of device indices")
        f.obj(
            d,
            "",
            # microbatches and schedule decide how the plan runs: a file without them used to
            # run as 1 microbatch, 1F1B, whatever it was planned for
            required=(
                "format",
                "version",
                "placement",
                "graph_hash",
                "cluster_hash",
                "microbatches",
                "schedule",
            ),
            optional=(
                "stage",
                "stage_device",
                "tp_degree",
                "meta",
                "layout",
            ),
        )
        device = lambda v, p: f.integer(v, p, lo=0, hi=MAX_DEVICE)  # noqa: E731
        placement = f.array(
            d["placement"], "placement", device, what="device indices", nonempty=True
        )
        hashes = {}
        for k in ("graph_hash", "cluster_hash"):
            v = d[k]
            if not isinstance(v, str) or not _HASH.fullmatch(v):
                what = k.split("_")[0]
                raise f.error(
                    k, v, f"the content hash of the {what} the plan was made for (Plan.for_graph)"
                )
            hashes[k] = v
        stage = None
        if d.get("stage") is not None:
            stage = f.array(
                d["stage"],
                "stage",
                lambda v, p: f.integer(v, p, lo=0, hi=MAX_DEVICE),
                length=len(placement),
                what="stage ids",
            )
        stage_device = None
        if d.get("stage_device") is not None:
            stage_device = tuple(
                f.array(
                    d["stage_device"], "stage_device", device, what="device indices", nonempty=True
                )
            )
        if (stage is None) != (stage_device is None):
            given, other = (
                ("stage", "stage_device") if stage is not None else ("stage_device", "stage")
            )
            raise f.error(
                other,
                d.get(other, "missing"),
                f"a list, since {given!r} is given (pipeline plans need both)",
            )
        if stage is not None and stage_device is not None:
            for i, (st, dev) in enumerate(zip(stage, placement)):
                if st >= len(stage_device):
                    raise f.error(
                        f"stage[{i}]",
                        st,
                        f"a stage id in [0, {len(stage_device) - 1}] (one per stage_device)",
                    )
                if stage_device[st] != dev:
                    raise f.error(
                        f"placement[{i}]", dev, f"{stage_device[st]}, the device of its stage {st}"
                    )
        microbatches = f.integer(d["microbatches"], "microbatches", lo=1, hi=MAX_MICROBATCHES)
        schedule = f.string(d["schedule"], "schedule", choices=SCHEDULES)
        tp_in = d.get("tp_degree")
        tp_in = {} if tp_in is None else f.obj(tp_in, "tp_degree", free=True)
        tp: dict[int, int] = {}
        for k, v in tp_in.items():
            if not re.fullmatch(r"-?(0|[1-9][0-9]{0,17})", k):
                raise f.fail(
                    f"tp_degree.{k}",
                    f"has key {show(k)}, which is not a colocation group id (an integer "
                    "written without leading zeros)",
                )
            tp[int(k)] = f.integer(v, f"tp_degree.{k}", lo=1, hi=MAX_DEVICE)
        meta = d.get("meta")
        meta = {} if meta is None else f.obj(meta, "meta", free=True)
        kw: dict[str, Any] = {}
        if d.get("layout") is not None:
            kw["layout"] = _read_layout(f, d["layout"])
        try:
            return cls(
                placement=np.asarray(placement, dtype=np.int64),
                stage=None if stage is None else np.asarray(stage, dtype=np.int64),
                stage_device=stage_device,
                microbatches=microbatches,
                schedule=schedule,
                tp_degree=tp,
                meta=dict(meta),
                **hashes,
                **kw,
            )
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    def save(self, path: str | Path) -> None:
        check_path(path, "Plan.save: path").write_text(
            json.dumps(self.to_dict(), indent=1, allow_nan=False)
        )

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read a plan file (see :meth:`from_dict`); ``ValueError`` naming the file and field,
        ``TypeError`` when ``path`` is not a file path."""
        path = check_path(path, "Plan.load: path")
        return cls.from_dict(read_json(path), source=str(path))

    @property
    def num_devices_used(self) -> int:
        return len(np.unique(self.placement))


def check_placement(placement: Any, graph: CompGraph, cluster: Cluster) -> np.ndarray:
    """Validate a placement array for ``graph`` on ``cluster``; return it as int64.

    Raises ``ValueError`` for a wrong length, non-integer values or a device
    index out of range, naming the offending node.
    """
    p = np.asarray(placement)
    if p.shape != (graph.num_nodes,):
        raise ValueError(
            f"placement has shape {p.shape}, expected ({graph.num_nodes},): one device index per node "
            f"of graph {graph.meta.get('name', '?')!r}"
        )
    if p.size and p.dtype == object and all(is_whole(x) for x in p):
        p = np.array([int(x) for x in p], dtype=object)  # Python ints, beyond int64 too
    elif p.size and not np.issubdtype(p.dtype, np.integer):
        # booleans were taken as devices 0 and 1, strings raised a numpy TypeError, complex
        # numbers numpy's "ufunc 'remainder' not supported" (fuzzing)
        if p.dtype == bool or not np.issubdtype(p.dtype, np.floating):
            raise ValueError(f"placement must hold integer device indices, got dtype {p.dtype}")
        if not np.all(np.mod(p, 1) == 0):
            raise ValueError("placement must hold integer device indices")
    # the range is checked before the cast: 2**64-1 (uint64) used to be reported as device -1
    bad = np.asarray((p < 0) | (p >= cluster.num_devices), dtype=bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"placement puts node {graph.name[i]!r} (index {i}) on device {int(p[i])}, "
            f"but cluster {cluster.name!r} has devices 0..{cluster.num_devices - 1}"
        )
    return p.astype(np.int64)


def check_microbatches(graph: CompGraph, microbatches: int, what: str, hint: str = "") -> None:
    """``ValueError`` when ``microbatches`` does not divide the model's batch
    (``graph.meta["batch"]``, where the graph records one): each microbatch must have the
    same number of samples. ``what`` names the setting, ``hint`` says how to change it."""
    batch = graph.meta.get("batch")
    if isinstance(batch, int) and batch > 0 and batch % int(microbatches):
        raise ValueError(
            f"{what} = {microbatches} does not divide the model's batch of {batch} (graph "
            f"{graph.meta.get('name', '?')!r}): each microbatch must have the same number of "
            f"samples{hint}"
        )


def _per_stage(what: str, value: Any) -> list | None:
    """A per-stage argument of :meth:`Plan.hybrid` as a list of plain Python values (numpy
    arrays and scalars converted; ``None`` kept), or ``ValueError`` for a string (read one
    character per stage) or a value that is not a sequence."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} = {value!r}: expected a list with one entry per stage")

    def plain(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return plain(v.tolist())
        if isinstance(v, (list, tuple)):
            return tuple(plain(x) for x in v)
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        return v

    return [plain(v) for v in value]


def hybrid_placement(graph: CompGraph, layout: HybridLayout) -> np.ndarray:
    """``int64[n]``: each node on the first device of its pipeline stage's submesh.

    A node of transformer layer ``l`` (``graph.layer``) belongs to the chunk holding
    ``l`` and so to pipeline rank ``chunk % pp``. Nodes outside the layers
    (``layer == -1``): forward nodes before the first layer in topological order
    (embeddings) go to the first stage, the others (final norm, head, loss) to the
    stage of the last chunk; a backward or optimizer node follows the forward node
    it names (``"bwd:"`` / ``"opt:"`` + name) or its colocation group, else the last stage.
    """
    n = graph.num_nodes
    chunk_rank = np.array([c % layout.pp for c in range(layout.num_chunks)], dtype=np.int64)
    layer_rank = np.empty(layout.num_layers, dtype=np.int64)
    for c, (a, b) in enumerate(layout.stage_layers):
        layer_rank[a:b] = chunk_rank[c]
    last = int(chunk_rank[-1])
    layer = graph.layer
    rank = np.full(n, -1, dtype=np.int64)
    inl = (layer >= 0) & (layer < layout.num_layers)
    rank[inl] = layer_rank[layer[inl]]
    rank[layer >= layout.num_layers] = last
    pos = np.empty(n, dtype=np.int64)
    pos[graph.topo_order] = np.arange(n)
    fwd_layer = (graph.kind == 0) & (layer >= 0)
    first_pos = int(pos[fwd_layer].min()) if fwd_layer.any() else n
    loose = np.flatnonzero(layer < 0)
    fwd_loose = loose[graph.kind[loose] == 0]
    rank[fwd_loose] = np.where(pos[fwd_loose] < first_pos, 0, last)
    group_rank: dict[int, int] = {}
    for i in np.flatnonzero(rank >= 0):
        group_rank.setdefault(int(graph.group[i]), int(rank[i]))
    idx = graph._name_index()
    for i in loose[graph.kind[loose] != 0]:
        nm = graph.name[i]
        j = idx.get(nm.split(":", 1)[1], -1) if ":" in nm else -1
        if j >= 0 and rank[j] >= 0:
            rank[i] = rank[j]
        else:
            rank[i] = group_rank.get(int(graph.group[i]), last)
    sizes = np.array([d * t for d, t in layout.meshes], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # layout.stage_offset(p)
    return offsets[rank]


def _no_negative(a: np.ndarray, what: str, are: str) -> None:
    """A negative entry of ``a`` is refused when the plan is made, naming its index (it
    was accepted until :meth:`Plan.check`, and a plan file kept it)."""
    if a.size and a.min() < 0:
        i = int(np.flatnonzero(a < 0)[0])
        raise ValueError(f"{what}[{i}] is {int(a[i])}; {are} are >= 0")


def _jsonable(x: Any) -> Any:
    """Plain JSON of ``x``; a non-finite float becomes the string ``"inf"``/``"-inf"``/``"nan"``
    (JSON has no such numbers, and plan files are read strictly)."""
    if isinstance(x, (float, np.floating)) and not np.isfinite(x):
        return str(float(x))
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    return x


def _whole(x: Any, what: str, lo: int | None = None) -> int:
    """``x`` as an int when it is a whole number (not a bool) >= ``lo``; ``ValueError`` otherwise."""
    ok = isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
    if not ok and isinstance(x, (float, np.floating)) and float(x).is_integer():
        ok, x = True, int(x)
    if not ok or (lo is not None and int(x) < lo):
        bound = "a whole number" if lo is None else f">= {lo} (a whole number)"
        raise ValueError(f"{what} must be {bound}, got {x!r}")
    return int(x)


def _read_layout(f: Fields, value: Any) -> HybridLayout:
    """The plan file's ``layout`` through :meth:`HybridLayout.from_dict` (which checks it)."""
    f.obj(value, "layout", free=True)
    try:
        return HybridLayout.from_dict(value)
    except (ValueError, TypeError, KeyError) as exc:
        raise f.fail("layout", f"is refused: {exc}") from None


def check_graph_cluster(who: str, graph: Any, cluster: Any, meta: Any = None) -> None:
    """``TypeError`` naming the argument when ``graph`` / ``cluster`` / ``meta`` is not what a
    plan is made for (a cluster's name used to fail with ``AttributeError: 'str' object has no
    attribute 'num_devices'``, a list as ``meta`` with a dictionary-update ``TypeError``).
    Shared by the plan constructors, the simulator and the planners of
    ``agents.baselines.get``."""
    if not isinstance(graph, CompGraph):
        raise TypeError(f"{who}: graph must be a CompGraph (graphs.zoo.build(...)), got {graph!r}")
    if not isinstance(cluster, Cluster):
        hint = f" (graphs.clusters.load({cluster!r}))" if isinstance(cluster, str) else ""
        raise TypeError(f"{who}: cluster must be a Cluster{hint}, got {cluster!r}")
    if meta is not None and not isinstance(meta, Mapping):
        raise TypeError(f"{who}: meta must be a mapping or None, got {meta!r}")
    if meta:  # a set or an object failed only in save(), in json's words (2 Dec 2026)
        import json

        try:  # as save() writes it: numpy values as numbers, keys as strings
            json.dumps(_jsonable(dict(meta)))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{who}: meta must hold JSON values (it is saved with the plan): {exc}"
            ) from None
