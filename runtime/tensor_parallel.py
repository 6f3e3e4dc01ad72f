"""Tensor-parallel plans: Megatron-style column/row sharding of linear layers with DTensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from runtime.timers import StepTimer


def megatron_plan(model: nn.Module, module_paths: Sequence[str]) -> dict[str, ParallelStyle]:
    """Sharding styles for the ``nn.Linear`` layers at or under ``module_paths``.

    Within one parent module, in registration order, every selected linear but the
    last is column-parallel and the last is row-parallel (the Megatron MLP pattern:
    ``fc`` split by output features, ``proj`` by input features, one all-reduce). A
    parent with a single selected linear gets a column-parallel layer whose output
    is gathered (replicated). Raises ``ValueError`` if no linear layer is selected.
    """
    paths = [p for p in module_paths if p is not None]
    chosen = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
        and any(name == p or name.startswith(p + ".") or p == "" for p in paths)
    ]
    if not chosen:
        raise ValueError(
            f"tensor-parallel plan: no nn.Linear at or under module paths {list(paths)}"
        )
    by_parent: dict[str, list[str]] = {}
    for name in chosen:
        by_parent.setdefault(name.rpartition(".")[0], []).append(name)
    plan: dict[str, ParallelStyle] = {}
    for names in by_parent.values():
        if len(names) == 1:
            plan[names[0]] = ColwiseParallel(output_layouts=Replicate())
            continue
        for n in names[:-1]:
            plan[n] = ColwiseParallel()
        plan[names[-1]] = RowwiseParallel()
    return plan


class TensorParallelRunner:
    """Every rank runs the whole model; the selected linears are sharded over a 1-D mesh.

    Communication (the row-parallel all-reduces) happens inside the layers, so it is
    counted as compute time in the per-rank breakdown.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[..., torch.Tensor],
        module_paths: Sequence[str],
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
        self.mesh = init_device_mesh(self.device.type, (world_size,), mesh_dim_names=("tp",))
        self.plan = megatron_plan(model, module_paths)
        self.model = parallelize_module(model, self.mesh, self.plan)
        self.loss_fn = loss_fn

    def parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        M = self.microbatches
        chunks = [torch.chunk(x, M, dim=0) for x in inputs]
        total = 0.0
        for mb in range(M):
            xs = tuple(c[mb] for c in chunks)
            with self.timer.timed("compute"):
                loss = self.loss_fn(self.model(*xs), *xs) / M
                loss.backward()
            total += float(loss.detach())
        return total if self.rank == 0 else 0.0

    def full_grads(self) -> dict[str, torch.Tensor]:
        """Gathered (unsharded) gradients by parameter name; a collective: call on every rank."""
        out = {}
        for name, p in self.model.named_parameters():
            g = p.grad
            if g is None:
                continue
            out[name] = g.full_tensor() if isinstance(g, DTensor) else g
        return out
