"""Tensor-parallel plans: Megatron-style, head-aware column/row sharding of an exported program's linears with DTensor."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor

from runtime.program import MODEL_PREFIX, compute_nodes, export_with_loss
from runtime.timers import StepTimer

COLWISE, ROWWISE = "colwise", "rowwise"

_aten = torch.ops.aten
_LINEAR = (_aten.linear.default,)
_SPLITS = (_aten.split.Tensor, _aten.split_with_sizes.default, _aten.chunk.default)
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


@dataclass(frozen=True)
class LinearShard:
    """How one linear op of the program is sharded.

    Attributes:
        node: FX node name of the ``aten.linear`` op.
        module: module path of its weight (``h.0.attn.c_attn``).
        style: ``"colwise"`` (weight and bias split by output features, output sharded on
            its last dim) or ``"rowwise"`` (weight split by input features, output summed).
        chunks: for a column-parallel linear whose output is split into ``chunks`` equal
            parts (a fused QKV projection), each part is sharded on its own, so every rank
            holds whole heads of Q, K and V; 1 otherwise.
    """

    node: str
    module: str
    style: str
    chunks: int = 1


@dataclass
class TPPlan:
    """A tensor-parallel plan of an exported program for ``degree`` ranks.

    Attributes:
        degree: tensor-parallel degree.
        linears: the sharded linears in program order.
        placements: parameter target (``model.fc.weight``) -> DTensor placements; every
            other parameter is replicated.
        fused: parameter name (``fc.weight``) -> chunks, for fused projections whose rows
            are stored permuted (``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``, rank r holds block r).
    """

    degree: int
    linears: list[LinearShard]
    placements: dict[str, list[Placement]] = field(default_factory=dict)
    fused: dict[str, int] = field(default_factory=dict)

    def styles(self) -> dict[str, str]:
        """Module path -> ``"colwise"``/``"rowwise"``/``"colwise(fused xK)"`` (for logs and tests)."""
        return {
            s.module: s.style + (f"(fused x{s.chunks})" if s.chunks > 1 else "")
            for s in self.linears
        }


def _selected(path: str, module_paths: Sequence[str]) -> bool:
    return any(p == "" or path == p or path.startswith(p + ".") for p in module_paths)


def _shape(node: fx.Node) -> tuple[int, ...] | None:
    val = node.meta.get("val")
    return tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else None


def _split_chunks(node: fx.Node, width: int) -> int:
    """Number of equal chunks a split/chunk op cuts its input's last dim (``width``) into, else 0."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    shape = _shape(node.args[0])
    if shape is None or dim not in (-1, len(shape) - 1):
        return 0
    arg = node.args[1]
    if node.target is _aten.chunk.default:
        k = int(arg)
        return k if width % k == 0 else 0
    if node.target is _aten.split_with_sizes.default:
        sizes = [int(s) for s in arg]
        return len(sizes) if len(set(sizes)) == 1 else 0
    size = int(arg)
    return width // size if width % size == 0 else 0


