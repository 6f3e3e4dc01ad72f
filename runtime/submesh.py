"""Hybrid plans whose pipeline stages run on submeshes of their own (``stage_meshes``).

Alpa's inter-op stages (Zheng et al., OSDI'22): stage ``p`` runs on a ``dp_p x tp_p``
submesh of consecutive ranks, so two neighbouring stages may split a microbatch over
different numbers of data-parallel ranks and shard their layers over different tensor-
parallel groups. ``torch.distributed.pipelining`` pairs each rank with one peer per
neighbouring stage, which such a pipeline does not have, so :class:`SubmeshRunner` runs
its own GPipe / 1F1B schedule and re-shards the values that cross a stage boundary with
point-to-point messages: each rank of the receiving stage gets, from the sending stage,
the rows (samples) of the microbatch it computes; gradients go back the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from runtime.hybrid import (
    ChunkParameters,
    HybridChunk,
    HybridSpec,
    _Chunk,
    all_reduce_unsharded,
    block_list,
    check_run,
    chunk_segments,
    data_parallel,
    segment_of_nodes,
    tensor_parallel_program,
    tied_users,
)
from runtime.pipeline import stage_modules
from runtime.program import canonical_params, export_with_loss, value_meta
from runtime.tensor_parallel import implicit_replication
from runtime.timers import StepTimer


@dataclass(frozen=True)
class Piece:
    """One message across a stage boundary: rows ``[lo, hi)`` of the microbatch (positions
    in the pipeline microbatch of ``dp_0 * microbatch_size`` samples) of value ``value``
    (``lo = hi = -1``: the whole tensor, for values without a batch dimension), between
    global ranks ``src`` (sending stage) and ``dst`` (receiving stage)."""

    value: int
    src: int
    dst: int
    lo: int
    hi: int


def _overlaps(d: int, b: int, other_b: int, n_other: int) -> list[tuple[int, int, int]]:
    """``(other d, lo, hi)`` for every rank of the other stage whose rows overlap rows
    ``[d * b, (d + 1) * b)``."""
    lo, hi = d * b, (d + 1) * b
    out = []
    for e in range(n_other):
        a, z = max(lo, e * other_b), min(hi, (e + 1) * other_b)
        if a < z:
            out.append((e, a, z))
    return out


def boundary_pieces(
    layout: HybridSpec, p: int, batch_major: Sequence[bool]
) -> tuple[list[Piece], list[Piece]]:
    """The messages between stage ``p`` and stage ``p + 1`` for one microbatch, in one fixed
    order: ``(forward, backward)``.

    Forward: rank ``(d', t')`` of stage ``p + 1`` gets each batch-major value's rows it
    computes from the ranks ``(d, t' mod tp_p)`` of stage ``p`` that hold them, and each
    other value whole from the rank that holds its first row. Backward: rank ``(d, t)`` of
    stage ``p`` gets the gradient of its rows from the ranks ``(d', t mod tp_{p+1})`` of stage
    ``p + 1``. With equal dp every value goes whole from ``(d, .)`` to ``(d, .)``.
    """
    (dps, tps), (dpr, tpr) = layout.meshes[p], layout.meshes[p + 1]
    B = layout.dp * layout.microbatch_size
    bs, br = B // dps, B // dpr
    fwd: list[Piece] = []
    bwd: list[Piece] = []
    for v, major in enumerate(batch_major):
        for dr in range(dpr):
            for tr in range(tpr):
                dst = layout.rank(p + 1, dr, tr)
                if dps == dpr:
                    fwd.append(Piece(v, layout.rank(p, dr, tr % tps), dst, -1, -1))
                elif major:
                    for ds, lo, hi in _overlaps(dr, br, bs, dps):
                        fwd.append(Piece(v, layout.rank(p, ds, tr % tps), dst, lo, hi))
                else:
                    fwd.append(Piece(v, layout.rank(p, (dr * br) // bs, tr % tps), dst, -1, -1))
        for ds in range(dps):
            for ts in range(tps):
                dst = layout.rank(p, ds, ts)
                if dps == dpr:
                    bwd.append(Piece(v, layout.rank(p + 1, ds, ts % tpr), dst, -1, -1))
                elif major:
                    for dr, lo, hi in _overlaps(ds, bs, br, dpr):
                        bwd.append(Piece(v, layout.rank(p + 1, dr, ts % tpr), dst, lo, hi))
    return fwd, bwd


def stage_actions(schedule: str, p: int, pp: int, m: int) -> list[tuple[str, int]]:
    """Stage ``p``'s order of forwards ``("F", i)`` and backwards ``("B", i)``: GPipe (all
    forwards, then all backwards) or 1F1B (``pp - p - 1`` warm-up forwards, then one forward
    and one backward in turn, then the remaining backwards; PipeDream-Flush)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - p - 1, m)
    acts = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        acts += [("F", warm + i), ("B", i)]
    acts += [("B", i) for i in range(m - warm, m)]
    return acts


