"""RunSpec: a plan resolved against its graph into what each rank executes (plain JSON, checked before launch)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import FWD, CompGraph
from graphs.plan import Plan, check_microbatches
from graphs.schema import is_number, is_whole

MODES = ("oplevel", "pipeline", "tp", "hybrid")


#: Process-group backends a spec may name (``None``: nccl on CUDA, else gloo).
BACKENDS = (None, "gloo", "nccl")
#: Optimizers the workers build (``runtime.worker.OPTIMIZERS``).
OPTIMIZER_NAMES = ("sgd", "adam")


@dataclass
class RunSpec:
    """Everything a rank needs; JSON-serialisable.

    Attributes:
        mode: ``"oplevel"`` (any DAG split by device), ``"pipeline"`` (stages), ``"tp"`` or
            ``"hybrid"`` (data x tensor x pipeline parallel, :mod:`runtime.hybrid`).
        world_size: number of processes, one per device of the plan.
        devices: cluster device index of each rank.
        device_of: forward (FX) node name -> rank (op-level plans).
        stage_of: forward (FX) node name -> stage (pipeline plans).
        stage_rank: pipeline index of each stage (its rank when ``tp_degree`` is 1).
        tp_degree: tensor-parallel degree (1 = none); ``tp_modules`` the module paths to shard.
            A pipeline with ``tp_degree`` t runs on ``world_size = pipeline ranks x t`` ranks,
            rank = pipeline index * t + tp index; ``devices`` lists them in rank order.
        model: the model spec (see :func:`runtime.model.load_model`).
        capture_grads: record the first step's (unsharded) gradients in each rank's record
            (for equivalence tests; large for real models).
        hybrid: for ``mode="hybrid"``, the layout (:meth:`runtime.hybrid.HybridSpec.to_dict`).
        hang_timeout_s: a rank that makes no progress outside communication (or whose
            watchdog stops answering) for this long during the steps is named and the job
            ended (:mod:`runtime.watchdog`); 0 disables. Keep it below ``timeout_s`` (the
            process-group timeout), which otherwise ends the job with symptoms only.
        fault: fault injection for failure-handling tests, ``{"rank": r, "step": i,
            "kind": "hang" | "die"}``: rank r sleeps for good (``hang``) or kills itself with
            SIGKILL (``die``) just before step i.
    """

    mode: str
    world_size: int
    devices: list[int]
    model: dict[str, Any]
    device_of: dict[str, int] = field(default_factory=dict)
    stage_of: dict[str, int] = field(default_factory=dict)
    stage_rank: list[int] = field(default_factory=list)
    tp_degree: int = 1
    tp_modules: list[str] = field(default_factory=list)
    microbatches: int = 1
    schedule: str = "1f1b"
    steps: int = 5
    warmup: int = 2
    seed: int = 0
    backend: str | None = None
    timeout_s: float = 60.0
    lr: float = 1e-3
    optimizer: str = "sgd"
    threads: int = 1
    plan_hash: str = ""
    capture_grads: bool = False
    hybrid: dict[str, Any] = field(default_factory=dict)
    hang_timeout_s: float = 45.0
    fault: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"RunSpec: unknown keys {sorted(unknown)}")
        return cls(**d)

    def validate(self) -> None:
        """Raise ``ValueError`` unless the fields are consistent."""
        if self.mode not in MODES:
            raise ValueError(f"RunSpec.mode {self.mode!r} is unknown; expected one of {MODES}")
        if self.world_size != len(self.devices):
            raise ValueError(
                f"RunSpec: world_size {self.world_size} != number of devices {len(self.devices)}"
            )
        bad = {k: r for k, r in self.device_of.items() if not 0 <= r < self.world_size}
        if bad:
            k = next(iter(bad))
            raise ValueError(
                f"RunSpec: node {k!r} is on rank {bad[k]}, outside [0, {self.world_size})"
            )
        tp = self.tp_degree
        if tp < 1 or self.world_size % tp:
            raise ValueError(
                f"RunSpec: tp_degree {tp} must be >= 1 and divide world_size {self.world_size}"
            )
        if self.mode == "hybrid":
            from runtime.hybrid import HybridSpec

            if not self.hybrid:
                raise ValueError("RunSpec: mode 'hybrid' needs the layout in RunSpec.hybrid")
            layout = HybridSpec.from_layout(self.hybrid)
            layout.validate()
            if self.world_size != layout.world_size:
                raise ValueError(
                    f"RunSpec: a hybrid plan with pp x dp x tp = {layout.pp} x {layout.dp} x "
                    f"{layout.tp} runs on {layout.world_size} ranks, got world_size {self.world_size}"
                )
        elif self.hybrid:
            raise ValueError(f"RunSpec: a layout (hybrid) is given but mode is {self.mode!r}")
        if self.mode == "tp" and self.world_size != tp:
            raise ValueError(
                f"RunSpec: a tensor-parallel plan runs on tp_degree={tp} ranks, got world_size "
                f"{self.world_size}"
            )
        if tp > 1 and not self.tp_modules and self.mode != "hybrid":
            raise ValueError(f"RunSpec: tp_degree {tp} needs tp_modules (module paths to shard)")
        if self.mode == "pipeline":
            pp = self.world_size // tp
            if not self.stage_rank:
                raise ValueError("RunSpec: a pipeline plan needs stage_rank")
            if sorted(set(self.stage_rank)) != list(range(pp)):
                raise ValueError(
                    f"RunSpec: stage_rank {self.stage_rank} must use every pipeline index "
                    f"0..{pp - 1} (world_size {self.world_size} = {pp} pipeline ranks x "
                    f"tp_degree {tp})"
                )
        if self.fault:
            kind, r = self.fault.get("kind"), self.fault.get("rank")
            if (
                kind not in ("hang", "die")
                or not isinstance(r, int)
                or not 0 <= r < self.world_size
            ):
                raise ValueError(
                    f"RunSpec.fault {self.fault!r}: expected kind 'hang' or 'die' and a rank in "
                    f"[0, {self.world_size})"
                )
        if self.hang_timeout_s < 0:
            raise ValueError(f"RunSpec.hang_timeout_s {self.hang_timeout_s} must be >= 0")
        # whole numbers: 2.5 failed on every rank unnamed, True ran 1 step (fuzzing)
        if not is_whole(self.steps, 1, floats=False) or not is_whole(self.warmup, 0, floats=False):
            raise ValueError(
                f"RunSpec: steps must be an integer >= 1 and warmup an integer >= 0, got "
                f"{self.steps!r}, {self.warmup!r}"
            )
        # checked here, before launch: each used to fail on every rank after it
        if self.backend not in BACKENDS:
            raise ValueError(
                f"RunSpec.backend {self.backend!r}: expected one of {BACKENDS} (None: nccl on "
                "CUDA, else gloo)"
            )
        if self.optimizer not in OPTIMIZER_NAMES:
            raise ValueError(
                f"RunSpec.optimizer {self.optimizer!r}: expected one of {OPTIMIZER_NAMES}"
            )
        if not is_whole(self.threads, 1):
            raise ValueError(f"RunSpec.threads {self.threads!r}: expected an integer >= 1")
        if not is_whole(self.seed, 0) or self.seed >= 2**32:  # the range runners.train accepts
            raise ValueError(f"RunSpec.seed {self.seed!r}: expected an integer in [0, 2**32)")
        for name in ("timeout_s", "lr"):
            v = getattr(self, name)
            if not is_number(v, 0, lo_open=True):
                raise ValueError(f"RunSpec.{name} {v!r}: expected a finite number > 0")


def plan_hash(plan: Plan) -> str:
    """SHA-256 (16 hex chars) of the plan's JSON form without its free-form ``meta``."""
    d = plan.to_dict()
    d.pop("meta", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def forward_names(graph: CompGraph) -> list[tuple[int, list[str]]]:
    """``(node index, FX names)`` of every forward node; coarse nodes expand through ``meta['members']``."""
    members = graph.meta.get("members")
    out = []
    for i in np.flatnonzero(graph.kind == FWD):
        names = [str(m) for m in members[i]] if members is not None else [graph.name[i]]
        names = [m for m in names if not m.startswith(("bwd:", "opt:"))]
        out.append((int(i), names))
    return out


def check_stages(plan: Any, graph: CompGraph, fwd: list[tuple[int, list[str]]]) -> None:
    """Refuse, before anything is launched, a staged plan that the pipeline runtime cannot
    run: a forward edge from a later stage to an earlier one, or a stage holding no
    forward node (each rank found these after its launch, some 20 s later)."""
    stage = np.asarray(plan.stage)
    is_fwd = graph.kind == FWD
    src, dst = graph.src, graph.dst
    back = np.flatnonzero(is_fwd[src] & is_fwd[dst] & (stage[src] > stage[dst]))
    if len(back):
        a, b = int(src[back[0]]), int(dst[back[0]])
        raise ValueError(
            f"pipeline plan is not monotone: {graph.name[a]!r} (stage {int(stage[a])}) feeds "
            f"{graph.name[b]!r} (stage {int(stage[b])}); every edge must go to the same or "
            "a later stage"
        )
    held = {int(stage[i]) for i, names in fwd if names}
    empty = [k for k in range(len(plan.stage_device)) if k not in held]
    if empty:
        raise ValueError(f"pipeline plan: stages {empty} hold no forward operations")


def tp_blocks(stage_devices: list[int], tp: int, cluster: Cluster) -> list[int]:
    """Cluster devices of the ranks of a pipeline with tensor parallelism, in rank order.

    The tp group of the pipeline rank on device ``d`` is the block ``d, d+1, ..., d+tp-1``
    (in a plan, a node's device is its tp group's first device). Raises ``ValueError``
    if a block leaves the cluster or two blocks overlap.
    """
    devices = [d + t for d in stage_devices for t in range(tp)]
    n = cluster.num_devices
    if max(devices) >= n:
        d = next(d for d in stage_devices if d + tp > n)
        raise ValueError(
            f"pipeline stage on device {d} with tp_degree {tp} needs devices {d}..{d + tp - 1}, "
            f"but cluster {cluster.name!r} has {n} devices ({len(stage_devices)} stages x "
            f"tp {tp} = {len(devices)} processes)"
        )
    if len(set(devices)) != len(devices):
        raise ValueError(
            f"pipeline stages on devices {stage_devices} with tp_degree {tp}: the tp groups "
            f"{[list(range(d, d + tp)) for d in stage_devices]} overlap; stage devices must be "
            f"at least {tp} apart"
        )
    return devices


def check_model_is_graphs(model: Mapping[str, Any], graph: CompGraph) -> None:
    """Refuse a zoo ``model`` (``{"name", "config"}``) that is not the one ``graph`` was
    extracted from (its ``meta`` name and config, defaults filled in): the runtime builds
    ``model`` and places its operators by the graph's names, so a 4-layer model ran under a
    2-layer plan, extra layers placed by a fallback (found by fuzzing ``runtime.execute``).
    Graphs without that record (files, factories) are not checked here."""
    gname, gcfg = graph.meta.get("name"), graph.meta.get("config")
    if "name" not in model or not isinstance(gname, str) or not isinstance(gcfg, dict):
        return
    cfg = dict(model.get("config") or {})
    if model["name"] != gname:
        raise ValueError(
            f"model {model['name']!r} is not the graph's model {gname!r}: the runtime places "
            "the model's operators by the graph's names"
        )
    differ = sorted(k for k, v in cfg.items() if k in gcfg and gcfg[k] != v)
    if differ:
        raise ValueError(
            f"model {gname!r} config "
            + ", ".join(f"{k}={cfg[k]!r}" for k in differ)
            + " is not the graph's ("
            + ", ".join(f"{k}={gcfg[k]!r}" for k in differ)
            + "): the runtime places the model's operators by the graph's names"
        )


def make_run_spec(
    plan: Plan,
    graph: CompGraph,
    cluster: Cluster,
    model: Mapping[str, Any] | None = None,
    **options: Any,
) -> RunSpec:
    """Check ``plan`` against ``graph`` and ``cluster`` and resolve it into a :class:`RunSpec`.

    Refuses (``ValueError``) a plan made for another graph or cluster, a device index
    out of range, a pipeline plan whose stages are not one per rank (unless the
    schedule is ``interleaved``; a plan with schedule ``in_order`` runs op by op, in the
    op-level runtime's static order, whatever its stages), non-uniform tensor-parallel degrees, and a
    tensor-parallel plan whose sharded sizes (features, heads) are not divisible by
    the degree or whose tp groups do not fit the cluster. A pipeline plan with
    ``tp_degree`` t runs on (pipeline devices) x t processes (see :func:`tp_blocks`).
    ``model`` defaults to ``plan.meta["model"]``; ``options`` set the other
    :class:`RunSpec` fields (steps, warmup, seed, backend, ...).
    """
    plan.check(graph, cluster)
    model = dict(model if model is not None else plan.meta.get("model") or {})
    if not model:
        raise ValueError(
            "plan names no model: set plan.meta['model'] = {'name': zoo_name, 'config': {...}} "
            "or pass model="
        )
    if getattr(plan, "layout", None) is not None:
        plan.check_layout_placement(graph)
        return hybrid_run_spec(plan, model, **options)
    check_model_is_graphs(model, graph)
    check_microbatches(graph, plan.microbatches, "plan.microbatches")
    split = plan.colocation_violations(graph)
    if split:  # the runtime places forward ops only; their backward and optimizer steps
        # follow them, so a backward or optimizer node elsewhere was ignored (fuzzing)
        g = split[0]
        where = sorted({int(plan.placement[i]) for i in np.flatnonzero(graph.group == g)})
        names = [graph.name[i] for i in np.flatnonzero(graph.group == g)][:4]
        raise ValueError(
            f"plan splits colocation group {g} ({', '.join(names)}, ...) over devices {where} "
            f"({len(split)} such group(s)): the runtime runs a forward op's backward and "
            "optimizer step on the forward op's device, so the plan would not run as written; "
            "place each group (a forward op with its bwd:/opt: nodes) on one device"
        )
    fwd = forward_names(graph)
    degrees = {d for d in plan.tp_degree.values() if d > 1}
    if len(degrees) > 1:
        raise ValueError(f"Plan.tp_degree: all degrees must be equal, got {sorted(degrees)}")
    tp = degrees.pop() if degrees else 1
    tp_modules: list[str] = []
    if tp > 1:
        groups = {g for g, d in plan.tp_degree.items() if d > 1}
        unknown = sorted(groups - {int(x) for x in np.unique(graph.group)})
        if unknown:
            raise ValueError(
                f"Plan.tp_degree names group(s) {unknown[:5]} that graph "
                f"{graph.meta.get('name', '?')!r} does not have (its groups are "
                f"{int(graph.group.min())}..{int(graph.group.max())})"
            )
        tp_modules = sorted(
            {graph.module[i] for i, _ in fwd if int(graph.group[i]) in groups and graph.module[i]}
        )
        if not tp_modules:  # the groups were not named (fuzzing, 2 Dec 2026)
            shown = sorted(groups)
            ops = [graph.name[i] for i, _ in fwd if int(graph.group[i]) in groups][:3]
            raise ValueError(
                f"Plan.tp_degree names group(s) {shown[:5]}{' ...' if len(shown) > 5 else ''} "
                f"whose forward nodes ({', '.join(ops) or 'none'}) have no module path to "
                "shard: tensor parallelism splits the Linear layers of named modules"
            )
    common = dict(
        model=model,
        microbatches=int(plan.microbatches),
        schedule=plan.schedule,
        tp_degree=tp,
        tp_modules=tp_modules,
        plan_hash=plan_hash(plan),
        **options,
    )
    if tp > 1:
        from runtime.tensor_parallel import check_tensor_parallel

        check_tensor_parallel(model, tp_modules, tp, int(plan.microbatches))
    staged = plan.stage is not None and plan.stage_device is not None
    # ``in_order`` is the op-level runtime's own order: such a plan runs op by op, its
    # stages (if a stage planner made it) only record how it was found
    if staged and plan.schedule != "in_order":
        sdev = list(plan.stage_device)
        used = list(dict.fromkeys(sdev))  # pipeline index = order of first stage
        rank_of = {d: r for r, d in enumerate(used)}
        stage_rank = [rank_of[d] for d in sdev]
        per_rank = np.bincount(stage_rank, minlength=len(used))
        if plan.schedule != "interleaved" and (per_rank > 1).any():
            raise ValueError(
                f"pipeline plan puts {int(per_rank.max())} stages on one device with schedule "
                f"{plan.schedule!r}; use schedule 'interleaved' or one stage per device"
            )
        if plan.schedule == "interleaved":
            R = len(used)
            if any(r != k % R for k, r in enumerate(stage_rank)):
                raise ValueError(
                    "interleaved pipeline plans must place stage k on the (k mod devices)-th device "
                    f"(looped layout); got stage devices {sdev}"
                )
        check_stages(plan, graph, fwd)
        stage_of = {m: int(plan.stage[i]) for i, names in fwd for m in names}
        devices = tp_blocks(used, tp, cluster) if tp > 1 else used
        spec = RunSpec(
            mode="pipeline",
            world_size=len(devices),
            devices=devices,
            stage_of=stage_of,
            stage_rank=stage_rank,
            **common,
        )
    elif tp > 1:
        used = sorted(set(plan.placement.tolist()))
        if len(used) == 1:  # a node's device is its tp group's first device
            devices = tp_blocks(used, tp, cluster)
        elif len(used) == tp and used == list(range(used[0], used[0] + tp)):
            devices = used  # the tp block itself, written out
        else:  # it ran plain tp on devices 0..tp-1, the placement ignored (found by fuzzing)
            raise ValueError(
                f"plan places its nodes on devices {used} with tp_degree {tp} and no pipeline "
                f"stages: tensor parallelism without stages runs the whole model on one tp "
                f"group, devices d..d+{tp - 1}; place every node on d (or give stages)"
            )
        spec = RunSpec(mode="tp", world_size=tp, devices=devices, **common)
    else:
        used = sorted(set(plan.placement.tolist()))
        rank_of = {d: r for r, d in enumerate(used)}
        device_of = {m: rank_of[int(plan.placement[i])] for i, names in fwd for m in names}
        # the op-level runtime runs partitions in its own order whatever the plan's schedule:
        # say so in the spec (and so in result.json), which said "gpipe" / "1f1b" (fuzzing)
        spec = RunSpec(
            mode="oplevel", world_size=len(used), devices=used, device_of=device_of,
            **{**common, "schedule": "in_order"},
        )  # fmt: skip
    spec.validate()
    return spec


def hybrid_run_spec(plan: Plan, model: Mapping[str, Any], **options: Any) -> RunSpec:
    """The :class:`RunSpec` of a plan with a hybrid ``layout`` (already checked against its
    graph and cluster): ``pp x dp x tp`` ranks (with ``stage_meshes``, the sum of the
    stages' ``dp_p x tp_p``), rank r on cluster device r (the layout's rank order). Refuses
    (``ValueError``) a model whose batch is not the layout's ``global_batch``
    or whose transformer blocks do not match ``stage_layers`` (the model is built on the
    meta device: no weights)."""
    from runtime.hybrid import HybridSpec, check_hybrid

    layout = HybridSpec.from_layout(plan.layout)
    layout.validate()
    check_hybrid(model, layout)
    world = layout.world_size
    spec = RunSpec(
        mode="hybrid",
        world_size=world,
        devices=list(range(world)),
        model=dict(model),
        hybrid=layout.to_dict(),
        microbatches=layout.num_microbatches,
        schedule=layout.schedule,
        plan_hash=plan_hash(plan),
        **options,
    )
    spec.validate()
    return spec