def megatron_plan(gm: fx.GraphModule, module_paths: Sequence[str], degree: int) -> TPPlan:
    """Megatron column/row sharding of the ``aten.linear`` ops whose weights live at or under
    ``module_paths`` (``""`` selects all), decided by data flow in program order.

    A selected linear whose input derives from a column-parallel output is row-parallel
    (its input is already split by features: no communication before it, one
    reduction after); any other is column-parallel. So an attention block's Q, K, V
    projections are column-parallel and its output projection row-parallel, and an
    MLP's up (and gate) projections column-, its down projection row-parallel. A
    column-parallel output that is cut into k equal chunks (fused QKV) is sharded
    chunk by chunk. Every reshape of a sharded value that splits its feature dim
    into ``(heads, head_dim)`` must have ``heads`` divisible by ``degree`` (whole heads
    per rank). Raises ``ValueError`` naming the module and the size that does not divide.
    """
    if degree < 1:
        raise ValueError(f"tensor-parallel degree must be >= 1, got {degree}")
    paths = [p for p in module_paths if p is not None]
    sharded: dict[str, str] = {}  # value -> module of the column-parallel linear it derives from
    linears: list[LinearShard] = []
    placements: dict[str, list[Placement]] = {}
    fused: dict[str, int] = {}

    def place(target: str, pl: list[Placement], module: str) -> None:
        if target in placements and placements[target] != pl:
            raise ValueError(
                f"tensor-parallel plan: parameter {target[len(MODEL_PREFIX) :]!r} (module "
                f"{module!r}) is used by linears that need different shardings"
            )
        placements[target] = pl

    for n in compute_nodes(gm):
        srcs = [sharded[a.name] for a in n.all_input_nodes if a.name in sharded]
        w = n.args[1] if n.target in _LINEAR and len(n.args) > 1 else None
        if isinstance(w, fx.Node) and w.op == "get_attr":
            target = str(w.target)
            module = target[len(MODEL_PREFIX) :].rpartition(".")[0]
            if _selected(module, paths):
                out_f, in_f = (int(s) for s in _shape(w) or (0, 0))
                bias = n.args[2] if len(n.args) > 2 else None
                btarget = str(bias.target) if isinstance(bias, fx.Node) else None
                x = n.args[0]
                if isinstance(x, fx.Node) and x.name in sharded:
                    if in_f % degree:
                        raise ValueError(
                            f"tensor-parallel plan: row-parallel linear {module!r} has {in_f} input "
                            f"features, not divisible by tp degree {degree}"
                        )
                    linears.append(LinearShard(n.name, module, ROWWISE))
                    place(target, [Shard(1)], module)
                    if btarget:
                        place(btarget, [Replicate()], module)
                    continue  # the output is whole again
                users = list(n.users)
                k = _split_chunks(users[0], out_f) if len(users) == 1 else 0
                k = k if users and users[0].target in _SPLITS and k >= 2 else 1
                if (out_f // k) % degree:
                    what = f"each of its {k} fused chunks of {out_f // k}" if k > 1 else f"{out_f}"
                    raise ValueError(
                        f"tensor-parallel plan: column-parallel linear {module!r} has {what} "
                        f"output features, not divisible by tp degree {degree}"
                    )
                linears.append(LinearShard(n.name, module, COLWISE, k))
                place(target, [Shard(0)], module)
                if btarget:
                    place(btarget, [Shard(0)], module)
                if k > 1:
                    fused[target[len(MODEL_PREFIX) :]] = k
                    if btarget:
                        fused[btarget[len(MODEL_PREFIX) :]] = k
                sharded[n.name] = module
                continue
        if not srcs:
            continue
        sharded[n.name] = srcs[0]
        if n.target in _VIEWS:
            src, out = _shape(n.all_input_nodes[0]), _shape(n)
            if src and out and len(out) == len(src) + 1 and out[-2] * out[-1] == src[-1]:
                heads = out[-2]
                if heads % degree:
                    raise ValueError(
                        f"tensor-parallel plan: {n.name!r} splits the output of {srcs[0]!r} into "
                        f"{heads} heads of {out[-1]}; the head count {heads} is not divisible by "
                        f"tp degree {degree} (each rank must hold whole heads)"
                    )
    if not linears:
        raise ValueError(
            f"tensor-parallel plan: no linear op has its weight at or under module paths {paths}"
        )
    return TPPlan(degree, linears, placements, fused)


def fused_permutation(
    t: torch.Tensor, chunks: int, degree: int, *, inverse: bool = False
) -> torch.Tensor:
    """Reorder the rows of a fused projection's weight/bias between the model layout
    ``[Q | K | V]`` and the sharded layout ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``
    (``inverse=True`` maps back)."""
    rows, rest = t.shape[0], t.shape[1:]
    per = rows // (chunks * degree)
    if inverse:
        return t.reshape(degree, chunks, per, *rest).transpose(0, 1).reshape(rows, *rest)
    return t.reshape(chunks, degree, per, *rest).transpose(0, 1).reshape(rows, *rest)


def fused_chunk(x: DTensor, chunks: int, index: int) -> DTensor:
    """Chunk ``index`` (in the model's layout) of a fused projection's output ``x``, whose
    last dim is in the sharded layout ``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``.

    Rank r holds ``[q_r k_r v_r]`` of ``x``; its piece of chunk ``index`` is a slice of
    that, so the result is sharded on its last dim (whole heads per rank) and neither
    forward nor backward communicates (``x`` arriving replicated is sliced locally).
    """
    last = x.ndim - 1
    mesh = x.device_mesh
    x = x.redistribute(mesh, [Shard(last)])
    local = x.to_local().chunk(chunks, dim=-1)[index]
    shape = (*x.shape[:-1], x.shape[-1] // chunks)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        local, mesh, [Shard(last)], run_check=False, shape=torch.Size(shape), stride=stride
    )


def apply_fused_layout(gm: fx.GraphModule, plan: TPPlan) -> dict[str, str]:
    """Rewrite ``gm`` in place for the fused projections of ``plan``.

    Each fused weight (and bias) is stored permuted (see :func:`fused_permutation`), and
    its ``split`` into k chunks becomes k :func:`fused_chunk` ops: values equal to the
    original chunks, computed without gathering. Returns ``{new node name: replaced node
    name}`` (so a stage assignment can follow the replaced nodes). A no-op for plans
    without fused linears.
    """
    renamed: dict[str, str] = {}
    by_name = {n.name: n for n in gm.graph.nodes}
    for lin in plan.linears:
        if lin.chunks < 2:
            continue
        node = by_name[lin.node]
        for a in node.args[1:3]:
            if isinstance(a, fx.Node) and a.op == "get_attr":
                p = gm.get_parameter(str(a.target))
                with torch.no_grad():
                    p.data = fused_permutation(p.data, lin.chunks, plan.degree).contiguous()
        (split,) = node.users
        for g in list(split.users):
            if g.target is not operator.getitem:
                raise ValueError(
                    f"tensor-parallel plan: the split {split.name!r} of {lin.module!r} is used "
                    f"by {g.name!r}, not by getitem"
                )
            with gm.graph.inserting_after(g):
                out = gm.graph.call_function(fused_chunk, (node, lin.chunks, int(g.args[1])))
            out.name = f"{g.name}_tp"
            out.meta["val"] = g.meta.get("val")
            renamed[out.name] = g.name
            g.replace_all_uses_with(out)
            gm.graph.erase_node(g)
        gm.graph.erase_node(split)
    if renamed:
        gm.graph.lint()
        gm.recompile()
    return renamed


def distribute_parameters(gm: fx.GraphModule, mesh: DeviceMesh, plan: TPPlan) -> None:
    """Replace every parameter of ``gm`` by a DTensor parameter on ``mesh``: sharded as
    ``plan.placements`` says, else replicated. Tied parameters stay tied. Every rank
    holds identical weights (one seed), so each slices its shard locally: no communication."""
    new: dict[int, nn.Parameter] = {}
    for name, p in gm.named_parameters():
        pl = plan.placements.get(name, [Replicate()])
        d = distribute_tensor(p.detach(), mesh, pl, src_data_rank=None)
        new[id(p)] = nn.Parameter(d, requires_grad=p.requires_grad)
    for name, p in list(gm.named_parameters(remove_duplicate=False)):
        owner, _, attr = name.rpartition(".")
        setattr(gm.get_submodule(owner), attr, new[id(p)])


def sync_grads(params: Sequence[nn.Parameter]) -> None:
    """Bring every DTensor gradient to its parameter's placements (partial sums are reduced)."""
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(p.device_mesh, p.placements)


def full_gradient(name: str, p: nn.Parameter, plan: TPPlan) -> torch.Tensor | None:
    """The unsharded gradient of parameter ``name`` in the model's layout (a collective on
    the tp mesh for DTensor parameters: call on every rank of it, in the same order)."""
    g = p.grad
    if g is None:
        return None
    if isinstance(g, DTensor):
        g = g.full_tensor()
    if name in plan.fused:
        g = fused_permutation(g, plan.fused[name], plan.degree, inverse=True)
    return g


@contextlib.contextmanager
def implicit_replication() -> Iterator[None]:
    """Treat plain tensors met by DTensor ops as replicated; unlike
    ``torch.distributed.tensor.experimental.implicit_replication`` it nests (restores the
    previous setting), so a forward inside a pipeline schedule's step does not switch
    it off for the backward that follows."""
    dispatcher = DTensor._op_dispatcher
    prev = dispatcher._allow_implicit_replication
    dispatcher._allow_implicit_replication = True
    try:
        yield
    finally:
        dispatcher._allow_implicit_replication = prev


class DTensorProgram(nn.Module):
    """Runs an FX (sub-)program whose parameters are DTensors on a tp mesh.

    Tensor inputs enter replicated; plain tensors made inside the program (masks,
    positions) count as replicated; outputs leave as full (replicated, local)
    tensors, so stage boundaries and losses are ordinary tensors. Run its backward
    under ``implicit_replication()`` too (the plain tensors are saved for it).
    """

    def __init__(self, gm: fx.GraphModule, mesh: DeviceMesh) -> None:
        super().__init__()
        self.gm = gm
        self.mesh = mesh

    def forward(self, *xs: Any) -> Any:
        args = [
            DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)
            if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            else x
            for x in xs
        ]
        with implicit_replication():
            outs = self.gm(*args)
        single = not isinstance(outs, (tuple, list))
        full = tuple(
            o.full_tensor() if isinstance(o, DTensor) else o for o in ((outs,) if single else outs)
        )
        return full[0] if single else full


