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
#: Bytes the optimizer step reads and writes per parameter it updates (its 16 bytes of state, twice).
OPT_STEP_BYTES = 32.0


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
      step streams :data:`OPT_STEP_BYTES` per local parameter through ``mem_bw``.
    * Memory per GPU: weights, gradients and optimizer state sharded per ZeRO stage;
      activations (:meth:`ModelDims.activation_parts` under TP / SP / recomputation)
      times the chunk-microbatches in flight in the rank's schedule; embeddings on the
      first stage, final norm, head (a copy of a tied embedding) and fp32 logits on the
      last; ZeRO-3's gathered layer buffers; a recomputed layer's activations during a
      backward (after the head's and loss's backward on the last chunk: the two terms are
      never alive together, so the peak takes the larger, not their sum). The
      ``ModelDims`` switches ``fsdp_root_unsharded``, ``fsdp_pipeline_unsharded``,
      ``sp_saves_gathered_input``, ``pp_keeps_stage_output`` and ``pp_step_buffers`` add
      what PyTorch's FSDP2, DTensor and pipelining keep (torchtitan; memory only).
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

    # ----------------------------------------------------------------- API
    def _end_costs(self, lay: HybridLayout, tp_ar: float) -> tuple[float, float]:
        """Forward seconds of the embedding (first chunk) and of the final norm, head and
        loss (last chunk) per microbatch; their backwards take 1x and 2x these."""
        d, dev = self.dims, self.device
        tok = float(lay.microbatch_size * d.seq)
        peak = dev.peak_flops * self.gemm_efficiency
        emb_f = 2.0 * tok * d.hidden / dev.mem_bw + (tp_ar if lay.tp > 1 else 0.0)
        head_gemm = d.head_flops(tok) / lay.tp / peak
        logits = 4.0 * tok * d.vocab / lay.tp  # fp32 logits for the cross-entropy
        head_f = head_gemm + ELEMENTWISE_TRAFFIC * logits / dev.mem_bw
        return emb_f, head_f + (tp_ar if lay.tp > 1 else 0.0)

    def stage_costs(self, layout: HybridLayout) -> dict[str, float]:
        """Per-microbatch seconds on one GPU under ``layout``'s intra-op choices (tp, SP,
        recompute, ZeRO, microbatch size): ``layer`` (forward + backward of one
        transformer layer), ``first`` / ``last`` (the embedding, resp. head and loss,
        forward + backward). What the Alpa-style planner's inter-op DP splits."""
        r = self.evaluate(layout)
        emb_f, head_f = self._end_costs(layout, r.breakdown["tp_collective"])
        return {
            "layer": r.breakdown["layer_fwd"] + r.breakdown["layer_bwd"],
            "first": 2 * emb_f,
            "last": 3 * head_f,
        }

    def evaluate(self, layout: HybridLayout) -> HybridResult:
        d, lay, dev, topo = self.dims, layout, self.device, self.topo
        layout.validate(d.layers, d.heads, self.cluster.num_devices)
        if d.kv_heads % lay.tp and lay.tp % d.kv_heads:
            raise ValueError(
                f"HybridLayout.tp = {lay.tp} and the model's {d.kv_heads} kv heads: one must "
                "divide the other"
            )
        P, v, m, tp, dp = lay.pp, lay.virtual_stages, lay.num_microbatches, lay.tp, lay.dp
        C = P * v
        b, s, h = lay.microbatch_size, d.seq, d.hidden
        tok = float(b * s)
        sp = lay.sequence_parallel
        peak = dev.peak_flops * self.gemm_efficiency
        mem_bw = dev.mem_bw

        # ---- groups of the representative replica (d = 0, t = 0)
        tp_group = np.arange(tp)
        dp_groups = [np.array([lay.rank(r, j, 0) for j in range(dp)]) for r in range(P)]

        # ---- one layer, one microbatch, one GPU
        R, Sh, A = d.activation_parts()
        rep = R / tp if sp else R
        gemm_f = d.layer_flops(tok) / tp / peak
        elem_f = ELEMENTWISE_TRAFFIC * b * (rep + (Sh + A) / tp) / mem_bw
        hid = 2.0 * tok * h
        tp_ar = topo.allreduce(hid, tp_group) if tp > 1 else 0.0
        if sp and tp > 1:
            tp_ar = topo.reduce_scatter(hid, tp_group) + topo.allgather(hid, tp_group)
        fwd = gemm_f + elem_f + 2 * tp_ar
        bwd = 2 * (gemm_f + elem_f) + 2 * tp_ar
        score_flops = 4.0 * tok * s * h
        if lay.recompute == "full":
            bwd += fwd
        elif lay.recompute == "selective":
            bwd += score_flops / tp / peak + ELEMENTWISE_TRAFFIC * b * A / tp / mem_bw

        # ---- ZeRO traffic per layer and microbatch (over the stage's DP group)
        lp_local = d.layer_params() / tp
        g0 = dp_groups[0]
        zf = zb = 0.0
        if dp > 1 and lay.zero >= 2:
            zb = topo.reduce_scatter(lp_local * self.grad_bytes, g0)
        if dp > 1 and lay.zero >= 3:
            ag = topo.allgather(lp_local * WEIGHT_BYTES, g0)
            zf, zb = ag, zb + ag
        layer_f = max(fwd, zf)
        layer_b = max(bwd, zb)

        # ---- chunks
        nl = np.array([bb - aa for aa, bb in lay.stage_layers], dtype=np.float64)
        fdur = nl * layer_f
        bdur = nl * layer_b
        emb_f, head_f = self._end_costs(lay, tp_ar)
        fdur[0] += emb_f
        bdur[0] += emb_f
        fdur[-1] += head_f
        bdur[-1] += 2 * head_f
        # ---- p2p between consecutive chunks (rank c % P -> (c + 1) % P)
        first_dev = np.array([lay.rank(r, 0, 0) for r in range(P)])
        sent = hid / tp if tp > 1 else hid
        gather = topo.allgather(hid, tp_group) if (tp > 1 and not sp) else 0.0
        p2p = np.zeros(C)
        for c in range(C - 1):
            p2p[c] = topo.p2p(sent, int(first_dev[c % P]), int(first_dev[(c + 1) % P])) + gather

        # ---- parameters per pipeline rank (local to one GPU before ZeRO sharding)
        chunk_params = nl * d.layer_params() / tp
        emb = d.embedding_params() / tp
        head = d.head_params() / tp + (emb if (d.tied and P > 1) else 0.0)  # a tied copy
        root = np.zeros(C)  # what no transformer layer holds: embedding, final norm, head
        root[0] += emb
        root[-1] += head
        rank_params = np.zeros(P)
        for c in range(C):
            rank_params[c % P] += chunk_params[c] + root[c]
        z = lay.zero
        fsdp = z >= 3 and dp > 1
        pipe_unsharded = fsdp and P > 1 and d.fsdp_pipeline_unsharded
        root_unsharded = fsdp and d.fsdp_root_unsharded and not pipe_unsharded

        # ---- activations kept per microbatch of a chunk
        A_kept = d.saved_scores()  # the scores, or FlashAttention's log-sum-exp
        spd = tp if sp else 1
        rep_mem = rep
        if sp and tp > 1 and d.sp_saves_gathered_input:  # DTensor keeps the gathered inputs
            rep_mem = rep + d.gathered_inputs() * (1.0 - 1.0 / tp)
        if lay.recompute == "full":
            per_layer = 2.0 * s * h / spd
        elif lay.recompute == "selective":
            per_layer = d.op_sac_saved(tp, spd) if d.op_level_sac else rep_mem + Sh / tp
        else:
            per_layer = rep_mem + (Sh + A_kept) / tp
        act = nl * per_layer * b
        if d.pp_keeps_stage_output:  # PipelineStage.fwd_cache holds each stage's output
            act[:-1] += 2.0 * b * s * h / spd
        step_bufs = np.zeros(P)  # pipelining's buffers held for the whole step
        if d.pp_step_buffers and C > 1:
            buf = 2.0 * b * s * h / spd  # one microbatch's hidden state (or its gradient)
            act[1:] -= buf  # the first layer's kept input is its receive buffer
            for c in range(C):
                step_bufs[c % P] += m * buf * ((c > 0) + (c < C - 1))
            step_bufs[(C - 1) % P] += m * 2.0 * tok * d.vocab / tp  # output_chunks: bf16 logits
        # the loss's peak: fp32 logits (and, eager, its gradient buffers), ModelDims.loss_logit_bytes
        logits = d.loss_logit_bytes * tok * d.vocab / tp
        if d.arch == "gpt":  # embedding dropout mask (LLaMA has no dropout)
            act[0] += s * h * b / spd
        head_input = (
            2.0 * s * h if (sp and tp > 1 and d.sp_saves_gathered_input) else 2.0 * s * h / spd
        )
        loss_peak = b * (2.0 * s * h / spd + head_input) + logits  # final norm, head input, loss
        act[-1] += loss_peak
        # a backward's own peak: the layer being recomputed (full recomputation), alive only
        # after the head's and the loss's backward have freed their terms on the last chunk;
        # FSDP2's root keeps the head's unsharded gradient from then to the backward's end
        full_layer = b * (rep_mem + (Sh + A_kept) / tp)
        transient_layer = full_layer if lay.recompute == "full" else 0.0
        if lay.recompute == "selective" and d.op_level_sac:  # what the block's recompute rebuilds
            transient_layer = max(full_layer - b * per_layer, 0.0)
        bwd_extra = np.full(C, transient_layer)
        bwd_extra[-1] -= loss_peak
        if root_unsharded:  # the head's gradient (a tied matrix's, when one stage has both)
            tied_one = d.vocab * h / tp if (d.tied and P == 1) else 0.0
            bwd_extra[-1] += (head + tied_one) * self.grad_bytes
        # FSDP under PP: unsharded fp32 gradients accumulate from each chunk's first backward
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
        shard = dp if lay.zero >= 1 else 1
        for r in range(P):
            grp = dp_groups[r]
            t = 0.0
            if dp > 1 and lay.zero <= 1:
                order = sorted(range(r, C, P), key=lambda c: last_b[c, 1])
                for c in order:
                    extra = emb if c == 0 else 0.0
                    if c == C - 1:
                        extra += d.head_params() / tp + (emb if (d.tied and P > 1) else 0.0)
                    nbytes = (chunk_params[c] + extra) * self.grad_bytes
                    comm = (
                        topo.allreduce(nbytes, grp)
                        if lay.zero == 0
                        else topo.reduce_scatter(nbytes, grp)
                    )
                    dp_time[r] += comm
                    bs, be = last_b[c]
                    if not self.overlap_grad_reduce:
                        t = max(t, rank_end[r]) + comm
                        continue
                    k = max(int(nl[c]), 1)
                    per = comm / k
                    finish = bs + max((be - bs) / k + comm, (be - bs) + per)
                    t = max(t + comm, finish)
                sync_end[r] = max(rank_end[r], t)
            opt_time[r] = rank_params[r] / shard * OPT_STEP_BYTES / mem_bw
            if dp > 1 and lay.zero in (1, 2):
                ag_time[r] = topo.allgather(rank_params[r] * WEIGHT_BYTES, grp)
        # tied embedding: the first and last stages all-reduce its gradient (Megatron)
        tied_ar = 0.0
        if d.tied and P > 1:
            ends = np.array([first_dev[0], first_dev[P - 1]])
            tied_ar = topo.allreduce(emb * self.grad_bytes, ends)
        tied = np.zeros(P)
        tied[[0, P - 1]] = tied_ar
        rank_step = sync_end + tied + opt_time + ag_time
        step = float(rank_step.max())

        # ---- memory per pipeline rank
        wb, gb, ob = WEIGHT_BYTES, self.grad_bytes, OPTIMIZER_BYTES
        state = rank_params * (
            wb / (dp if z >= 3 else 1) + gb / (dp if z >= 2 else 1) + ob / (dp if z >= 1 else 1)
        )
        gathered = np.zeros(P)
        if pipe_unsharded:
            gathered += rank_params * wb  # every parameter of the stage stays gathered
        elif fsdp:
            # gathered weights of the running and the prefetched layer
            gathered += 2 * lp_local * wb
            if root_unsharded:  # FSDP2's root is not resharded after forward
                gathered[0] += emb * wb
                gathered[P - 1] += head * wb
        state += gathered + step_bufs
        # what a backward adds above the kept activations' peak: the layer being recomputed
        # (0 where the loss's peak, never alive together with it, is the larger) and the
        # gradients accumulated unsharded under FSDP + PP
        transient = peak_mem_act - peak_act
        mem_rank = state + peak_mem_act

        # ---- per-device arrays (rank p's value on all its dp * tp devices)
        D = self.cluster.num_devices
        per = dp * tp
        peak_mem = np.repeat(mem_rank, per)
        busy_dev = np.repeat(busy, per)
        model_flops = d.model_flops(lay.global_batch)
        hw = model_flops
        tokens = lay.global_batch * s
        if lay.recompute == "full":
            hw += d.layers * d.layer_flops(tokens)
        elif lay.recompute == "selective":
            hw += d.layers * 4.0 * tokens * s * h
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
                "layer_fwd": float(layer_f),
                "layer_bwd": float(layer_b),
                "tp_collective": float(tp_ar),
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


def hybrid_lower_bound(
    graph: CompGraph, cluster: Cluster, global_batch: int | None = None
) -> float:
    """Seconds no layout beats: the step's model FLOPs (``global_batch``, default the graph's
    batch) spread over every GPU at its peak (what ``HybridResult.lower_bound`` is)."""
    d = model_dims(graph)
    gb = int(global_batch or d.batch)
    return d.model_flops(gb) / cluster.num_devices / float(np.max(cluster.peak_flops))


__all__ = ["DEFAULT_GEMM_EFFICIENCY", "HybridModel", "HybridResult", "hybrid_lower_bound"]