@dataclass(frozen=True)
class Message:
    """One posted message of a step: ``send`` or ``recv`` of ``piece`` for action
    ``(kind, mb)`` -- the forward's activations (``kind`` ``"F"``) or the backward's
    gradients (``"B"``) of microbatch ``mb``; ``tag = 2 * mb + (kind == "B")``."""

    op: str
    kind: str
    mb: int
    piece: Piece

    @property
    def tag(self) -> int:
        return 2 * self.mb + (self.kind == "B")

    @property
    def peer(self) -> int:
        return self.piece.src if self.op == "recv" else self.piece.dst


def posting_groups(
    layout: HybridSpec,
    pieces: Sequence[tuple[Sequence[Piece], Sequence[Piece]]],
    rank: int,
) -> list[list[Message]]:
    """The messages ``rank`` posts in one step, in ``len(actions) + 1`` groups (one
    ``batch_isend_irecv`` each): group ``i`` is posted right before action ``i`` -- the sends
    of action ``i - 1`` (its outputs forward, or its input gradients backward) with the
    receives action ``i`` waits for -- and the last group holds the last action's sends.
    ``pieces[q]`` are :func:`boundary_pieces` of the boundary after stage ``q``.

    This is Megatron-LM's ``send_forward_recv_backward`` pairing: two neighbouring ranks post
    their messages to each other in the same order, or in one group, which NCCL needs (a send
    waiting on a peer that is itself sending would hang)."""
    p = layout.coords(rank)[0]
    acts = stage_actions(layout.schedule, p, layout.pp, layout.num_microbatches)

    def recvs(kind: str, mb: int) -> list[Message]:
        if kind == "F" and p > 0:
            return [Message("recv", kind, mb, pc) for pc in pieces[p - 1][0] if pc.dst == rank]
        if kind == "B" and p < layout.pp - 1:
            return [Message("recv", kind, mb, pc) for pc in pieces[p][1] if pc.dst == rank]
        return []

    def sends(kind: str, mb: int) -> list[Message]:
        if kind == "F" and p < layout.pp - 1:
            return [Message("send", kind, mb, pc) for pc in pieces[p][0] if pc.src == rank]
        if kind == "B" and p > 0:
            return [Message("send", kind, mb, pc) for pc in pieces[p - 1][1] if pc.src == rank]
        return []

    groups = [recvs(*acts[0])]
    for i, act in enumerate(acts):
        groups.append(sends(*act) + (recvs(*acts[i + 1]) if i + 1 < len(acts) else []))
    return groups


def _local_rows(piece: Piece, d: int, b: int) -> slice:
    """The rows of ``piece`` in the tensor of data-parallel rank ``d`` holding ``b`` rows."""
    if piece.lo < 0:
        return slice(None)
    return slice(piece.lo - d * b, piece.hi - d * b)


@dataclass
class _Arrival:
    """Tensors being filled by posted receives: each piece lands in ``tmp`` and is copied
    into its rows of the full tensor once the receives are done."""

    full: list[torch.Tensor]
    copies: list[tuple[torch.Tensor, torch.Tensor]]

    def tensors(self) -> list[torch.Tensor]:
        for view, tmp in self.copies:
            view.copy_(tmp)
        return self.full


def _fsdp_state(mod: nn.Module) -> Any:
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule, replicate
    from torch.distributed.fsdp import fully_shard

    if isinstance(mod, ReplicateModule):
        return replicate.state(mod)  # type: ignore[arg-type]
    return fully_shard.state(mod)  # type: ignore[attr-defined]


