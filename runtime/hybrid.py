"""Hybrid plans: data x tensor x pipeline parallel on a (pp, dp, tp) device mesh, with ZeRO and recomputation."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from graphs.layout import (
    StageMeshes,
    stage_meshes_problem,
    stage_recompute_problem,
    stage_zero_problem,
)
from runtime.pipeline import SCHEDULE_CLASSES, _loss_of_output, _patch_wait, _zeros, stage_modules
from runtime.program import (
    MODEL_PREFIX,
    canonical_params,
    compute_nodes,
    export_with_loss,
    value_meta,
)
from runtime.tensor_parallel import fused_permutation, implicit_replication, parallelize_program
from runtime.timers import StepTimer

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
MESH_DIM_NAMES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class HybridSpec(StageMeshes):
    """The layout of a hybrid plan as the runtime executes it (the fields of
    ``graphs.layout.HybridLayout``; JSON-serialisable).

    Attributes:
        dp, tp, pp: data-, tensor- and pipeline-parallel degrees; ``world_size = pp * dp * tp``,
            rank = ``(p * dp + d) * tp + t`` (mesh ``("pp", "dp", "tp")``, tp innermost).
        microbatch_size: samples per microbatch on one data-parallel replica.
        global_batch: samples per optimizer step over all replicas
            (``num_microbatches = global_batch // (dp * microbatch_size)``).
        virtual_stages: model chunks per pipeline rank (> 1 only with ``interleaved``).
        recompute: ``"none"``, ``"selective"`` (each transformer layer keeps its matmul
            outputs and recomputes the rest in backward) or ``"full"`` (each layer keeps
            only its input and recomputes its forward in backward).
        sequence_parallel: Megatron sequence parallelism (needs ``tp > 1``).
        zero: 0 = replicated parameters, gradients all-reduced over dp (FSDP2's
            ``replicate``, DDP semantics); 1 and 2 = FSDP2 ``fully_shard`` with
            ``reshard_after_forward=False`` (optimizer state and gradients sharded,
            parameters gathered once per step and kept until backward; ZeRO-1 runs as
            ZeRO-2); 3 = ``fully_shard`` resharding after forward (parameters sharded too).
        schedule: ``gpipe``, ``1f1b`` or ``interleaved`` (``ScheduleInterleaved1F1B``).
        stage_recompute: empty (every chunk under ``recompute``) or one recomputation mode
            per pipeline stage (``virtual_stages == 1``; ``stage_recompute[0] ==
            recompute``), as ``graphs.layout.HybridLayout.stage_recompute``.
        stage_zero: empty (every stage under ``zero``) or one ZeRO stage per pipeline stage
            (``virtual_stages == 1``; ``stage_zero[0] == zero``), as
            ``graphs.layout.HybridLayout.stage_zero``: each pipeline rank wraps its chunks
            as its own stage says. A tied embedding's gradient is summed between the first
            and last stages shard by shard when both shard (1-3) or both replicate (0), and
            as full tensors (gathered over the sharding stage's dp group, then cut back to
            its shard) when one shards and the other replicates.
        stage_meshes: empty (every stage on a ``dp x tp`` submesh) or one ``(dp_p, tp_p)``
            pair per pipeline stage (``virtual_stages == 1``; ``stage_meshes[0] == (dp,
            tp)``), as ``graphs.layout.HybridLayout.stage_meshes``: stage ``p`` runs on the
            ``dp_p * tp_p`` consecutive ranks from :meth:`stage_offset`, splitting each
            microbatch of ``dp * microbatch_size`` samples over its ``dp_p`` ranks; executed
            by :class:`runtime.submesh.SubmeshRunner` (see :func:`make_runner`).
        stage_layers: half-open transformer-layer ranges, one per model chunk, in
            pipeline order (``pp * virtual_stages`` chunks, chunk c on pipeline rank
            ``c % pp``); chunk 0 also holds the embeddings, the last chunk the head and loss.
    """

    dp: int
    tp: int
    pp: int
    microbatch_size: int
    global_batch: int
    stage_layers: tuple[tuple[int, int], ...]
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    schedule: str = "1f1b"
    stage_recompute: tuple[str, ...] = ()
    stage_zero: tuple[int, ...] = ()
    stage_meshes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "stage_layers", tuple((int(a), int(b)) for a, b in self.stage_layers)
        )
        object.__setattr__(self, "stage_recompute", tuple(self.stage_recompute or ()))
        object.__setattr__(self, "stage_zero", tuple(self.stage_zero or ()))
        object.__setattr__(
            self, "stage_meshes", tuple((int(a), int(b)) for a, b in self.stage_meshes or ())
        )

    @classmethod
    def from_layout(cls, layout: Any) -> HybridSpec:
        """From a ``graphs.layout.HybridLayout`` (or any object or mapping with its fields)."""
        get = layout.get if isinstance(layout, Mapping) else functools.partial(getattr, layout)
        names = [f for f in cls.__dataclass_fields__]
        missing = [
            n for n in ("dp", "tp", "pp", "microbatch_size", "global_batch") if get(n, None) is None
        ]
        if missing:
            raise ValueError(f"hybrid layout: missing field(s) {missing}")
        kw = {n: get(n, None) for n in names}
        if kw["stage_layers"] is None:
            raise ValueError("hybrid layout: missing field 'stage_layers' (layer range per chunk)")
        return cls(**{k: v for k, v in kw.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_layers"] = [list(r) for r in self.stage_layers]
        for key in ("stage_recompute", "stage_zero"):  # as HybridLayout's JSON: only when set
            if getattr(self, key):
                d[key] = list(getattr(self, key))
            else:
                d.pop(key)
        if self.stage_meshes:
            d["stage_meshes"] = [list(m) for m in self.stage_meshes]
        else:
            d.pop("stage_meshes")
        return d

    def stage_zero_of(self, p: int) -> int:
        """The ZeRO stage of pipeline rank ``p``."""
        return self.stage_zero[p] if self.stage_zero else self.zero

    def chunk_recompute(self, c: int) -> str:
        """The recomputation mode of model chunk ``c`` (its pipeline stage's)."""
        return self.stage_recompute[c % self.pp] if self.stage_recompute else self.recompute

    @property
    def num_chunks(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def num_microbatches(self) -> int:
        return self.global_batch // (self.dp * self.microbatch_size)

    def validate(self, n_layer: int | None = None) -> None:
        """Raise ``ValueError`` naming the field unless the layout is executable."""
        for name in ("dp", "tp", "pp", "microbatch_size", "global_batch", "virtual_stages"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"hybrid layout: {name}={getattr(self, name)} must be >= 1")
        if self.global_batch % (self.dp * self.microbatch_size):
            raise ValueError(
                f"hybrid layout: global_batch {self.global_batch} is not a multiple of dp x "
                f"microbatch_size = {self.dp} x {self.microbatch_size}"
            )
        if self.recompute not in RECOMPUTE:
            raise ValueError(
                f"hybrid layout: recompute={self.recompute!r}; expected one of {RECOMPUTE}"
            )
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"hybrid layout: schedule={self.schedule!r}; expected one of {SCHEDULES}"
            )
        problem = stage_recompute_problem(
            self.stage_recompute, self.pp, self.virtual_stages, self.recompute
        )
        if problem is not None:
            field_name, value, expected = problem
            raise ValueError(f"hybrid layout: {field_name} = {value!r}: expected {expected}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"hybrid layout: zero={self.zero} must be 0, 1, 2 or 3")
        problem = stage_zero_problem(self.stage_zero, self.pp, self.virtual_stages, self.zero)
        if problem is not None:
            field_name, value, expected = problem
            raise ValueError(f"hybrid layout: {field_name} = {value!r}: expected {expected}")
        problem = stage_meshes_problem(
            self.stage_meshes, self.pp, self.virtual_stages, self.dp, self.tp,
            self.microbatch_size,
        )  # fmt: skip
        if problem is not None:
            field_name, value, expected = problem
            raise ValueError(f"hybrid layout: {field_name} = {value!r}: expected {expected}")
        if self.sequence_parallel and max(t for _, t in self.meshes) < 2:
            raise ValueError("hybrid layout: sequence_parallel=True needs tp > 1")
        if (self.schedule == "interleaved") != (self.virtual_stages > 1):
            raise ValueError(
                f"hybrid layout: schedule {self.schedule!r} with virtual_stages="
                f"{self.virtual_stages}; 'interleaved' needs virtual_stages > 1 and the other "
                "schedules run one chunk per pipeline rank"
            )
        if self.schedule == "interleaved" and self.num_microbatches % self.pp:
            raise ValueError(
                f"hybrid layout: the interleaved schedule needs num_microbatches "
                f"({self.num_microbatches}) to be a multiple of pp ({self.pp})"
            )
        if len(self.stage_layers) != self.num_chunks:
            raise ValueError(
                f"hybrid layout: stage_layers has {len(self.stage_layers)} ranges, expected "
                f"pp x virtual_stages = {self.num_chunks}"
            )
        nxt = 0
        for c, (a, b) in enumerate(self.stage_layers):
            if a != nxt or b <= a:
                raise ValueError(
                    f"hybrid layout: stage_layers[{c}] = [{a}, {b}) must start at layer {nxt} "
                    f"and hold at least one layer (ranges are contiguous, in pipeline order)"
                )
            nxt = b
        if n_layer is not None and nxt != n_layer:
            raise ValueError(
                f"hybrid layout: stage_layers cover layers 0..{nxt - 1}, the model has "
                f"{n_layer} transformer layers"
            )


# ---------------------------------------------------------------------------- layers of a program
def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return path[len(MODEL_PREFIX) :] if path.startswith(MODEL_PREFIX) else path


def block_list(gm: fx.GraphModule) -> tuple[str, int]:
    """``(path, length)`` of the model's transformer-block list, read from the ops' module
    paths: the prefix ``P`` of ``P.<i>...`` paths with the most distinct indices ``i``
    (``h`` for GPT-2, ``layers`` for LLaMA); ``length`` = largest index + 1."""
    found: dict[str, set[int]] = {}
    for n in compute_nodes(gm):
        m = re.match(r"^(.*?)\.(\d+)(\.|$)", _module_path(n))
        if m:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))
    if not found:
        raise ValueError(
            "hybrid plan: no op of the model lies in a list of blocks (module path 'P.<i>'), "
            "so there are no transformer layers to cut into stages"
        )
    path = max(found, key=lambda k: len(found[k]))
    return path, max(found[path]) + 1


def segment_of_nodes(gm: fx.GraphModule, blocks: str, n_layer: int) -> dict[str, int]:
    """Per compute node, its segment: 0 = before the first block (embeddings), ``1 + l`` =
    transformer block ``l`` (from the node's module path ``blocks.l...``), ``n_layer + 1`` =
    after the last block (final norm, head, loss). Nodes outside any block between blocks
    (residual adds written in the parent's forward) follow their latest input."""
    pat = re.compile(rf"^{re.escape(blocks)}\.(\d+)(\.|$)")
    nodes = compute_nodes(gm)
    layer: dict[str, int | None] = {}
    for n in nodes:
        m = pat.match(_module_path(n))
        layer[n.name] = int(m.group(1)) if m else None
    idx = [i for i, n in enumerate(nodes) if layer[n.name] is not None]
    if not idx:
        raise ValueError(f"hybrid plan: no op of the program belongs to a block {blocks}.<i>")
    first, last = idx[0], idx[-1]
    seg: dict[str, int] = {}
    for i, n in enumerate(nodes):
        lay = layer[n.name]
        if lay is not None:
            seg[n.name] = 1 + lay
        elif i < first:
            seg[n.name] = 0
        elif i > last:
            seg[n.name] = n_layer + 1
        else:
            seg[n.name] = max((seg[a.name] for a in n.all_input_nodes if a.name in seg), default=0)
    return seg


def _checked_program(
    model: Mapping[str, Any], microbatch_size: int
) -> tuple[int, list[str], int, fx.GraphModule]:
    """``(batch, blocks, n_layer, program)`` of ``model`` exported (on the meta device) for
    one microbatch of ``microbatch_size`` samples. Cached per plain-JSON spec (the export of
    a small GPT-2 costs about a second of CPU; a calibration checks the same model's probe
    plans again and again); a spec holding live objects is exported every time."""
    import json

    try:
        key = json.dumps([model, microbatch_size], sort_keys=True)
    except (TypeError, ValueError):
        return _export_program(model, microbatch_size)
    return _exported(key)


@functools.lru_cache(maxsize=8)
def _exported(key: str) -> tuple[int, list[str], int, fx.GraphModule]:
    import json

    return _export_program(*json.loads(key))


def _export_program(
    model: Mapping[str, Any], microbatch_size: int
) -> tuple[int, list[str], int, fx.GraphModule]:
    from runtime.model import load_model

    zm = load_model(model, device="meta")
    batch = int(zm.example_inputs[0].shape[0])
    mb = tuple(x[:microbatch_size] for x in zm.example_inputs)
    gm = export_with_loss(zm.module, mb, zm.loss_fn)
    blocks, n_layer = block_list(gm)
    return batch, blocks, n_layer, gm


def check_hybrid(model: Mapping[str, Any], layout: HybridSpec) -> None:
    """Before launch: build ``model`` (a :func:`runtime.model.load_model` spec) on the meta
    device and check its batch against ``global_batch`` and its transformer blocks against
    ``stage_layers`` (and, with tp > 1, its Megatron plan: features and heads divisible)."""
    batch, blocks, n_layer, gm = _checked_program(model, layout.microbatch_size)
    if batch != layout.global_batch:
        raise ValueError(
            f"hybrid plan: the model's batch is {batch} samples but the layout's global_batch "
            f"is {layout.global_batch} (set the model config's batch to global_batch)"
        )
    layout.validate(n_layer)
    from runtime.tensor_parallel import megatron_plan

    for tp in sorted({t for _, t in layout.meshes if t > 1}):
        megatron_plan(gm, [blocks], tp)


# ---------------------------------------------------------------------------- sequence parallel
def seq_gather(x: Any) -> Any:
    """Sequence parallelism's all-gather before a column-parallel linear (backward:
    reduce-scatter of its input gradient); plain tensors pass."""
    if isinstance(x, DTensor) and x.placements != (Replicate(),):
        return x.redistribute(x.device_mesh, [Replicate()])
    return x


def seq_scatter(x: Any, dim: int) -> Any:
    """Sequence parallelism's reduce-scatter after a row-parallel linear: the partial sums
    become the sum's shard along the sequence ``dim`` (backward: all-gather)."""
    if isinstance(x, DTensor):
        return x.redistribute(x.device_mesh, [Shard(dim)])
    return x


def apply_sequence_parallel(gm: fx.GraphModule, plan: Any) -> dict[str, str]:
    """Megatron sequence parallelism (Korthikanti et al. 2022) on a tensor-parallel program:
    every row-parallel linear's output is reduce-scattered along the sequence dim (the
    layer norms, dropouts and residual adds that follow run on sequence shards), and every
    column-parallel linear's input is all-gathered. Returns ``{new node: anchor linear}``."""
    by_name = {n.name: n for n in gm.graph.nodes}
    added: dict[str, str] = {}
    for lin in plan.linears:
        node = by_name[lin.node]
        if lin.style == "rowwise":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.ndim < 3:
                continue  # no sequence dim
            with gm.graph.inserting_after(node):
                new = gm.graph.call_function(seq_scatter, (node, val.ndim - 2))
            new.meta["val"] = val
            node.replace_all_uses_with(new, delete_user_cb=lambda u, new=new: u is not new)
        else:
            x = node.args[0]
            with gm.graph.inserting_before(node):
                new = gm.graph.call_function(seq_gather, (x,))
            new.meta["val"] = x.meta.get("val")
            node.replace_input_with(x, new)
        new.name = f"{lin.node}_sp"
        added[new.name] = lin.node
    gm.graph.lint()
    gm.recompile()
    return added


# ---------------------------------------------------------------------------- a model chunk
def _save_matmuls(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Selective recomputation: keep matmul outputs, recompute everything else."""
    if func in _MATMULS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


_aten = torch.ops.aten
_MATMULS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.linear.default, _aten.matmul.default,
}  # fmt: skip


class HybridChunk(nn.Module):
    """One model chunk of a pipeline rank: a chain of program segments (embeddings, blocks,
    head), each taking what the previous returns.

    With a tp mesh the segments' parameters are DTensors: inputs enter replicated and
    outputs leave as full tensors (as :class:`runtime.tensor_parallel.DTensorProgram`).
    ``recompute`` applies to the transformer-block segments (``is_layer``).
    """

    def __init__(
        self,
        segments: Sequence[fx.GraphModule],
        is_layer: Sequence[bool],
        *,
        tp_mesh: DeviceMesh | None = None,
        recompute: str = "none",
    ) -> None:
        super().__init__()
        self.segs = nn.ModuleList(segments)
        self.is_layer = list(is_layer)
        self.tp_mesh = tp_mesh
        self.recompute = recompute

    def _run(self, k: int, xs: tuple[Any, ...]) -> tuple[Any, ...]:
        seg = self.segs[k]
        if not self.is_layer[k] or self.recompute == "none":
            return seg(*xs)
        kw: dict[str, Any] = {"use_reentrant": False}
        if self.recompute == "selective":
            kw["context_fn"] = functools.partial(
                create_selective_checkpoint_contexts, _save_matmuls
            )
        return checkpoint(seg, *xs, **kw)

    def forward(self, *xs: Any) -> Any:
        if self.tp_mesh is None:
            out: tuple[Any, ...] = tuple(xs)
            for k in range(len(self.segs)):
                out = self._run(k, out)
            return out
        out = tuple(
            DTensor.from_local(x, self.tp_mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in xs
        )
        with implicit_replication():
            for k in range(len(self.segs)):
                out = self._run(k, out)
        return tuple(o.full_tensor() if isinstance(o, DTensor) else o for o in out)


# ---------------------------------------------------------------------------- the runner
@dataclass
class _Chunk:
    index: int
    module: nn.Module
    names: dict[str, str] = field(default_factory=dict)  # parameter path in module -> model name


def all_reduce_unsharded(grad: torch.Tensor, group: dist.ProcessGroup, scale: float = 1.0) -> None:
    """Sum ``grad`` in place over ``group`` whose members hold it differently: some sharded
    over their mesh (ZeRO 1-3 or tensor parallelism: a ``DTensor`` with ``Shard``
    placements), others whole (ZeRO 0 or a plain tensor). A sharded member gathers the full
    gradient over its mesh (the same for every member of that mesh), takes part in the sum
    with it, and keeps its own shard of the result; a whole one takes part as it is. Each
    member's part is multiplied by ``scale`` first (``1 / n`` when ``n`` members hold the same
    full gradient and it should count once)."""
    if isinstance(grad, DTensor) and any(isinstance(pl, Shard) for pl in grad.placements):
        mesh, places = grad.device_mesh, grad.placements
        whole = [Replicate()] * mesh.ndim
        full = grad.redistribute(mesh, whole).to_local().contiguous()
        if scale != 1.0:
            full = full * scale
        dist.all_reduce(full, group=group)
        back = DTensor.from_local(full, mesh, whole, run_check=False).redistribute(mesh, places)
        grad.to_local().copy_(back.to_local())
        return
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    if scale != 1.0:
        local.mul_(scale)
    dist.all_reduce(local, group=group)


def data_parallel(mod: HybridChunk, dp_mesh: DeviceMesh, zero: int) -> nn.Module:
    """Wrap a chunk for data parallelism over ``dp_mesh`` under ZeRO stage ``zero``: 0 =
    FSDP2's ``replicate`` (gradients all-reduced), 1 and 2 = ``fully_shard`` per block and
    per chunk keeping the gathered parameters until backward, 3 = resharding after forward."""
    if zero == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        return replicate(mod, mesh=dp_mesh)
    from torch.distributed.fsdp import fully_shard

    reshard = zero >= 3
    for k, sub in enumerate(mod.segs):
        if mod.is_layer[k]:
            fully_shard(sub, mesh=dp_mesh, reshard_after_forward=reshard)
    return fully_shard(mod, mesh=dp_mesh, reshard_after_forward=reshard)


def check_run(layout: HybridSpec, world_size: int, inputs: Sequence[torch.Tensor]) -> None:
    """Refuse a world size other than the layout's and a batch other than its
    ``global_batch`` (``ValueError``)."""
    L = layout
    if world_size != L.world_size:
        shape = (
            f"stage_meshes {[list(m) for m in L.stage_meshes]}"
            if L.stage_meshes
            else f"pp x dp x tp = {L.pp} x {L.dp} x {L.tp}"
        )
        raise ValueError(
            f"hybrid plan with {shape} needs {L.world_size} processes, got world size {world_size}"
        )
    batch = int(inputs[0].shape[0])
    if batch != L.global_batch:
        raise ValueError(
            f"hybrid plan: the model's batch is {batch} samples but the layout's "
            f"global_batch is {L.global_batch}"
        )


def tensor_parallel_program(
    gm: fx.GraphModule,
    seg: dict[str, int],
    tp_mesh: DeviceMesh,
    modules: Sequence[str],
    sequence_parallel: bool,
) -> Any:
    """Tensor-parallelize ``gm`` over ``tp_mesh`` (and sequence-parallelize it), keeping
    ``seg`` (node -> segment) up to date with the renamed and added nodes; the plan."""
    plan, renamed = parallelize_program(gm, tp_mesh, list(modules))
    seg.update({new: seg[old] for new, old in renamed.items() if old in seg})
    if sequence_parallel:
        added = apply_sequence_parallel(gm, plan)
        seg.update({new: seg[anchor] for new, anchor in added.items()})
    return plan


def chunk_segments(stage_layers: Sequence[tuple[int, int]], n_layer: int) -> list[list[int]]:
    """Per model chunk, its program segments: its blocks ``1 + l``, with the embeddings
    (segment 0) on the first chunk and the head and loss (``n_layer + 1``) on the last."""
    out = []
    for c, (a, b) in enumerate(stage_layers):
        ks = list(range(1 + a, 1 + b))
        if c == 0:
            ks.insert(0, 0)
        if c == len(stage_layers) - 1:
            ks.append(n_layer + 1)
        out.append(ks)
    return out


def tied_users(
    segments: Sequence[fx.GraphModule],
    chunk_segs: Sequence[Sequence[int]],
    canon: Mapping[str, str],
    pp: int,
) -> dict[str, list[int]]:
    """Parameters used by chunks on several pipeline ranks (chunk c on rank ``c % pp``):
    model name -> those ranks, sorted."""
    users: dict[str, set[int]] = {}
    for c, ks in enumerate(chunk_segs):
        for k in ks:
            for n in segments[k].graph.nodes:
                if n.op == "get_attr" and str(n.target) in canon:
                    users.setdefault(canon[str(n.target)], set()).add(c % pp)
    return {k: sorted(v) for k, v in sorted(users.items()) if len(v) > 1}


class ChunkParameters:
    """Parameters and gradients of a runner's ``chunks`` (a list of :class:`_Chunk`), by
    the model's names; ``tp_plan`` and ``tp_degree`` undo the fused tensor-parallel
    layouts."""

    chunks: list[_Chunk]
    tp_plan: Any
    tp_degree: int

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(model name, parameter)`` of this rank's chunks, each parameter once."""
        seen: set[int] = set()
        out = []
        for ch in self.chunks:
            for path, p in ch.module.named_parameters(remove_duplicate=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((ch.names[path], p))
        return out

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Unsharded gradients of this rank's parameters in the model's layout, by name
        (collectives over the dp and tp groups: call on every rank)."""

        out = {}
        for name, p in self.named_parameters():
            g = p.grad
            if g is None:
                continue
            if isinstance(g, DTensor):
                g = g.full_tensor()
            if self.tp_plan is not None and name in self.tp_plan.fused:
                g = fused_permutation(g, self.tp_plan.fused[name], self.tp_degree, inverse=True)
            out[name] = g
        return out


def make_runner(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    layout: HybridSpec,
    **kw: Any,
) -> Any:
    """The runner of ``layout``: :class:`HybridRunner` (one ``dp x tp`` submesh shape for
    every stage, ``torch.distributed.pipelining`` schedules) or, with ``stage_meshes``,
    :class:`runtime.submesh.SubmeshRunner`; ``kw`` as their constructors take."""
    if layout.stage_meshes:
        from runtime.submesh import SubmeshRunner

        return SubmeshRunner(model, loss_fn, inputs, layout, **kw)
    return HybridRunner(model, loss_fn, inputs, layout, **kw)


class HybridRunner(ChunkParameters):
    """Executes this rank's part of a hybrid plan (see :class:`HybridSpec`).

    The (pp, dp, tp) ``DeviceMesh`` is built with ``init_device_mesh`` (gloo on CPU, nccl
    on CUDA: same code). The model and loss are exported at microbatch size; with tp > 1
    the program is tensor-parallelized over the rank's tp sub-mesh by
    :func:`runtime.tensor_parallel.parallelize_program` (Megatron column/row linears of
    the transformer blocks by data flow, whole heads per rank, fused QKV re-laid), then
    cut into segments (embeddings, one per block, head + loss) and the segments of each
    chunk of ``stage_layers`` are chained into a :class:`HybridChunk` (recomputation per
    block). Data parallelism wraps each chunk over the rank's dp sub-mesh: ZeRO-3 =
    ``fully_shard`` per block and per chunk, ZeRO-1/2 = the same with
    ``reshard_after_forward=False``, ZeRO-0 = FSDP2's ``replicate`` (gradients all-reduced).
    The chunks are ``PipelineStage`` s over the rank's pp group run by the layout's
    schedule (``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B``),
    ``num_microbatches`` microbatches of this replica's slice of the global batch.
    Tied parameters used by chunks on different pipeline ranks (GPT-2's embedding and
    LM head) get their (sharded) gradients summed over the pipeline ranks that hold them.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        inputs: Sequence[torch.Tensor],
        layout: HybridSpec,
        *,
        rank: int,
        world_size: int,
        timer: StepTimer | None = None,
        device: torch.device | None = None,
        tp_modules: Sequence[str] | None = None,
    ) -> None:

        self.layout = L = layout
        if L.stage_meshes:
            raise ValueError(
                "HybridRunner runs layouts whose stages share one dp x tp submesh; one with "
                "stage_meshes runs on runtime.submesh.SubmeshRunner (runtime.hybrid.make_runner "
                "picks the runner)"
            )
        self.device = device or torch.device("cpu")
        self.timer = timer or StepTimer()
        self.rank = rank
        check_run(L, world_size, inputs)
        self.p, self.d, self.t = L.coords(rank)
        self.mesh = init_device_mesh(
            self.device.type, (L.pp, L.dp, L.tp), mesh_dim_names=MESH_DIM_NAMES
        )
        self.pp_group = self.mesh.get_group("pp")
        dp_mesh, tp_mesh = self.mesh["dp"], self.mesh["tp"]
        mb = tuple(x[: L.microbatch_size] for x in inputs)
        gm = export_with_loss(model, mb, loss_fn)
        blocks, n_layer = block_list(gm)
        L.validate(n_layer)
        seg = segment_of_nodes(gm, blocks, n_layer)
        canon = canonical_params(gm)  # before sharding: tied weights under one name
        self.tp_plan = None
        self.tp_degree = L.tp
        if L.tp > 1:
            self.tp_plan = tensor_parallel_program(
                gm, seg, tp_mesh, tp_modules or [blocks], L.sequence_parallel
            )
        segments = stage_modules(gm, seg, n_layer + 2)
        meta = value_meta(gm)
        chunk_segs = chunk_segments(L.stage_layers, n_layer)
        self.chunks: list[_Chunk] = []
        stages = []
        for c in range(L.num_chunks):
            if c % L.pp != self.p:
                continue
            ks = chunk_segs[c]
            mod = HybridChunk(
                [segments[k] for k in ks],
                [0 < k <= n_layer for k in ks],
                tp_mesh=tp_mesh if L.tp > 1 else None,
                recompute=L.chunk_recompute(c),
            )
            names = {
                path: canon[path.split(".", 2)[2]]
                for path, _ in mod.named_parameters(remove_duplicate=False)
            }
            mod = self._data_parallel(mod, dp_mesh)
            self.chunks.append(_Chunk(c, mod, names))
            ins = tuple(
                _zeros(meta[n.name], self.device)
                for n in segments[ks[0]].graph.nodes
                if n.op == "placeholder"
            )
            out_node = next(n for n in segments[ks[-1]].graph.nodes if n.op == "output")
            outs = tuple(_zeros(meta[a.name], self.device) for a in out_node.args[0])
            stage = PipelineStage(
                mod, c, L.num_chunks, self.device, input_args=ins, output_args=outs,
                group=self.pp_group,
            )  # fmt: skip
            self._instrument(stage)
            stages.append(stage)
        self.first = any(ch.index == 0 for ch in self.chunks)
        self.last = any(ch.index == L.num_chunks - 1 for ch in self.chunks)
        # tied parameters on several pipeline ranks (chunk c lives on rank c % pp)
        users = tied_users(segments, chunk_segs, canon, L.pp)
        # their gradients are summed over the pipeline ranks holding them (one group per
        # (d, t); every rank takes part in creating every group, as new_group requires)
        # (``mixed``: some holders shard it, others replicate it: summed as full tensors)
        self.shared: dict[str, tuple[dist.ProcessGroup, bool]] = {}
        for name, holders in users.items():
            mixed = len({L.stage_zero_of(p) == 0 for p in holders}) > 1
            for d in range(L.dp):
                for t in range(L.tp):
                    group = dist.new_group([(p * L.dp + d) * L.tp + t for p in holders])
                    if self.p in holders and (d, t) == (self.d, self.t):
                        self.shared[name] = (group, mixed)
        cls = SCHEDULE_CLASSES[L.schedule]
        arg = stages if L.schedule == "interleaved" else stages[0]
        self.schedule = cls(arg, L.num_microbatches, loss_fn=_loss_of_output)
        _patch_wait(self.timer)

    def _data_parallel(self, mod: HybridChunk, dp_mesh: DeviceMesh) -> nn.Module:
        """Wrap ``mod`` for data parallelism over ``dp_mesh`` as this pipeline rank's ZeRO
        stage says (``stage_zero``, else ``zero``)."""
        return data_parallel(mod, dp_mesh, self.layout.stage_zero_of(self.p))

    def _instrument(self, stage: Any) -> None:
        from runtime.pipeline import time_stage_compute

        time_stage_compute(stage, self.timer)
        # the data-parallel gradient reduction (FSDP2's reduce-scatter / all-reduce), which
        # the schedule runs after the last microbatch, outside the chunks: it was counted
        # as idle, so comm read 0 on every pp = 1 plan (found by fuzzing, 29 Nov 2026)
        orig = stage.perform_reduce_grad

        def reduce_grad(*a: Any, **kw: Any) -> Any:
            with self.timer.timed("comm"):
                return orig(*a, **kw)

        stage.perform_reduce_grad = reduce_grad

    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        """One step over ``num_microbatches`` microbatches of this replica's slice of the
        batch (``inputs`` is the global batch). Returns this replica's mean loss divided
        by dp on tp index 0 of the last pipeline rank, else 0 (so the sum over ranks is
        the global mean loss)."""
        L = self.layout
        per = L.global_batch // L.dp
        local = tuple(x[self.d * per : (self.d + 1) * per] for x in inputs)
        losses: list[torch.Tensor] = []
        args = local if self.first else ()
        kw: dict[str, Any] = {"return_outputs": False}
        if self.last:
            kw.update(target=local[0], losses=losses)
        if L.tp > 1:
            ctx: Any = implicit_replication()
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            self.schedule.step(*args, **kw)
        if self.shared:
            with self.timer.timed("comm"):
                by_name = dict(self.named_parameters())
                for name, (group, mixed) in self.shared.items():
                    prm = by_name[name]
                    if prm.grad is None:
                        prm.grad = torch.zeros_like(prm)
                    if mixed:
                        all_reduce_unsharded(prm.grad, group)
                    else:
                        g = prm.grad.to_local() if isinstance(prm.grad, DTensor) else prm.grad
                        dist.all_reduce(g, group=group)
        if not losses or self.t:
            return 0.0
        return float(sum(float(x.detach()) for x in losses) / len(losses)) / L.dp
