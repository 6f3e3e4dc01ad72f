"""Hybrid-parallel step model: one pipeline replica of a dp x tp x pp layout with ZeRO, recomputation and TP/SP collectives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import HybridLayout, ModelDims, model_dims
from placement_env.oracles.base import SimResult
from placement_env.oracles.collectives import Topology
from placement_env.oracles.pipeline import PIPELINE_SCHEDULES, simulate_pipeline

#: Achievable fraction of the tensor-core peak in the large GEMMs of a transformer layer
#: when a cluster does not say (``cluster.meta["gemm_efficiency"]``). The one fitted
#: constant of the model: solved so that the 1T-parameter run of Narayanan et al. 2021 (502
#: PFLOP/s = 163 TFLOP/s per GPU on 3,072 A100s) is matched (``scripts/validate_hybrid.py``
#: prints the fit: 0.6917; 0.70 before 25 Nov 2026, +1.1 % on that row); docs/hybrid.md
#: lists the other runs as predictions.
DEFAULT_GEMM_EFFICIENCY = 0.692
#: Bytes the memory-bound (elementwise, softmax, norm, dropout) kernels move per byte of
#: activation the layer keeps: each kept tensor is written once and read once.
ELEMENTWISE_TRAFFIC = 2.0
#: Mixed-precision Adam state per parameter: fp16 weight, fp32 master weight, momentum, variance.
WEIGHT_BYTES, OPTIMIZER_BYTES = 2.0, 12.0
#: Bytes per parameter of a gradient FSDP2 accumulates unsharded (torchtitan's reduce dtype, fp32).
FSDP_REDUCE_BYTES = 4.0
#: Bytes Adam reads and writes per parameter it updates: fp32 weight, gradient, momentum and
#: variance read, weight, momentum and variance written (Apex's / torch's fused Adam).
ADAM_STEP_BYTES = 28.0


def optimizer_step_bytes(grad_bytes: float) -> tuple[float, float]:
    """HBM bytes of Megatron-LM's mixed-precision optimizer step per parameter:
    ``(per updated parameter, per parameter of the gradient buffer)``.

    Read off ``MixedPrecisionOptimizer.step`` and ``train_step`` (Megatron-LM 2022-2023,
    ``megatron/optimizer/optimizer.py``, ``clip_grads.py``, ``training.py``). Per parameter the
    rank updates (its ZeRO shard): with 16-bit gradients (``grad_bytes < 4``: Megatron's fp16
    path, the only one that keeps them) the cast to fp32 ``main_param.grad`` (read
    ``grad_bytes``, write 4) and the loss scaler's unscale-and-check (read 4, write 4); with
    fp32 gradients (the bf16 path) ``main_grad.float()`` is the buffer itself and there is no
    scaler. Then the global gradient norm (read 4), Adam (:data:`ADAM_STEP_BYTES`) and the copy
    of the fp32 weights into the 16-bit model weights (read 4, write 2). Per parameter of the
    gradient buffer (the rank's whole buffer unless ZeRO-2/3 shard it): its zeroing before the
    next step (write ``grad_bytes``). Clipping (read and write 4 more) runs only when the norm
    exceeds the threshold and is not counted. fp16: 54 bytes in all, bf16 with fp32 gradients: 42
    (32 before 1 Dec 2026: the state read and written once).
    """
    cast = grad_bytes + 4.0 + 8.0 if grad_bytes < 4.0 else 0.0
    return cast + 4.0 + ADAM_STEP_BYTES + 6.0, float(grad_bytes)


@dataclass(frozen=True, eq=False)
class HybridResult(SimResult):
    """A :class:`SimResult` for a hybrid plan, plus throughput figures.

    Attributes (besides ``SimResult``'s; ``peak_memory`` and ``device_busy`` are per device):
        model_flops_per_device: model FLOP/s per GPU (3 x forward, no recomputation; MFU =
            this / peak).
        hardware_flops_per_device: FLOP/s per GPU counting recomputed forwards (what
            Narayanan et al. 2021 report as "TFLOP/s per GPU").
        mfu: ``model_flops_per_device / peak_flops``.
        layout: the evaluated :class:`HybridLayout`.
        breakdown: seconds per component and bytes per memory term (per pipeline rank).
    """

    model_flops_per_device: float = 0.0
    hardware_flops_per_device: float = 0.0
    mfu: float = 0.0
    layout: HybridLayout | None = None
    breakdown: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.pop("device_busy", None)
        out.update(
            model_flops_per_device=self.model_flops_per_device,
            tflops_per_gpu=self.model_flops_per_device / 1e12,
            hardware_tflops_per_gpu=self.hardware_flops_per_device / 1e12,
            mfu=self.mfu,
            layout=None if self.layout is None else self.layout.to_dict(),
            memory_per_gpu=float(np.max(self.peak_memory)) if len(self.peak_memory) else 0.0,
        )
        return out


class HybridModel:
    """Step time and memory of hybrid layouts of one layered graph on one cluster.

    Everything is per GPU of one pipeline replica (data-parallel replicas are symmetric,
    and so are the TP ranks of a stage), so a plan on thousands of GPUs costs one
    pipeline simulation of ``pp`` ranks (:func:`simulate_pipeline`) plus closed forms.
    ``docs/hybrid.md`` states the model with its sources; in short, per microbatch
    ``b`` of ``s`` tokens and per layer on a ``tp``-way group:

    * GEMMs: :meth:`ModelDims.layer_flops` / tp at ``peak * gemm_efficiency``; memory-bound
      kernels: :data:`ELEMENTWISE_TRAFFIC` x the layer's activation bytes / ``mem_bw``;
      backward twice the forward; ``full`` recomputation adds a forward to every
      backward, ``selective`` the attention core (score FLOPs and score bytes).
    * TP (Megatron column/row split): 2 all-reduces of the ``2 b s h``-byte hidden state
      in the forward, 2 in the backward, 2 more in a recomputed forward; with sequence
      parallelism each becomes a reduce-scatter + all-gather (equal ring time). Not
      overlapped with compute.
    * Pipeline: p2p of the hidden state between consecutive chunks (``1/tp`` of it plus
      an all-gather inside the TP group, Megatron's scatter/gather, unless SP already
      shards it); schedules gpipe / 1f1b / interleaved simulated in static order.
    * Data parallel: ZeRO-0 all-reduces, ZeRO-1 reduce-scatters the gradients of each
      chunk once per step, bucketed per layer and overlapped with the chunk's last
      backward (``overlap_grad_reduce``, default ``cluster.meta["overlap_grad_reduce"]``
      or true; false: after the rank's last backward, as Megatron-LM's default "local"
      DDP did until 2023); ZeRO-2 reduce-scatters and ZeRO-3 also all-gathers the parameters per
      layer in every microbatch (overlapped with that layer's compute: ``max``); ZeRO
      1-2 all-gather the updated parameters after the optimizer step; the optimizer
      step streams :func:`optimizer_step_bytes` per local parameter through ``mem_bw``.
    * Memory per GPU: weights, gradients and optimizer state sharded per ZeRO stage;
      activations (:meth:`ModelDims.activation_parts` under TP / SP / recomputation)
      times the chunk-microbatches in flight in the rank's schedule; embeddings on the
      first stage, final norm, head (a copy of a tied embedding) and fp32 logits on the
      last; ZeRO-3's gathered layer buffers; a recomputed layer's activations during a
      backward (after the head's and loss's backward on the last chunk: the two terms are
      never alive together, so the peak takes the larger, not their sum). The
      ``ModelDims`` switches ``fsdp_root_unsharded``, ``fsdp_pipeline_unsharded``,
      ``sp_saves_gathered_input``, ``pp_keeps_stage_output`` and ``pp_step_buffers`` add
      what PyTorch's FSDP2, DTensor and pipelining keep (torchtitan; memory only), and
      ``megatron_local`` what Megatron-LM's legacy layer code keeps (memory only).
    """

    def __init__(
        self,
        graph: CompGraph,
        cluster: Cluster,
        *,
        gemm_efficiency: float | None = None,
        overlap_grad_reduce: bool | None = None,
        grad_bytes: float | None = None,
    ) -> None:
        self.graph = graph
        self.cluster = cluster
        self.dims: ModelDims = model_dims(graph)
        kinds = set(cluster.kinds)
        if len(kinds) != 1:
            raise ValueError(
                f"HybridModel: cluster {cluster.name!r} mixes device kinds {sorted(kinds)}; "
                "hybrid layouts need identical GPUs"
            )
        self.device = cluster.devices[0]
        eff = gemm_efficiency
        if eff is None:
            eff = float(cluster.meta.get("gemm_efficiency", DEFAULT_GEMM_EFFICIENCY))
        if not 0 < eff <= 1:
            raise ValueError(f"HybridModel: gemm_efficiency must be in (0, 1], got {eff!r}")
        self.gemm_efficiency = eff
        ov = overlap_grad_reduce
        if ov is None:
            ov = cluster.meta.get("overlap_grad_reduce", True)
        if not isinstance(ov, (bool, np.bool_)):
            raise ValueError(
                f"HybridModel: overlap_grad_reduce (cluster {cluster.name!r}, "
                f"meta.overlap_grad_reduce) must be true or false, got {ov!r}"
            )
        self.overlap_grad_reduce = bool(ov)
        gb = grad_bytes if grad_bytes is not None else graph.meta.get("grad_bytes_per_param", 2.0)
        self.grad_bytes = float(gb)
        self.topo = Topology.from_cluster(cluster)
        self._p2p_pairs: dict[tuple[int, int, int], list[int]] = {}  # _slowest_p2p's picks
        self._groups: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

    # ----------------------------------------------------------------- API
    def _end_costs(self, b: int, tp: int, tp_ar: float) -> tuple[float, float]:
        """Forward seconds of the embedding (first chunk) and of the final norm, head and
        loss (last chunk) per microbatch of ``b`` samples on a ``tp``-way group; their
        backwards take 1x and 2x these."""
        d, dev = self.dims, self.device
        tok = float(b * d.seq)
        peak = dev.peak_flops * self.gemm_efficiency
        emb_f = 2.0 * tok * d.hidden / dev.mem_bw + (tp_ar if tp > 1 else 0.0)
        head_gemm = d.head_flops(tok) / tp / peak
        logits = 4.0 * tok * d.vocab / tp  # fp32 logits for the cross-entropy
        head_f = head_gemm + ELEMENTWISE_TRAFFIC * logits / dev.mem_bw
        return emb_f, head_f + (tp_ar if tp > 1 else 0.0)

    def stage_costs(self, layout: HybridLayout) -> dict[str, float]:
        """Per-microbatch seconds on one GPU under ``layout``'s intra-op choices (tp, SP,
        recompute, ZeRO, microbatch size) of its first stage: ``layer`` (forward + backward
        of one transformer layer), ``first`` / ``last`` (the embedding, resp. head and
        loss, forward + backward). What the Alpa-style planner's inter-op split weighs."""
        t = self._mesh_terms(layout, layout.dp, layout.tp, layout.microbatch_size, 0)
        return {
            "layer": t["layer_f"] + t["layer_b"],
            "first": 2 * t["emb_f"],
            "last": 3 * t["head_f"],
        }

    def stage_profile(self, lay: HybridLayout, dp: int, tp: int, b: int) -> StageProfile:
        """What the Alpa-style planner's inter-op DP needs of a stage on a ``dp x tp``
        submesh with microbatches of ``b`` samples per data-parallel rank, under ``lay``'s
        recomputation, SP, ZeRO and schedule switches: per-microbatch seconds and per-GPU
        bytes as affine functions of the stage's layer count (:class:`StageProfile`)."""
        t = self._mesh_terms(lay, dp, tp, b, 0)
        return StageProfile(self, lay, t)

    def _mesh_terms(
        self,
        lay: HybridLayout,
        dp: int,
        tp: int,
        b: int,
        off: int,
        recompute: str | None = None,
        zero: int | None = None,
    ) -> dict[str, Any]:
        """Per-GPU terms of a pipeline stage on a ``dp x tp`` submesh whose first device is
        ``off``, with microbatches of ``b`` samples per data-parallel rank, recomputation
        ``recompute`` (default: ``lay.recompute``) and ZeRO stage ``zero`` (default:
        ``lay.zero``): one layer's
        forward / backward seconds (with ZeRO-2/3 traffic over the stage's DP group), the
        TP collective, the end chunks' costs, the p2p payload, and the activation bytes
        per layer and microbatch."""
        d, dev, topo = self.dims, self.device, self.topo
        rc = lay.recompute if recompute is None else recompute
        zs = lay.zero if zero is None else zero
        s, h = d.seq, d.hidden
        tok = float(b * s)
        sp = lay.sequence_parallel and tp > 1
        peak = dev.peak_flops * self.gemm_efficiency
        mem_bw = dev.mem_bw
        # the stage's tp groups (rows: one per DP rank) and DP groups (its transpose); each
        # collective is timed on the slowest of its groups (they may span nodes differently)
        tp_reps, dp_reps = self._stage_groups(dp, tp, off)

        # ---- one layer, one microbatch, one GPU
        R, Sh, A = d.activation_parts()
        rep = R / tp if sp else R
        gemm_f = d.layer_flops(tok) / tp / peak
        elem_f = ELEMENTWISE_TRAFFIC * b * (rep + (Sh + A) / tp) / mem_bw
        hid = 2.0 * tok * h
        tp_ar = max(topo.allreduce(hid, g) for g in tp_reps) if tp > 1 else 0.0
        if sp:
            tp_ar = max(topo.reduce_scatter(hid, g) + topo.allgather(hid, g) for g in tp_reps)
        fwd = gemm_f + elem_f + 2 * tp_ar
        bwd = 2 * (gemm_f + elem_f) + 2 * tp_ar
        score_flops = 4.0 * tok * s * h
        if rc == "full":
            bwd += fwd
        elif rc == "selective":
            bwd += score_flops / tp / peak + ELEMENTWISE_TRAFFIC * b * A / tp / mem_bw

        # ---- ZeRO traffic per layer and microbatch (over the stage's DP group)
        lp_local = d.layer_params() / tp
        zf = zb = 0.0
        if dp > 1 and zs >= 2:
            zb = max(topo.reduce_scatter(lp_local * self.grad_bytes, g) for g in dp_reps)
        if dp > 1 and zs >= 3:
            ag = max(topo.allgather(lp_local * WEIGHT_BYTES, g) for g in dp_reps)
            zf, zb = ag, zb + ag
        emb_f, head_f = self._end_costs(b, tp, tp_ar)

        # ---- activations kept per layer and sample
        A_kept = d.saved_scores()  # the scores, or FlashAttention's log-sum-exp
        spd = tp if sp else 1
        rep_mem = rep
        if sp and d.sp_saves_gathered_input:  # DTensor keeps the gathered inputs
            rep_mem = rep + d.gathered_inputs() * (1.0 - 1.0 / tp)
        if d.megatron_local:  # Megatron-LM's legacy layers: fp32 norm copies, masks, RoPE
            residual, per_rank = d.megatron_local_saved()
            rep_mem = rep_mem + residual / spd + per_rank
        if rc == "full":
            per_layer = 2.0 * s * h / spd
        elif rc == "selective":
            per_layer = d.op_sac_saved(tp, spd) if d.op_level_sac else rep_mem + Sh / tp
        else:
            per_layer = rep_mem + (Sh + A_kept) / tp
        full_layer = b * (rep_mem + (Sh + A_kept) / tp)
        transient_layer = full_layer if rc == "full" else 0.0
        if rc == "selective" and d.op_level_sac:  # what the block's recompute rebuilds
            transient_layer = max(full_layer - b * per_layer, 0.0)
        head_input = 2.0 * s * h if (sp and d.sp_saves_gathered_input) else 2.0 * s * h / spd
        logits = d.loss_logit_bytes * tok * d.vocab / tp
        return {
            "b": b,
            "tp": tp,
            "dp": dp,
            "sp": sp,
            "spd": spd,
            "tok": tok,
            "hid": hid,
            "tp_ar": tp_ar,
            "layer_f": max(fwd, zf),
            "layer_b": max(bwd, zb),
            "emb_f": emb_f,
            "head_f": head_f,
            # p2p: each GPU sends (receives) its 1/tp share of the hidden state; without SP
            # the receiving TP group all-gathers it (Megatron's scatter/gather)
            "sent": hid / tp if tp > 1 else hid,
            "gather": max(topo.allgather(hid, g) for g in tp_reps) if (tp > 1 and not sp) else 0.0,
            "lp_local": lp_local,
            "per_layer": per_layer,
            "transient_layer": transient_layer,
            # final norm, head input, loss (ModelDims.loss_logit_bytes)
            "loss_peak": b * (2.0 * s * h / spd + head_input) + logits,
        }

    def _stage_groups(self, dp: int, tp: int, off: int) -> tuple[np.ndarray, np.ndarray]:
        """``(TP groups, DP groups)`` of a ``dp x tp`` stage submesh starting at GPU ``off``,
        one group per cost class each (:meth:`Topology.representatives`); on node-structured
        clusters they depend on ``off`` only modulo the node, so they are kept per class."""
        topo = self.topo
        base = off % topo.gpus_per_node if topo.uniform else off
        key = (dp, tp, base)
        hit = self._groups.get(key)
        if hit is None:
            tp_groups = base + np.arange(dp)[:, None] * tp + np.arange(tp)[None, :]
            hit = (topo.representatives(tp_groups) - base, topo.representatives(tp_groups.T) - base)
            self._groups[key] = hit
        return hit[0] + off, hit[1] + off

    def _slowest_p2p(self, nbytes: float, a: int, b: int, n: int) -> float:
        """The slowest of the ``n`` point-to-point sends ``a + k -> b + k`` (all at once)."""
        topo = self.topo
        if not topo.uniform:
            return max(topo.p2p(nbytes, a + k, b + k) for k in range(n))
        G = topo.gpus_per_node
        key = (a % G, b - a, n)  # which offsets k give each kind of pair (same node or not)
        pick = self._p2p_pairs.get(key)
        if pick is None:
            k = np.arange(n)
            cross = (a + k) // G != (b + k) // G
            pick = self._p2p_pairs[key] = sorted({int(np.argmax(cross)), int(np.argmin(cross))})
        return max(topo.p2p(nbytes, a + k, b + k) for k in pick)

    def evaluate(self, layout: HybridLayout) -> HybridResult:
        d, lay, dev, topo = self.dims, layout, self.device, self.topo
        layout.validate(d.layers, d.heads, self.cluster.num_devices, d.kv_heads)
        P, v, m = lay.pp, lay.virtual_stages, lay.num_microbatches
        C = P * v
        s, h = d.seq, d.hidden
        mem_bw = dev.mem_bw

        # ---- per pipeline rank: its submesh's terms (uniform layouts: one representative
        # group at device 0, as every stage's is alike; heterogeneous: each stage's own)
        # a uniform layout's stages sit on different GPUs: alike only where the cluster's
        # nodes are (node-structured or all-to-all); on others (a DGX-1's cube mesh) each
        # stage is scored on its own group, as stage_meshes of the same shape are (the
        # representative group made the two forms of one layout differ by 7-10 %: fuzzing)
        # alike only where every stage starts at the same place in its node: a stage of
        # dp x tp GPUs that does not fill whole nodes puts the next one across a node
        # boundary (5 x 4 GPUs on 8-GPU nodes: stage 1 spans nodes 0 and 1), and its
        # groups' collectives differ (stage 0's for all of them: up to 96 % off, fuzzing)
        size = lay.dp * lay.tp
        misaligned = size % topo.gpus_per_node != 0 and lay.world_size > topo.gpus_per_node
        het = lay.heterogeneous or (lay.pp > 1 and (not topo.uniform or misaligned))
        meshes = lay.meshes
        recs = lay.recomputes
        zeros = lay.zeros
        if het:
            bs = lay.stage_microbatch_sizes
            sizes = np.array([a * b for a, b in meshes], dtype=np.int64)
            first_dev = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # lay.rank(r, 0, 0)
            memo: dict[tuple, dict[str, Any]] = {}
            T = []
            for r in range(P):
                off = int(first_dev[r])
                # on node-structured clusters a group's collectives depend on its place only
                # modulo the node (every node alike): one computation per distinct stage
                key = (
                    meshes[r],
                    bs[r],
                    recs[r],
                    zeros[r],
                    off % topo.gpus_per_node if topo.uniform else off,
                )
                if key not in memo:
                    memo[key] = self._mesh_terms(
                        lay, meshes[r][0], meshes[r][1], bs[r], off, recs[r], zeros[r]
                    )
                T.append(memo[key])
        else:  # every stage alike: one representative group at device 0
            first_dev = np.arange(P) * (lay.dp * lay.tp)
            T = [self._mesh_terms(lay, lay.dp, lay.tp, lay.microbatch_size, 0)] * P

        def dp_groups(r: int) -> np.ndarray:
            """One DP group of stage ``r`` per cost class (its reduction runs on all of them)."""
            return self._stage_groups(*meshes[r], int(first_dev[r]))[1]

        rk = np.arange(C) % P  # the pipeline rank of each chunk
        Tc = [T[r] for r in rk]
        T0, TL = T[0], T[(C - 1) % P]

        # per-chunk values: a scalar when every stage has the same submesh (broadcast)
        def col(key: str) -> Any:
            return np.array([t[key] for t in Tc], dtype=np.float64) if het else T0[key]

        def at(x: Any, r: int) -> Any:  # rank r's entry of a per-rank value
            return x[r] if het else x

        dpr = np.array([mm[0] for mm in meshes]) if het else lay.dp
        tpr = np.array([mm[1] for mm in meshes]) if het else lay.tp

        # ---- chunks
        nl = np.array([bb - aa for aa, bb in lay.stage_layers], dtype=np.float64)
        fdur = nl * col("layer_f")
        bdur = nl * col("layer_b")
        fdur[0] += T0["emb_f"]
        bdur[0] += T0["emb_f"]
        fdur[-1] += TL["head_f"]
        bdur[-1] += 2 * TL["head_f"]
        # ---- p2p between consecutive chunks (rank c % P -> (c + 1) % P): the busier end's
        # share of the hidden state (equal when the two submeshes are alike)
        p2p = np.zeros(C)
        for c in range(C - 1):
            a, z = Tc[c], Tc[c + 1]
            # every GPU of the sending stage sends to its counterpart at once: the slowest pair
            n = min(a["dp"] * a["tp"], z["dp"] * z["tp"])
            src, dst = int(first_dev[rk[c]]), int(first_dev[rk[c + 1]])
            p2p[c] = self._slowest_p2p(max(a["sent"], z["sent"]), src, dst, n) + z["gather"]

        # ---- parameters per pipeline rank (local to one GPU before ZeRO sharding)
        chunk_params = nl * d.layer_params() / (tpr[rk] if het else tpr)
        emb = d.embedding_params() / T0["tp"]
        tpl = TL["tp"]
        head = d.head_params() / tpl + (d.embedding_params() / tpl if (d.tied and P > 1) else 0.0)
        root = np.zeros(C)  # what no transformer layer holds: embedding, final norm, head
        root[0] += emb
        root[-1] += head
        rank_params = np.zeros(P)
        for c in range(C):
            rank_params[c % P] += chunk_params[c] + root[c]
        z = np.array(zeros) if het else lay.zero  # per pipeline rank (stage_zero)
        fsdp = (z >= 3) & (dpr > 1)  # per pipeline rank (a bool when uniform)
        pipe_unsharded = fsdp & (P > 1) & bool(d.fsdp_pipeline_unsharded)
        root_unsharded = fsdp & bool(d.fsdp_root_unsharded) & np.logical_not(pipe_unsharded)

        # ---- activations kept per microbatch of a chunk
        bc, spdc = col("b"), col("spd")
        act = nl * col("per_layer") * bc
        buf = np.broadcast_to(2.0 * bc * s * h / spdc, (C,))  # one microbatch's hidden state
        if d.pp_keeps_stage_output:  # PipelineStage.fwd_cache holds each stage's output
            act[:-1] += buf[:-1]
        if d.megatron_local:  # Megatron's schedule keeps each received input (input_tensors),
            # which the legacy RMSNorm does not keep (its fp32 copy is counted instead)
            act[1:] += buf[1:]
        step_bufs = np.zeros(P)  # pipelining's buffers held for the whole step
        if d.pp_step_buffers and C > 1:  # its receive buffers: hidden states or gradients
            act[1:] -= buf[1:]  # the first layer's kept input is its receive buffer
            for c in range(C):
                step_bufs[c % P] += m * buf[c] * ((c > 0) + (c < C - 1))
            # output_chunks: the last stage keeps every microbatch's bf16 logits
            step_bufs[(C - 1) % P] += m * 2.0 * TL["tok"] * d.vocab / tpl
        if d.dropout:  # the embedding dropout's mask
            act[0] += s * h * T0["b"] / T0["spd"]
        loss_peak = TL["loss_peak"]
        act[-1] += loss_peak
        # a backward's own peak: the layer being recomputed (full recomputation), alive only
        # after the head's and the loss's backward have freed their terms on the last chunk;
        # FSDP2's root keeps the head's unsharded gradient from then to the backward's end
        bwd_extra = np.array(np.broadcast_to(col("transient_layer"), (C,)))
        bwd_extra[-1] -= loss_peak
        # the head's gradient (a tied matrix's, when one stage has both)
        if at(root_unsharded, (C - 1) % P):
            tied_one = d.vocab * h / tpl if (d.tied and P == 1) else 0.0
            bwd_extra[-1] += (head + tied_one) * self.grad_bytes
        # FSDP under PP: unsharded fp32 gradients accumulate from each chunk's first backward
        if het:
            persist = np.where(pipe_unsharded[rk], (chunk_params + root) * FSDP_REDUCE_BYTES, 0.0)
        else:
            persist = (chunk_params + root) * FSDP_REDUCE_BYTES if pipe_unsharded else np.zeros(C)

        makespan, rank_end, busy, last_b, peak_mem_act, peak_act = simulate_pipeline(
            PIPELINE_SCHEDULES[lay.schedule],
            P,
            v,
            m,
            fdur,
            bdur,
            p2p,
            p2p,
            act,
            bwd_extra,
            persist,
            return_kept=True,
        )  # peak_act: the kept activations' peak alone
        if makespan < 0:
            raise RuntimeError("HybridModel: pipeline schedule deadlocked")

        # ---- data-parallel gradient sync, optimizer step, ZeRO parameter all-gather
        sync_end = rank_end.copy()
        dp_time = np.zeros(P)
        opt_time = np.zeros(P)
        ag_time = np.zeros(P)
        per_update, per_grad = optimizer_step_bytes(self.grad_bytes)
        for r in range(P):
            dp, zr = int(at(dpr, r)), int(at(z, r))
            grp = dp_groups(r) if dp > 1 else None
            t = 0.0
            if dp > 1 and zr <= 1:
                order = sorted(range(r, C, P), key=lambda c: last_b[c, 1])
                for c in order:
                    nbytes = (chunk_params[c] + root[c]) * self.grad_bytes
                    reduce = topo.allreduce if zr == 0 else topo.reduce_scatter
                    comm = max(reduce(nbytes, g) for g in grp)
                    dp_time[r] += comm
                    b0, b1 = last_b[c]
                    if not self.overlap_grad_reduce:
                        t = max(t, rank_end[r]) + comm
                        continue
                    k = max(int(nl[c]), 1)
                    per = comm / k
                    finish = b0 + max((b1 - b0) / k + comm, (b1 - b0) + per)
                    t = max(t + comm, finish)
                sync_end[r] = max(rank_end[r], t)
            shard = dp if zr >= 1 else 1
            grad_shard = shard if zr >= 2 else 1
            opt_time[r] = (
                rank_params[r] / shard * per_update + rank_params[r] / grad_shard * per_grad
            ) / mem_bw
            if dp > 1 and zr in (1, 2):
                nbytes = rank_params[r] * WEIGHT_BYTES
                ag_time[r] = max(topo.allgather(nbytes, g) for g in grp)
        # tied embedding: the first and last stages all-reduce its gradient (Megatron)
        tied_ar = 0.0
        if d.tied and P > 1:
            n = min(meshes[0][0] * meshes[0][1], meshes[P - 1][0] * meshes[P - 1][1])
            ends = np.stack([first_dev[0] + np.arange(n), first_dev[P - 1] + np.arange(n)], 1)
            tied_ar = topo.slowest(lambda g: topo.allreduce(emb * self.grad_bytes, g), ends)
        tied = np.zeros(P)
        tied[[0, P - 1]] = tied_ar
        rank_step = sync_end + tied + opt_time + ag_time
        step = float(rank_step.max())

        # ---- memory per pipeline rank
        wb, gb, ob = WEIGHT_BYTES, self.grad_bytes, OPTIMIZER_BYTES
        # each rank's own ZeRO stage over its own DP group (scalars when uniform)
        state = rank_params * (
            wb / np.where(z >= 3, dpr, 1)
            + gb / np.where(z >= 2, dpr, 1)
            + ob / np.where(z >= 1, dpr, 1)
        )
        gathered = np.zeros(P)
        for r in range(P):
            if at(pipe_unsharded, r):
                gathered[r] += rank_params[r] * wb  # every parameter of the stage stays gathered
            elif at(fsdp, r):
                gathered[r] += 2 * T[r]["lp_local"] * wb  # the running and the prefetched layer
        # FSDP2's root is not resharded after forward
        if at(root_unsharded, 0):
            gathered[0] += emb * wb
        if at(root_unsharded, P - 1):
            gathered[P - 1] += head * wb
        state += gathered + step_bufs
        # what a backward adds above the kept activations' peak: the layer being recomputed
        # (0 where the loss's peak, never alive together with it, is the larger) and the
        # gradients accumulated unsharded under FSDP + PP
        transient = peak_mem_act - peak_act
        mem_rank = state + peak_mem_act

        # ---- per-device arrays (rank p's value on all its dp_p * tp_p devices)
        D = self.cluster.num_devices
        per = dpr * tpr
        peak_mem = np.repeat(mem_rank, per)
        busy_dev = np.repeat(busy, per)
        model_flops = d.model_flops(lay.global_batch)
        hw = model_flops
        tokens = lay.global_batch * s
        extra = {"none": 0.0, "selective": 4.0 * tokens * s * h, "full": d.layer_flops(tokens)}
        if lay.stage_recompute:  # each chunk's layers under its stage's mode
            hw += sum(float(n) * extra[recs[r]] for n, r in zip(nl, rk))
        else:
            hw += d.layers * extra[lay.recompute]
        mfpd = model_flops / step / D
        oom = bool((mem_rank > dev.memory).any())
        return HybridResult(
            step_time=step,
            lower_bound=model_flops / D / dev.peak_flops,
            oom=oom,
            device_busy=busy_dev,
            peak_memory=peak_mem,
            link_bytes=np.zeros(len(self.cluster.links)),
            objective="makespan",
            extra={"pipeline_makespan": float(makespan)},
            model_flops_per_device=mfpd,
            hardware_flops_per_device=hw / step / D,
            mfu=mfpd / dev.peak_flops,
            layout=lay,
            breakdown={
                "pipeline": float(makespan),
                "layer_fwd": float(T0["layer_f"]),
                "layer_bwd": float(T0["layer_b"]),
                "tp_collective": float(T0["tp_ar"]),
                "layer_fwd_per_rank": [float(t["layer_f"]) for t in T],
                "layer_bwd_per_rank": [float(t["layer_b"]) for t in T],
                "p2p": float(p2p.max()) if C > 1 else 0.0,
                "dp_comm": dp_time.tolist(),
                "dp_exposed": (sync_end - rank_end).tolist(),
                "optimizer": opt_time.tolist(),
                "zero_allgather": ag_time.tolist(),
                "tied_embedding_allreduce": float(tied_ar),
                "memory_state": state.tolist(),
                "memory_gathered_params": gathered.tolist(),
                "memory_pipeline_buffers": step_bufs.tolist(),
                "memory_activations": peak_act.tolist(),
                "memory_transient": transient.tolist(),
                "memory_per_rank": mem_rank.tolist(),
                "rank_params": rank_params.tolist(),
            },
        )


class StageProfile:
    """Seconds and bytes of one pipeline stage on one submesh as functions of its layer
    count ``k`` and place in a 1F1B pipeline (:meth:`HybridModel.stage_profile`).

    :meth:`seconds` is the stage's forward + backward per microbatch (embedding on the
    first stage, head and loss on the last), as :meth:`HybridModel.evaluate` charges
    them. :meth:`memory` is the stage's per-GPU peak in closed form: its sharded state,
    gathered parameters and pipelining buffers, plus ``min(P - r, m)`` microbatches of
    kept activations (the 1F1B warm-up of rank ``r`` of ``P``) and the larger of 0 and a
    backward's own extra bytes, plus FSDP's accumulated gradients under PP -- the peak the
    pipeline kernel reaches at the rank's first backward (``tests`` compare the two).
    """

    def __init__(self, model: HybridModel, lay: HybridLayout, terms: dict[str, Any]) -> None:
        d = model.dims
        self.t = t = terms
        self.dims, self.lay, self.grad_bytes = d, lay, model.grad_bytes
        self.layer = t["layer_f"] + t["layer_b"]
        self.first = 2 * t["emb_f"]
        self.last = 3 * t["head_f"]
        tp, dp, z = t["tp"], t["dp"], lay.zero
        self.lp = d.layer_params() / tp
        self.emb = d.embedding_params() / tp
        self.head_alone = d.head_params() / tp
        self.tied_copy = d.embedding_params() / tp if d.tied else 0.0
        self.per_param = (
            WEIGHT_BYTES / (dp if z >= 3 else 1)
            + model.grad_bytes / (dp if z >= 2 else 1)
            + OPTIMIZER_BYTES / (dp if z >= 1 else 1)
        )
        self.fsdp = z >= 3 and dp > 1

    def seconds(self, k: float, first: bool, last: bool) -> float:
        return k * self.layer + (self.first if first else 0.0) + (self.last if last else 0.0)

    def head(self, P: int) -> float:
        """Final norm and head parameters on one GPU (a tied embedding's copy when P > 1)."""
        return self.head_alone + (self.tied_copy if P > 1 else 0.0)

    def params(self, k: float, first: bool, last: bool, P: int) -> float:
        """Parameters on one GPU of the stage (before ZeRO sharding)."""
        return k * self.lp + (self.emb if first else 0.0) + (self.head(P) if last else 0.0)

    def most_layers(self, r: int, P: int, m: int, cap: float, limit: int) -> int:
        """The most layers ``k`` in ``[0, limit]`` whose :meth:`memory` as rank ``r`` of a
        ``P``-stage pipeline of ``m`` microbatches fits ``cap`` bytes (0: not even one; the
        memory grows with ``k``, so by bisection)."""
        lo, hi = 0, int(limit)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.memory(mid, r, P, m) <= cap:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def memory(self, k: float, r: int, P: int, m: int) -> float:
        """Peak bytes per GPU of rank ``r`` of a ``P``-stage 1F1B pipeline of ``m``
        microbatches when it holds ``k`` layers on this submesh."""
        d, t, lay = self.dims, self.t, self.lay
        first, last = r == 0, r == P - 1
        s, h = d.seq, d.hidden
        b, spd = t["b"], t["spd"]
        par = self.params(k, first, last, P)
        pipe_unsharded = self.fsdp and P > 1 and d.fsdp_pipeline_unsharded
        root_unsharded = self.fsdp and d.fsdp_root_unsharded and not pipe_unsharded
        state = par * self.per_param
        if pipe_unsharded:
            state += par * WEIGHT_BYTES
        elif self.fsdp:
            state += 2 * self.lp * WEIGHT_BYTES
            if root_unsharded:  # FSDP2's root stays gathered
                root = (self.emb if first else 0.0) + (self.head(P) if last else 0.0)
                state += root * WEIGHT_BYTES
        act = k * t["per_layer"] * b
        if d.pp_keeps_stage_output and not last:
            act += 2.0 * b * s * h / spd
        if d.pp_step_buffers and P > 1:
            buf = 2.0 * b * s * h / spd
            if not first:
                act -= buf
            state += m * buf * ((not first) + (not last))
            if last:
                state += m * 2.0 * t["tok"] * d.vocab / t["tp"]
        if d.dropout and first:
            act += s * h * b / spd
        extra = t["transient_layer"]
        if last:
            act += t["loss_peak"]
            extra -= t["loss_peak"]
            if root_unsharded:
                tied_one = d.vocab * h / t["tp"] if (d.tied and P == 1) else 0.0
                extra += (self.head(P) + tied_one) * self.grad_bytes
        persist = par * FSDP_REDUCE_BYTES if pipe_unsharded else 0.0
        f = min(P - r, m) if lay.schedule == "1f1b" else m
        ex = max(extra, 0.0)
        if m > f:  # steady 1F1B: the persistent bytes are there at the next backwards
            peak = f * act + persist + ex
        else:  # the first backward's peak, or a later one's after the persistent bytes landed
            peak = max(f * act + ex, (f - 1) * act + persist + (ex if f > 1 else 0.0))
        return state + peak


def hybrid_lower_bound(
    graph: CompGraph, cluster: Cluster, global_batch: int | None = None
) -> float:
    """Seconds no layout beats: the step's model FLOPs (``global_batch``, default the graph's
    batch) spread over every GPU at its peak (what ``HybridResult.lower_bound`` is)."""
    d = model_dims(graph)
    gb = int(global_batch or d.batch)
    return d.model_flops(gb) / cluster.num_devices / float(np.max(cluster.peak_flops))


__all__ = [
    "DEFAULT_GEMM_EFFICIENCY",
    "HybridModel",
    "HybridResult",
    "StageProfile",
    "hybrid_lower_bound",
    "optimizer_step_bytes",
]