class SubmeshRunner(ChunkParameters):
    """Executes this rank's stage of a hybrid plan with ``stage_meshes`` (see the module
    docstring; same interface as :class:`runtime.hybrid.HybridRunner`).

    Every rank builds the ``(dp_p, tp_p)`` ``DeviceMesh`` of every stage (group creation is
    collective) and keeps its own. It exports the model at its stage's microbatch rows
    ``b_p = dp_0 * microbatch_size / dp_p``, tensor-parallelizes the program over its tp
    submesh (and sequence-parallelizes it with ``sequence_parallel`` where ``tp_p > 1``), and
    wraps its chunk for data parallelism over its dp submesh under its stage's ZeRO stage,
    as :class:`runtime.hybrid.HybridRunner` does. A value is *batch-major* when its first
    dimension follows the microbatch size (found by exporting the program at a second size);
    only those are re-sharded by rows between stages of different dp; a value without a
    batch dimension that needs a gradient there is refused. Gradients: each microbatch's
    loss is the mean over the last stage's rows, the data-parallel wrappers average over
    each stage's own dp, and after the last backward every gradient is divided by
    ``M * dp_last / dp_p``, so the result is the gradient of the global mean loss on every
    stage. A tied parameter on the first and last stages (GPT-2's embedding and head) is
    summed between them as a full tensor (gathered over each stage's submesh, since the
    two may shard it differently) and cut back to each rank's shard.
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
        if not L.stage_meshes:
            raise ValueError("SubmeshRunner runs layouts with stage_meshes; use HybridRunner")
        self.device = device or torch.device("cpu")
        self.timer = timer or StepTimer()
        self.rank = rank
        check_run(L, world_size, inputs)
        batch = L.global_batch
        self.p, self.d, self.t = L.coords(rank)
        meshes = []
        for q in range(L.pp):
            dq, tq = L.meshes[q]
            ranks = torch.arange(L.stage_offset(q), L.stage_offset(q) + dq * tq).reshape(dq, tq)
            meshes.append(DeviceMesh(self.device.type, ranks, mesh_dim_names=("dp", "tp")))
        self.mesh = meshes[self.p]
        self.dp_p, self.tp_p = L.meshes[self.p]
        B = L.dp * L.microbatch_size
        self.rows = B // self.dp_p
        dp_mesh, tp_mesh = self.mesh["dp"], self.mesh["tp"]

        gm = export_with_loss(model, tuple(x[: self.rows] for x in inputs), loss_fn)
        blocks, n_layer = block_list(gm)
        L.validate(n_layer)
        seg = segment_of_nodes(gm, blocks, n_layer)
        canon = canonical_params(gm)
        meta = value_meta(gm)
        other = self.rows + 1 if self.rows < batch else self.rows - 1
        meta2 = (
            value_meta(export_with_loss(model, tuple(x[:other] for x in inputs), loss_fn))
            if other >= 1 and len({m[0] for m in L.meshes}) > 1
            else meta
        )
        self.tp_plan = None
        self.tp_degree = self.tp_p
        if self.tp_p > 1:
            self.tp_plan = tensor_parallel_program(
                gm, seg, tp_mesh, tp_modules or [blocks], L.sequence_parallel
            )
        segments = stage_modules(gm, seg, n_layer + 2)
        chunk_segs = chunk_segments(L.stage_layers, n_layer)

        def placeholders(q: int) -> list[str]:
            return [n.name for n in segments[chunk_segs[q][0]].graph.nodes if n.op == "placeholder"]

        # the values entering each stage (stage q > 0: what stage q - 1 returns)
        self.in_names = [placeholders(q) for q in range(L.pp)]
        self.pieces: list[tuple[list[Piece], list[Piece]]] = []
        self.batch_major: list[list[bool]] = []
        for q in range(L.pp - 1):
            names = self.in_names[q + 1]
            major = []
            for n in names:
                if n not in meta2:
                    raise ValueError(
                        f"hybrid plan: the program exported at {other} rows has no value {n!r} "
                        f"(it has at {self.rows}), so the rows of the values crossing stage "
                        f"{q} -> {q + 1} cannot be told apart from the rest"
                    )
                v1, v2 = meta[n], meta2[n]
                if not isinstance(v1, torch.Tensor):
                    raise ValueError(
                        f"hybrid plan: stage boundary carries a non-tensor value {n!r}"
                    )
                major.append(
                    v1.ndim > 0 and (meta2 is meta or tuple(v1.shape[:1]) != tuple(v2.shape[:1]))
                )
            self.batch_major.append(major)
            self.pieces.append(boundary_pieces(L, q, major))

        ks = chunk_segs[self.p]
        mod = HybridChunk(
            [segments[k] for k in ks],
            [0 < k <= n_layer for k in ks],
            tp_mesh=tp_mesh if self.tp_p > 1 else None,
            recompute=L.chunk_recompute(self.p),
        )
        names = {
            path: canon[path.split(".", 2)[2]]
            for path, _ in mod.named_parameters(remove_duplicate=False)
        }
        self.module = data_parallel(mod, dp_mesh, L.stage_zero_of(self.p))
        self.chunks = [_Chunk(self.p, self.module, names)]
        # the shapes this rank receives: its own export's input values, and (gradients) the
        # values it returns, which are the next stage's input values
        self.in_meta = [meta[n] for n in self.in_names[self.p]]
        nxt = self.in_names[self.p + 1] if self.p + 1 < L.pp else []
        self.out_meta = [meta[n] for n in nxt]
        self.first, self.last = self.p == 0, self.p == L.pp - 1

        # tied parameters used on several stages: summed over all ranks of those stages
        self.shared: dict[str, dist.ProcessGroup] = {}
        for name, holders in tied_users(segments, chunk_segs, canon, L.pp).items():
            ranks = [r for q in holders for r in L.stage_ranks(q)]
            group = dist.new_group(ranks)
            if self.p in holders:
                if self.tp_plan is not None and name in self.tp_plan.fused:
                    raise ValueError(
                        f"hybrid plan: tied parameter {name!r} is a fused tensor-parallel "
                        "weight; its shards cannot be summed across stages of different tp"
                    )
                self.shared[name] = group

    # ------------------------------------------------------------------ messages
    def _equal_dp(self, q: int) -> bool:
        return self.layout.meshes[q][0] == self.layout.meshes[q + 1][0]

    def _post(
        self, group: Sequence[Message], kept: dict
    ) -> tuple[list[Any], _Arrival | None, list[Any]]:
        """Post ``group`` in one ``batch_isend_irecv``: ``(receive works, the arrival of the
        tensors they fill, send works with their buffers)``."""
        ops: list[dist.P2POp] = []
        nsend = 0
        full: list[torch.Tensor] | None = None
        copies = []
        for msg in group:
            pc = msg.piece
            rows = _local_rows(pc, self.d, self.rows)
            if msg.op == "send":
                ins, outs = kept[msg.mb]
                if msg.kind == "F":
                    x = outs[pc.value].detach()
                else:
                    x = ins[pc.value].grad
                    if x is None:
                        x = torch.zeros_like(ins[pc.value])
                ops.insert(nsend, dist.P2POp(dist.isend, x[rows].contiguous(), pc.dst, tag=msg.tag))
                nsend += 1
                continue
            if full is None:
                shapes = self.in_meta if msg.kind == "F" else self.out_meta
                full = [torch.zeros(v.shape, dtype=v.dtype, device=self.device) for v in shapes]
            view = full[pc.value][rows]
            tmp = torch.empty_like(view)
            ops.append(dist.P2POp(dist.irecv, tmp, pc.src, tag=msg.tag))
            copies.append((view, tmp))
        works = dist.batch_isend_irecv(ops) if ops else []
        sent = list(zip(works[:nsend], ops[:nsend]))
        arrival = _Arrival(full, copies) if full is not None else None
        return works[nsend:], arrival, sent

    def _check_sendable(self, outs: Sequence[Any]) -> None:
        q = self.p
        if q == self.layout.pp - 1 or self._equal_dp(q):
            return
        for i, x in enumerate(outs):
            if isinstance(x, torch.Tensor) and x.requires_grad and not self.batch_major[q][i]:
                raise ValueError(
                    f"hybrid plan: value {self.in_names[q + 1][i]!r} crosses from stage {q} to "
                    f"{q + 1} (dp {self.layout.meshes[q][0]} -> {self.layout.meshes[q + 1][0]}) "
                    "without a batch dimension but needs a gradient; such a boundary cannot be "
                    "re-sharded by rows"
                )

    # ------------------------------------------------------------------ the step
    def forward_backward(self, inputs: Sequence[torch.Tensor]) -> float:
        """One step over ``num_microbatches`` microbatches (``inputs`` is the global batch).
        Returns this rank's share of the global mean loss (the mean over its microbatches
        divided by the last stage's dp on its tp rank 0; 0 elsewhere), so the sum over
        ranks is the global mean loss. Messages are posted in :func:`posting_groups`."""
        L = self.layout
        M = L.num_microbatches
        per = L.global_batch // L.dp
        mbs = L.microbatch_size
        fsdp = hasattr(self.module, "set_requires_gradient_sync")
        acts = stage_actions(L.schedule, self.p, L.pp, M)
        groups = posting_groups(L, self.pieces, self.rank)
        kept: dict[int, tuple[list[torch.Tensor], tuple[Any, ...]]] = {}
        sent: list[Any] = []
        losses: list[float] = []
        ctx: Any = implicit_replication() if self.tp_p > 1 else contextlib.nullcontext()
        with ctx:
            for i, (kind, mb) in enumerate(acts):
                works, arrival, out = self._post(groups[i], kept)
                sent += out
                if i and acts[i - 1][0] == "B":
                    del kept[acts[i - 1][1]]
                with self.timer.timed("comm"):
                    for w in works:
                        w.wait()
                got = arrival.tensors() if arrival is not None else None
                if kind == "F":
                    if self.first:
                        lo = self.d * per + mb * mbs
                        ins = [x[lo : lo + mbs] for x in inputs]
                    else:
                        ins = got
                        for v, x in enumerate(ins):
                            if x.is_floating_point() and (
                                self.batch_major[self.p - 1][v] or self._equal_dp(self.p - 1)
                            ):
                                x.requires_grad_(True)
                    with self.timer.timed("compute"):
                        out_val = self.module(*ins)
                    outs = tuple(out_val) if isinstance(out_val, (tuple, list)) else (out_val,)
                    self._check_sendable(outs)
                    kept[mb] = (ins, outs)
                    continue
                _, outs = kept[mb]
                if fsdp:
                    self.module.set_is_last_backward(False)
                    self.module.set_reshard_after_backward(False)
                    self.module.set_requires_gradient_sync(False)
                with self.timer.timed("compute"):
                    if self.last:
                        losses.append(float(outs[0].detach()))
                        outs[0].backward()
                    else:
                        pairs = [(o, g) for o, g in zip(outs, got) if o.requires_grad]
                        if pairs:
                            torch.autograd.backward(
                                [o for o, _ in pairs], grad_tensors=[g for _, g in pairs]
                            )
            _, _, out = self._post(groups[-1], kept)
            sent += out
        with self.timer.timed("comm"):
            if fsdp:
                self._reduce_grads()
            for w, _ in sent:
                w.wait()
        dp_last = L.meshes[-1][0]
        scale = M * dp_last / self.dp_p
        for prm in self.parameters():
            if prm.grad is not None:
                prm.grad.div_(scale)
        if self.shared:
            with self.timer.timed("comm"):
                self._sum_shared()
        if not losses or self.t:
            return 0.0
        return sum(losses) / len(losses) / dp_last

    def _reduce_grads(self) -> None:
        """The data-parallel gradient reduction after the last backward (what
        ``PipelineStage.perform_reduce_grad`` does for FSDP2 modules)."""
        mod: Any = self.module
        mod.set_is_last_backward(True)
        mod.set_reshard_after_backward(True)
        mod.set_requires_gradient_sync(True)
        state = _fsdp_state(mod)
        for st in state._state_ctx.all_states:
            for group in st._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()

    def _sum_shared(self) -> None:
        """Sum each tied parameter's gradient over the stages holding it: every rank of a
        holding stage adds its stage's full gradient divided by the stage's rank count."""
        by_name = dict(self.named_parameters())
        n = self.dp_p * self.tp_p
        for name, group in self.shared.items():
            prm = by_name[name]
            if prm.grad is None:
                prm.grad = torch.zeros_like(prm)
            all_reduce_unsharded(prm.grad, group, scale=1.0 / n)