def parallelize_program(
    gm: fx.GraphModule, mesh: DeviceMesh, module_paths: Sequence[str]
) -> tuple[TPPlan, dict[str, str]]:
    """Plan (:func:`megatron_plan`), re-lay fused projections (:func:`apply_fused_layout`)
    and distribute the parameters of ``gm`` over the 1-D ``mesh``; returns the plan and the
    renamed nodes."""
    plan = megatron_plan(gm, module_paths, mesh.size())
    renamed = apply_fused_layout(gm, plan)
    distribute_parameters(gm, mesh, plan)
    return plan, renamed


def check_tensor_parallel(
    model: Mapping[str, Any], module_paths: Sequence[str], degree: int, microbatches: int = 1
) -> TPPlan:
    """Before launch: export ``model`` (a :func:`runtime.model.load_model` spec) on the meta
    device at microbatch size and make its :func:`megatron_plan`, so that features or
    heads not divisible by ``degree`` are refused (``ValueError``) before any process
    starts. Returns the plan."""
    from runtime.model import load_model

    zm = load_model(model, device="meta")
    batch = zm.example_inputs[0].shape[0]
    if batch % microbatches:
        raise ValueError(f"batch of {batch} cannot be split into {microbatches} equal microbatches")
    mb = tuple(x.chunk(microbatches, dim=0)[0] for x in zm.example_inputs)
    gm = export_with_loss(zm.module, mb, zm.loss_fn)
    return megatron_plan(gm, module_paths, degree)


