"""Op-level plans of any DAG: per-rank sub-graphs keyed by (cross-device depth, device), p2p send/recv."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch import fx, nn

from runtime.program import assign, cross_device_depth, loss_node, split, value_meta
from runtime.timers import StepTimer


class OpLevelRunner:
    """Executes this rank's share of an op-level placement.

    The exported program is cut into partitions keyed by ``(depth, device)``, where
    ``depth`` counts device changes on the longest path to a node; ordered by key
    they form a topological order. Each rank runs its partitions in that order for
    every microbatch (forward), then in reverse (backward). A value crossing devices
    is sent once per (value, destination rank) with ``isend`` and received with a
    blocking ``recv``; its gradient travels back the same way. Each partition is an
    autograd island (its inputs are detached leaves), so backward proceeds partition
    by partition. Parameters used on several ranks get their gradients summed with
    ``all_reduce``. Losses are scaled by ``1 / microbatches`` (mean over the batch).
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        device_of: Mapping[str, int],
        *,
        rank: int,
        world_size: int,
        microbatches: int = 1,
        timer: StepTimer | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.gm = gm
        self.rank, self.world_size, self.microbatches = rank, world_size, microbatches
        self.timer = timer or StepTimer()
        self.device = device or torch.device("cpu")
        dev = assign(gm, device_of, default=0)
        bad = {k: v for k, v in dev.items() if not 0 <= v < world_size}
        if bad:
            k = next(iter(bad))
            raise ValueError(
                f"op-level plan puts node {k!r} on rank {bad[k]}; world size is {world_size}"
            )
        depth = cross_device_depth(gm, dev)
        self.device_of = dev
        self.parts = split(gm, {n: (depth[n], dev[n]) for n in dev}, dev)
        self.placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.loss_name = loss_node(gm).name
        self.meta = value_meta(gm)
        self.producer: dict[str, int] = {}
        for i, p in enumerate(self.parts):
            for name in p.nodes:
                self.producer[name] = i
        names = sorted(self.producer, key=list(self.producer).index)
        self.value_id = {n: i for i, n in enumerate(names)}
        # ranks other than the producer's that consume each value
        self.remote_consumers: dict[str, list[int]] = {}
        for p in self.parts:
            for name in p.inputs:
                if name in self.producer:
                    pd = self.parts[self.producer[name]].device
                    if p.device != pd:
                        lst = self.remote_consumers.setdefault(name, [])
                        if p.device not in lst:
                            lst.append(p.device)
        for v in self.remote_consumers.values():
            v.sort()
        self.local = [p for p in self.parts if p.device == rank]
        # how many local partitions consume each remote value (gradient is sent after the last)
        self.remote_uses: dict[str, int] = {}
        for p in self.local:
            for name in p.inputs:
                if name in self.producer and self.parts[self.producer[name]].device != rank:
                    self.remote_uses[name] = self.remote_uses.get(name, 0) + 1
        users: dict[str, set[int]] = {}
        for p in self.parts:
            for prm in p.params:
                users.setdefault(prm, set()).add(p.device)
        self.shared_params = sorted(k for k, v in users.items() if len(v) > 1)
        self.param_names = sorted({prm for p in self.local for prm in p.params})

    # ------------------------------------------------------------ helpers
    def parameters(self) -> list[nn.Parameter]:
        """The parameters this rank's partitions use (what its optimizer updates)."""
        return [self._param(n) for n in self.param_names]

    def _param(self, name: str) -> nn.Parameter:
        return self.gm.get_parameter("model." + name)

    def _tag(self, mb: int, name: str, backward: bool) -> int:
        return ((mb * len(self.value_id)) + self.value_id[name]) * 2 + int(backward)

    def _recv(self, name: str, src: int, mb: int, backward: bool) -> torch.Tensor:
        val = self.meta[name]
        if not isinstance(val, torch.Tensor):
            raise ValueError(
                f"op-level plan: value {name!r} crosses devices but is not a tensor ({type(val).__name__})"
            )
        buf = torch.empty(val.shape, dtype=val.dtype, device=self.device)
        with self.timer.timed("comm"):
            dist.recv(buf, src=src, tag=self._tag(mb, name, backward))
        return buf

    def _isend(
        self, t: torch.Tensor, name: str, dst: int, mb: int, backward: bool, works: list
    ) -> None:
        t = t.detach().contiguous()
        with self.timer.timed("comm"):
            works.append((dist.isend(t, dst=dst, tag=self._tag(mb, name, backward)), t))

    # ---------------------------------------------------------------- step
    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        """One training step's forward and backward over all microbatches; returns this
        rank's share of the loss (the full loss on the rank computing it, else 0)."""
        M = self.microbatches
        chunks = [torch.chunk(x, M, dim=0) for x in inputs]
        if any(len(c) != M for c in chunks) or len({c[0].shape[0] for c in chunks}) > 1:
            raise ValueError(
                f"batch of {inputs[0].shape[0]} cannot be split into {M} equal microbatches"
            )
        works: list = []
        saved = []
        loss_total = 0.0
        for mb in range(M):
            feed = {ph: chunks[i][mb] for i, ph in enumerate(self.placeholders)}
            local: dict[str, torch.Tensor] = {}
            remote: dict[str, torch.Tensor] = {}
            islands = []
            for p in self.local:
                args, leaves = [], []
                for name in p.inputs:
                    if name in feed:
                        args.append(feed[name])
                        continue
                    src_rank = self.parts[self.producer[name]].device
                    if src_rank == self.rank:
                        src = local[name]
                    else:
                        if name not in remote:
                            remote[name] = self._recv(name, src_rank, mb, False)
                        src = remote[name]
                    leaf = src.detach().requires_grad_(True) if src.is_floating_point() else src
                    leaves.append((name, leaf))
                    args.append(leaf)
                with self.timer.timed("compute"):
                    outs = p.module(*args)
                for name, t in zip(p.outputs, outs):
                    local[name] = t
                    for d in self.remote_consumers.get(name, ()):
                        self._isend(t, name, d, mb, False, works)
                islands.append((p, leaves, outs))
            if self.loss_name in local:
                loss_total += float(local[self.loss_name].detach()) / M
            saved.append(islands)
        for mb in reversed(range(M)):
            grads: dict[str, torch.Tensor] = {}
            left = dict(self.remote_uses)
            for p, leaves, outs in reversed(saved[mb]):
                ts, gs = [], []
                for name, t in zip(p.outputs, outs):
                    g = grads.pop(name, None)
                    for d in self.remote_consumers.get(name, ()):
                        if t.is_floating_point():
                            r = self._recv(name, d, mb, True)
                            g = r if g is None else g + r
                    if name == self.loss_name:
                        one = torch.full_like(t, 1.0 / M)
                        g = one if g is None else g + one
                    if g is not None and t.requires_grad:
                        ts.append(t)
                        gs.append(g)
                if ts:
                    with self.timer.timed("compute"):
                        torch.autograd.backward(ts, gs)
                for name, leaf in leaves:
                    if not leaf.is_floating_point():
                        continue
                    gl = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                    grads[name] = gl if name not in grads else grads[name] + gl
                    if name in left:
                        left[name] -= 1
                        if left[name] == 0:
                            dst = self.parts[self.producer[name]].device
                            self._isend(grads.pop(name), name, dst, mb, True, works)
            saved[mb] = []
        with self.timer.timed("comm"):
            for w, _ in works:
                w.wait()
            for name in self.shared_params:
                prm = self._param(name)
                if prm.grad is None:
                    prm.grad = torch.zeros_like(prm)
                dist.all_reduce(prm.grad)
        return loss_total
