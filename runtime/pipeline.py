"""Pipeline plans with torch.distributed.pipelining: stages cut from the exported program at the plan's boundaries."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining import schedules as _schedules
from torch.distributed.tensor import DTensor

from runtime.program import (
    assign,
    build_submodule,
    canonical_params,
    compute_nodes,
    loss_node,
    value_meta,
)
from runtime.tensor_parallel import (
    DTensorProgram,
    TPPlan,
    full_gradient,
    implicit_replication,
    parallelize_program,
    sync_grads,
)
from runtime.timers import StepTimer


class OneFOneB(Schedule1F1B):
    """``Schedule1F1B`` that also runs fewer microbatches than pipeline stages.

    PyTorch's constructor refuses ``m < stages`` although its step already warms up with
    ``min(m, stages - stage index)`` forwards, which is PipeDream-Flush's order for any
    ``m`` (stages with no steady state run all forwards, then all backwards). The planners
    and the simulator take such plans (e.g. 2 microbatches on 4 stages), and before this
    class every rank stopped with that ``ValueError``. Loss and gradients equal one process
    (``tests/runtime/test_pipeline_short.py``)."""

    def __init__(self, stage: Any, n_microbatches: int, **kw: Any) -> None:
        # the base's base: everything Schedule1F1B.__init__ does but the check
        _schedules.PipelineScheduleSingle.__init__(
            self, stage=stage, n_microbatches=n_microbatches, **kw
        )


SCHEDULE_CLASSES: dict[str, Any] = {
    "gpipe": ScheduleGPipe,
    "1f1b": OneFOneB,
    "interleaved": ScheduleInterleaved1F1B,
}


def stage_modules(
    gm: fx.GraphModule, stage_of: Mapping[str, int], num_stages: int
) -> list[fx.GraphModule]:
    """One GraphModule per stage, chained: stage ``k`` takes what stage ``k-1`` returns.

    Stage 0 takes the model inputs. Stage ``k`` returns the values later stages need
    (its own and passed-through earlier ones, including model inputs such as the
    loss targets); the last stage returns the loss. Raises ``ValueError`` if a stage
    is empty or an edge goes from a later stage to an earlier one.
    """
    st = assign(gm, stage_of, default=0)
    nodes = compute_nodes(gm)
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    for n in nodes:
        if not 0 <= st[n.name] < num_stages:
            raise ValueError(
                f"pipeline plan puts node {n.name!r} in stage {st[n.name]}; plan has {num_stages} stages"
            )
        for a in n.all_input_nodes:
            if a.op == "call_function" and st[a.name] > st[n.name]:
                raise ValueError(
                    f"pipeline plan is not monotone: {a.name!r} (stage {st[a.name]}) feeds "
                    f"{n.name!r} (stage {st[n.name]}); every edge must go to the same or a later stage"
                )
    members: list[list[str]] = [[] for _ in range(num_stages)]
    for n in nodes:
        members[st[n.name]].append(n.name)
    empty = [k for k, m in enumerate(members) if not m]
    if empty:
        raise ValueError(f"pipeline plan: stages {empty} hold no operations")
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    stage_of_value = {n.name: st[n.name] for n in nodes}
    stage_of_value.update({p: -1 for p in placeholders})
    # carry[k] = values made before stage k and used at stage k or later
    carry: list[list[str]] = [placeholders]
    for k in range(1, num_stages):
        need = set()
        for n in nodes:
            if st[n.name] >= k:
                for a in n.all_input_nodes:
                    if a.name in stage_of_value and stage_of_value[a.name] < k:
                        need.add(a.name)
        carry.append(sorted(need, key=order.__getitem__))
    lossn = loss_node(gm).name
    if st[lossn] != num_stages - 1:
        raise ValueError(
            f"pipeline plan: the loss ({lossn!r}) must be in the last stage, found in stage {st[lossn]}"
        )
    mods = []
    for k in range(num_stages):
        outs = carry[k + 1] if k + 1 < num_stages else [lossn]
        mods.append(build_submodule(gm, members[k], carry[k], outs))
    return mods


def _zeros(val: Any, device: torch.device) -> torch.Tensor:
    if not isinstance(val, torch.Tensor):
        raise ValueError(
            f"pipeline stage boundary carries a non-tensor value ({type(val).__name__})"
        )
    t = torch.zeros(val.shape, dtype=val.dtype, device=device)
    return t.requires_grad_(True) if t.is_floating_point() else t


def _loss_of_output(output: Any, target: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


class PipelineRunner:
    """Executes this rank's pipeline stages with a ``torch.distributed.pipelining`` schedule.

    ``schedule`` is ``gpipe`` / ``1f1b`` (one stage per rank) or ``interleaved``
    (several stages per rank, stage ``k`` on rank ``k mod world``). Gradients are
    scaled by ``1 / microbatches`` by the schedule, so they equal the full-batch
    gradients of a mean loss. Parameters used by stages on several ranks (tied
    weights) get their gradients summed with ``all_reduce``.

    With ``tp_degree`` t > 1 the job is a 2-D ``("pp", "tp")`` device mesh of
    ``world_size = pipeline ranks x t`` ranks (rank = pp_index * t + tp_index), as in
    torchtitan: the program is tensor-parallelized once over the rank's tp sub-mesh
    (:func:`runtime.tensor_parallel.parallelize_program`: Megatron column/row linears
    under ``tp_modules``, whole heads per rank), then cut into stages; each stage runs
    as a :class:`~runtime.tensor_parallel.DTensorProgram` (full tensors at its
    boundaries) and ``PipelineStage`` talks over the rank's pp group, so the tp peers
    of a stage exchange activations with the same tp index of the next stage.
    ``stage_rank`` then holds pp indices.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        stage_of: Mapping[str, int],
        stage_rank: Sequence[int],
        *,
        rank: int,
        world_size: int,
        microbatches: int = 1,
        schedule: str = "1f1b",
        timer: StepTimer | None = None,
        device: torch.device | None = None,
        tp_degree: int = 1,
        tp_modules: Sequence[str] = (),
    ) -> None:
        if schedule not in SCHEDULE_CLASSES:
            raise ValueError(
                f"unknown pipeline schedule {schedule!r}; expected one of {sorted(SCHEDULE_CLASSES)}"
            )
        self.gm, self.rank, self.world_size = gm, rank, world_size
        self.timer = timer or StepTimer()
        self.device = device or torch.device("cpu")
        S = len(stage_rank)
        self.tp_degree = tp = int(tp_degree)
        self.tp_plan: TPPlan | None = None
        self.pp_group: dist.ProcessGroup | None = None
        pp_index = rank
        if tp > 1:
            if world_size % tp:
                raise ValueError(
                    f"pipeline with tensor parallelism: world size {world_size} is not a multiple "
                    f"of tp degree {tp}"
                )
            pp = world_size // tp
            mesh = init_device_mesh(self.device.type, (pp, tp), mesh_dim_names=("pp", "tp"))
            self.pp_group, tp_mesh = mesh.get_group("pp"), mesh["tp"]
            pp_index = rank // tp
            self.tp_plan, renamed = parallelize_program(gm, tp_mesh, tp_modules)
            stage_of = dict(stage_of)
            stage_of.update({new: stage_of[old] for new, old in renamed.items() if old in stage_of})
        mods = stage_modules(gm, stage_of, S)
        meta = value_meta(gm)
        self.stage_ids = [k for k in range(S) if stage_rank[k] == pp_index]
        self.first = 0 in self.stage_ids
        self.last = S - 1 in self.stage_ids
        self.stages = []
        for k in self.stage_ids:
            # static shapes from the export: no runtime shape inference on uninitialised
            # buffers (garbage token ids would crash an embedding or a loss)
            ins = tuple(
                _zeros(meta[n.name], self.device)
                for n in mods[k].graph.nodes
                if n.op == "placeholder"
            )
            out_node = next(n for n in mods[k].graph.nodes if n.op == "output")
            outs = tuple(_zeros(meta[a.name], self.device) for a in out_node.args[0])
            sub: nn.Module = mods[k] if tp == 1 else DTensorProgram(mods[k], tp_mesh)
            stage = PipelineStage(
                sub, k, S, self.device, input_args=ins, output_args=outs, group=self.pp_group
            )
            self._instrument(stage)
            self.stages.append(stage)
        if not self.stages:
            raise ValueError(f"pipeline plan gives rank {rank} no stage")
        users: dict[str, set[int]] = {}
        canon = canonical_params(gm)  # tied weights (wte / lm_head) under one name
        for k, m in enumerate(mods):
            for n in m.graph.nodes:
                if n.op == "get_attr" and str(n.target) in canon:
                    users.setdefault(canon[str(n.target)], set()).add(stage_rank[k])
        self.shared_params = sorted(k for k, v in users.items() if len(v) > 1)
        self.param_names = sorted(k for k, v in users.items() if pp_index in v)
        cls = SCHEDULE_CLASSES[schedule]
        arg = self.stages if schedule == "interleaved" else self.stages[0]
        if schedule != "interleaved" and len(self.stages) > 1:
            raise ValueError(
                f"schedule {schedule!r} runs one stage per rank; rank {rank} has {len(self.stages)}"
            )
        self.schedule = cls(arg, microbatches, loss_fn=_loss_of_output)
        _patch_wait(self.timer)

    def _instrument(self, stage: PipelineStage) -> None:
        time_stage_compute(stage, self.timer)

    def parameters(self) -> list[nn.Parameter]:
        return [self.gm.get_parameter("model." + n) for n in self.param_names]

    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        """One step over all microbatches; returns the mean loss on the last stage's rank, else 0."""
        losses: list[torch.Tensor] = []
        args = tuple(inputs) if self.first else ()
        kw: dict[str, Any] = {"return_outputs": False}
        if self.last:
            kw.update(target=inputs[0], losses=losses)
        # plain tensors made inside the program (positions, masks) are replicated, in
        # backward too: the schedule runs both
        with implicit_replication() if self.tp_plan is not None else contextlib.nullcontext():
            self.schedule.step(*args, **kw)
        if self.tp_plan is not None:
            with self.timer.timed("comm"):
                sync_grads(self.parameters())
        with self.timer.timed("comm"):
            for name in self.shared_params:
                prm = self.gm.get_parameter("model." + name)
                if prm.grad is None:
                    prm.grad = torch.zeros_like(prm)
                g = prm.grad.to_local() if isinstance(prm.grad, DTensor) else prm.grad
                dist.all_reduce(g, group=self.pp_group)
        if not losses or (self.tp_plan is not None and self.rank % self.tp_degree):
            return 0.0  # one loss per pipeline: only tp index 0 of the last stage reports it
        return float(sum(float(x) for x in losses) / len(losses))

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Unsharded gradients of this rank's parameters in the model's layout, by name
        (with tensor parallelism a collective on the tp group: call on every rank)."""
        out = {}
        for name in self.param_names:
            prm = self.gm.get_parameter("model." + name)
            g = full_gradient(name, prm, self.tp_plan) if self.tp_plan else prm.grad
            if g is not None:
                out[name] = g
        return out


_PATCHED: list[StepTimer] = []


def _patch_wait(timer: StepTimer) -> None:
    """Count the schedule's waits on p2p work as communication (one timer per process)."""
    if _PATCHED:
        _PATCHED[0] = timer
        return
    _PATCHED.append(timer)
    orig = _schedules._wait_batch_p2p

    def wait(work: Any) -> Any:
        with _PATCHED[0].timed("comm"):
            return orig(work)

    _schedules._wait_batch_p2p = wait


def time_stage_compute(stage: Any, timer: Any) -> None:
    """Count a pipeline stage's forward / backward chunks as ``compute`` in ``timer``."""
    for meth in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        orig = getattr(stage, meth, None)
        if orig is None:
            continue

        @functools.wraps(orig)
        def wrapped(*a: Any, _orig: Any = orig, **kw: Any) -> Any:
            with timer.timed("compute"):
                return _orig(*a, **kw)

        setattr(stage, meth, wrapped)