class TensorParallelRunner:
    """Every rank runs the whole exported program; the selected linears are sharded over a
    1-D mesh of all ranks (:func:`megatron_plan`), the rest is replicated.

    The collectives DTensor inserts (row-parallel reductions) happen inside the ops, so
    they count as compute in the per-rank breakdown.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        module_paths: Sequence[str],
        inputs: Sequence[torch.Tensor],
        *,
        rank: int,
        world_size: int,
        microbatches: int = 1,
        timer: StepTimer | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.timer = timer or StepTimer()
        self.rank, self.microbatches = rank, microbatches
        if inputs[0].shape[0] % microbatches:
            raise ValueError(
                f"batch of {inputs[0].shape[0]} cannot be split into {microbatches} equal microbatches"
            )
        self.mesh = init_device_mesh(self.device.type, (world_size,), mesh_dim_names=("tp",))
        gm = export_with_loss(
            model, tuple(x.chunk(microbatches, dim=0)[0] for x in inputs), loss_fn
        )
        self.gm = gm
        self.plan, _ = parallelize_program(gm, self.mesh, module_paths)
        self.program = DTensorProgram(gm, self.mesh)

    def parameters(self) -> list[nn.Parameter]:
        return list(self.gm.parameters())

    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        M = self.microbatches
        chunks = [torch.chunk(x, M, dim=0) for x in inputs]
        total = 0.0
        for mb in range(M):
            xs = tuple(c[mb] for c in chunks)
            with self.timer.timed("compute"), implicit_replication():
                out = self.program(*xs)
                loss = (out[0] if isinstance(out, tuple) else out) / M
                loss.backward()
            total += float(loss.detach())
        with self.timer.timed("compute"):
            sync_grads(self.parameters())
        return total if self.rank == 0 else 0.0

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Gathered gradients by parameter name in the model's layout (a collective)."""
        out = {}
        for target, p in self.gm.named_parameters():
            name = target[len(MODEL_PREFIX) :] if target.startswith(MODEL_PREFIX) else target
            g = full_gradient(name, p, self.plan)
            if g is not None:
                out[name] = g
        return out
