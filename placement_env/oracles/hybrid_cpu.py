"""Hybrid step model of gloo CPU processes on this machine, from ``runtime.hybrid_profile.calibrate_hybrid``.

Used instead of :class:`placement_env.oracles.hybrid.HybridModel` for ``cpu_N`` clusters
whose calibration holds a ``hybrid`` section (``cluster.meta["hybrid_calibration"]``):
the GPU model's roofline (peak FLOP/s, HBM bandwidth, NVLink rings) says nothing useful
about a handful of single-threaded CPU processes time-sharing two cores, where the
program's per-op overheads (DTensor dispatch, autograd, gloo) dominate.

The model, per layout ``(dp, tp, pp, microbatch b, recompute, ZeRO)`` with ``k = dp tp pp``
processes and ``m = global_batch / (dp b)`` microbatches per replica (with
``stage_recompute`` each stage's chunks take its own mode's figures, with ``stage_zero`` its
own ZeRO stage's collectives, optimizer shard and memory; with ``stage_meshes`` each stage is
charged what stage ``p`` of its uniform view ``stage_view(p)`` computes, communicates over its
dp group and keeps, the messages between two stages carry the larger side's rows, and the
schedule, total work and activations in flight are those of the combined stages):

* **Work.** Each chunk's forward / backward per microbatch is the sum of its segments'
  measured CPU seconds at ``(tp, b, recompute)`` (embeddings on the first chunk, head +
  loss on the last; tensor-parallel collectives and DTensor overhead are inside these
  figures, and a recomputed block's backward includes its second forward). Data
  parallelism adds per step, on each rank: ZeRO-0 (``replicate``) an all-reduce of each
  chunk's gradients; ZeRO-3 (``fully_shard`` per block) an all-gather of each block's
  parameters in every microbatch's forward and again in its backward and one
  reduce-scatter of its gradients (at the last microbatch); ZeRO 1-2 one all-gather and
  one reduce-scatter per block per step. Each collective costs its measured per-rank CPU
  seconds (``latency + bytes x per_byte`` fitted by message size for ``dp`` processes);
  pipeline p2p sends / receives the ``b s h`` fp32 hidden state per microbatch and
  boundary. The optimizer (Adam) costs its measured CPU seconds per local parameter.
* **Time.** The processes share ``cores = k x speed[k]`` cores, where ``speed[k]`` is the
  per-process speed measured with ``k`` processes computing at once (so other jobs on the
  machine lower it). The step takes the larger of the total work over ``cores`` and the
  critical path at one process's full speed: the pipeline schedule
  (:func:`simulate_pipeline`) of the per-microbatch chunk times and p2p latencies, plus
  the data-parallel collectives' wall time and the optimizer step.
* **Runtime overheads** (``calibration["runtime"]``, by process count, from
  ``runtime.hybrid_profile.measure_runtime_overhead``: solved so that the model predicts
  the runtime's measured step time of probe plans that are not the plans being scored):
  CPU seconds per microbatch and rank (from 1 process), and for ``k`` processes per
  pipeline message (added to p2p), per block and microbatch under tensor parallelism, per
  chunk and step under ZeRO-0 and per ZeRO all-gather / reduce-scatter call (added to the
  data-parallel cost) -- what synchronising ``k`` processes that time-share the cores
  costs beyond the idle collective figures.
* **Memory per rank** (CPU resident bytes): ``base`` = the runtime worker's measured
  resident set after its model build (``memory.worker_base``, the 1-process probe:
  Python, torch, gloo, the whole model built before it is cut and sharded); without it,
  the process baseline of a spawned worker + the build's extra + the model's fp32
  weights. Plus, over the steps, fp32
  gradients (sharded by ZeRO >= 2), Adam's two fp32 moments (sharded by ZeRO >= 1), ZeRO-3's
  gathered weights of one block, the activations in flight (each segment's measured
  saved-tensor bytes per microbatch, times the microbatches the schedule holds at its
  peak), on a stage under full recomputation one block's recomputed activations, and the measured
  ``memory.step_residue`` (the 1-process probe's step memory beyond these terms: allocator
  and optimizer temporaries) = ``step``. ``peak = base + step``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.cpu_cluster import HYBRID_CALIBRATION_KEYS, check_hybrid_calibration
from graphs.layout import HybridLayout, model_dims
from graphs.schema import Fields
from placement_env.oracles.hybrid import HybridResult
from placement_env.oracles.pipeline import PIPELINE_SCHEDULES, simulate_pipeline

#: fp32 bytes per parameter / gradient / Adam moment on CPU.
FP32 = 4.0


class UncalibratedLayoutError(ValueError):
    """A layout needs segment figures the calibration does not have (a ``(tp, microbatch
    size, recompute)`` never measured). The hybrid planners skip such layouts and count
    them (``meta["uncalibrated_skipped"]``); a direct ``evaluate`` raises it."""


def speed_at(speed: Mapping[str, float], k: int) -> float:
    """Per-process speed with ``k`` processes (measured counts; beyond the largest measured
    count its total throughput is shared; between counts the next larger one)."""
    s = {int(a): float(b) for a, b in speed.items()}
    if not s:
        return 1.0
    if k in s:
        return min(1.0, s[k])
    larger = [c for c in s if c > k]
    if larger:
        return min(1.0, s[min(larger)])
    c = max(s)
    return min(1.0, s[c] * c / k)


def collective_cost(fit: Mapping[str, float], nbytes: float) -> float:
    """``latency + nbytes x per_byte`` of a fitted collective."""
    return float(fit["latency"]) + float(nbytes) * float(fit["per_byte"])


class CpuHybridModel:
    """Step time and per-rank memory of hybrid layouts on gloo CPU processes, calibrated.

    ``calibration`` is what :func:`runtime.hybrid_profile.calibrate_hybrid` returns (keys
    ``segments``, ``collectives``, ``speed``, ``optimizer``, ``memory``, optionally
    ``runtime``); see the module
    docstring for the model. Layouts need a measured ``(tp, microbatch size,
    recompute)``; others raise ``ValueError`` naming what to calibrate.
    """

    def __init__(self, graph: CompGraph, cluster: Cluster, calibration: Mapping[str, Any]) -> None:
        self.graph = graph
        self.cluster = cluster
        self.dims = model_dims(graph)
        for key in HYBRID_CALIBRATION_KEYS:
            if key not in calibration:
                raise ValueError(
                    f"CpuHybridModel: the hybrid calibration has no {key!r}; measure it with "
                    "runtime.hybrid_profile.calibrate_hybrid"
                )
        measured_on = calibration.get("model")
        if isinstance(measured_on, Mapping) and "name" in measured_on:
            meta = getattr(graph, "meta", {}) or {}
            cfg = meta.get("config") or {}
            diff = {
                k: (v, cfg.get(k))
                for k, v in dict(measured_on.get("config") or {}).items()
                if cfg.get(k) != v
            }
            if measured_on["name"] != meta.get("name") or diff:
                raise ValueError(
                    f"CpuHybridModel: the hybrid calibration was measured on "
                    f"{measured_on['name']!r} {dict(measured_on.get('config') or {})}, not on "
                    f"this graph ({meta.get('name')!r}"
                    + (f"; differs in {diff} (calibrated, graph)" if diff else "")
                    + "); calibrate this model: python -m runners.profile hybrid.model=..."
                )
        check_hybrid_calibration(
            calibration, Fields(f"CpuHybridModel: the hybrid calibration of {cluster.name!r}"),
            "hybrid", layers=self.dims.layers,
        )  # fmt: skip
        self.cal = calibration

    # ------------------------------------------------------------------ pieces
    def segments(self, layout: HybridLayout, recompute: str | None = None) -> dict[str, np.ndarray]:
        """The measured per-segment figures for the layout's ``(tp, b, recompute)``
        (``recompute``: another mode than the layout's first stage's):
        ``fwd``, ``bwd`` (CPU s per microbatch), ``kept`` (bytes), ``params`` (per rank)."""
        rc = layout.recompute if recompute is None else recompute
        s = self._entry(layout.tp, layout.microbatch_size, rc)
        if s is None:
            have = sorted(
                f"tp={t} {k}" for t, v in self.cal["segments"].items() for k in v["segments"]
            )
            raise UncalibratedLayoutError(
                f"CpuHybridModel: no calibrated segment times for tp={layout.tp}, microbatch "
                f"size {layout.microbatch_size}, recompute {rc!r} (have: {', '.join(have)}); "
                "measure them with runtime.hybrid_profile.calibrate_hybrid(tps=..., "
                "micro_sizes=..., recomputes=...)"
            )
        return {f: np.asarray(s[f], dtype=np.float64) for f in ("fwd", "bwd", "kept", "params")}

    def _entry(self, tp: int, microbatch_size: int, recompute: str) -> Mapping[str, Any] | None:
        """The calibration's segment figures of ``(tp, microbatch size, recompute)``, or None."""
        by_tp = self.cal["segments"].get(str(tp)) or {}
        return (by_tp.get("segments") or {}).get(f"{microbatch_size}/{recompute}")

    def chunk_segments(self, layout: HybridLayout) -> list[list[int]]:
        """Segment indices of each chunk: 0 = embeddings, 1..L = blocks, L + 1 = head + loss."""
        n = self.dims.layers
        out = []
        for c, (a, b) in enumerate(layout.stage_layers):
            ks = list(range(1 + a, 1 + b))
            if c == 0:
                ks.insert(0, 0)
            if c == layout.num_chunks - 1:
                ks.append(n + 1)
            out.append(ks)
        return out

    def overheads(self, k: int) -> dict[str, float]:
        """The runtime overheads for ``k`` processes (``calibration["runtime"]``, by process
        count; ``microbatch`` from 1 process, the rest from ``k`` or the nearest measured
        count above it, else the largest); empty without a ``runtime`` section."""
        rt = self.cal.get("runtime") or {}
        out = {"microbatch": float((rt.get("1") or {}).get("microbatch", 0.0))}
        counts = sorted(int(c) for c in rt if int(c) > 1)
        if k > 1 and counts:
            above = [c for c in counts if c >= k]
            c = min(above) if above else max(counts)
            out.update({n: float(x) for n, x in rt[str(c)].items()})
        return out

    def _coll(self, name: str, group: int, nbytes: float, kind: str) -> float:
        """Per-rank ``kind`` ("cpu" or "wall") seconds of one collective over ``group`` ranks."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        by_k = self.cal["collectives"]
        k = str(group) if str(group) in by_k else str(max(int(x) for x in by_k))
        return collective_cost(by_k[k][name][kind], nbytes)

    # ------------------------------------------------------------------ API
    def stage_costs(self, layout: HybridLayout) -> dict[str, float]:
        """Per-microbatch CPU seconds of the calibrated segments under ``layout``'s ``(tp,
        microbatch size, recompute)`` (its first stage's mode): ``layer`` (forward + backward
        of one transformer block, the mean over the blocks), ``first`` (the embeddings) and
        ``last`` (head and loss). What the Alpa-style planner's inter-op split weighs, as
        :meth:`placement_env.oracles.hybrid.HybridModel.stage_costs` gives on GPUs;
        :class:`UncalibratedLayoutError` for a shape the calibration lacks."""
        seg = self.segments(layout, layout.recomputes[0])
        return self._split(seg["fwd"] + seg["bwd"])

    def segment_costs(
        self, tp: int, microbatch_size: int, recompute: str
    ) -> dict[str, float] | None:
        """:meth:`stage_costs` of a stage on ``tp`` processes per tensor-parallel group with
        microbatches of ``microbatch_size`` samples per data-parallel rank and ``recompute``,
        or ``None`` when the calibration did not measure that shape (what the Alpa-style
        planner's submesh DP weighs per stage option)."""
        s = self._entry(tp, microbatch_size, recompute)
        if s is None:
            return None
        return self._split(np.asarray(s["fwd"], np.float64) + np.asarray(s["bwd"], np.float64))

    @staticmethod
    def _split(t: np.ndarray) -> dict[str, float]:
        return {"layer": float(t[1:-1].mean()), "first": float(t[0]), "last": float(t[-1])}

    def missing(self, layout: HybridLayout) -> str | None:
        """The first ``(tp, microbatch size, recompute)`` the layout needs and the calibration
        lacks (as :meth:`evaluate` would look it up: each stage's view for ``stage_meshes``),
        or None when it can be scored. Cheap: no evaluation."""
        views = (
            [layout.stage_view(p) for p in range(layout.pp)] if layout.stage_meshes else [layout]
        )
        for lay in views:
            for rc in dict.fromkeys(lay.recomputes):
                if self._entry(lay.tp, lay.microbatch_size, rc) is None:
                    return f"tp={lay.tp}, microbatch size {lay.microbatch_size}, recompute {rc!r}"
        return None

    def evaluate(self, layout: HybridLayout) -> HybridResult:
        d = self.dims
        layout.validate(d.layers, d.heads, self.cluster.num_devices, d.kv_heads)
        if layout.stage_meshes:
            return self._evaluate_submeshes(layout)
        return self._evaluate_uniform(layout)

    def _evaluate_uniform(self, layout: HybridLayout, processes: int | None = None) -> HybridResult:
        """:meth:`evaluate` of a layout whose stages share one submesh shape (not checked
        against the cluster: :meth:`_evaluate_submeshes` scores each stage's view with it,
        passing the real process count for the runtime overheads as ``processes``)."""
        d = self.dims
        lay = layout
        P, v, dp, tp = lay.pp, lay.virtual_stages, lay.dp, lay.tp
        C, m, b = P * v, lay.num_microbatches, lay.microbatch_size
        k = lay.world_size if processes is None else processes
        # chunk c runs under its stage's mode (``stage_recompute``; v == 1 when it is set)
        modes = [lay.recomputes[c % P] for c in range(C)]
        segs = {rc: self.segments(lay, rc) for rc in dict.fromkeys(modes)}
        chunks = self.chunk_segments(lay)
        F = np.array([segs[rc]["fwd"][ks].sum() for rc, ks in zip(modes, chunks)])
        B = np.array([segs[rc]["bwd"][ks].sum() for rc, ks in zip(modes, chunks)])
        kept = np.array([segs[rc]["kept"][ks].sum() for rc, ks in zip(modes, chunks)])
        prm = segs[modes[0]]["params"]
        chunk_params = np.array([prm[ks].sum() for ks in chunks])  # one tp rank's, before ZeRO
        if d.tied and C == 1:  # the embedding and the head share one matrix in one chunk
            chunk_params[0] -= d.vocab * d.hidden
        block_params = float(prm[1])
        nblocks = np.array([bb - aa for aa, bb in lay.stage_layers], dtype=np.float64)
        rt = self.overheads(k)
        F = F + rt.get("microbatch", 0.0) / v  # the runtime's own per-microbatch cost, per rank
        if tp > 1:
            F = F + rt.get("tp", 0.0) * nblocks
        F = np.maximum(F, 0.0)  # a negative correction never makes work negative

        # ---- data-parallel collectives per chunk and step (CPU and wall seconds per rank)
        dp_cpu, dp_wall = np.zeros(C), np.zeros(C)
        zr = np.array(lay.zeros)  # each pipeline rank's ZeRO stage (``stage_zero``)
        if dp > 1:
            for c in range(C):
                full = chunk_params[c] * FP32
                zc = int(zr[c % P])
                if zc == 0:
                    dp_cpu[c] = self._coll("all_reduce", dp, full, "cpu")
                    dp_wall[c] = self._coll("all_reduce", dp, full, "wall")
                    dp_cpu[c] += rt.get("ddp", 0.0)
                    dp_wall[c] += rt.get("ddp", 0.0)
                    continue
                blk = block_params * FP32
                rest = full - nblocks[c] * blk  # the chunk's root (embeddings, head, norms)
                gathers = 2 * m if zc >= 3 else 1
                for kind, arr in (("cpu", dp_cpu), ("wall", dp_wall)):
                    ag = self._coll("all_gather", dp, blk, kind)
                    rs = self._coll("reduce_scatter", dp, blk, kind)
                    ag_r = self._coll("all_gather", dp, rest, kind)
                    rs_r = self._coll("reduce_scatter", dp, rest, kind)
                    arr[c] = nblocks[c] * (gathers * ag + rs) + gathers * ag_r + rs_r
                    arr[c] += (nblocks[c] + 1) * (gathers + 1) * rt.get("fsdp", 0.0)
        dp_cpu, dp_wall = np.maximum(dp_cpu, 0.0), np.maximum(dp_wall, 0.0)
        # ---- pipeline p2p per microbatch and boundary
        hid = FP32 * b * d.seq * d.hidden
        p2p_wall = self._coll("p2p", 2, hid, "wall") if C > 1 else 0.0
        p2p_cpu = self._coll("p2p", 2, hid, "cpu") if C > 1 else 0.0
        if C > 1:
            p2p_wall = max(0.0, p2p_wall + rt.get("p2p", 0.0))
            p2p_cpu = max(0.0, p2p_cpu + rt.get("p2p", 0.0))
        # ---- optimizer
        shard = np.where((zr >= 1) & (dp > 1), dp, 1)  # per pipeline rank
        rank_params = np.zeros(P)
        for c in range(C):
            rank_params[c % P] += chunk_params[c]
        opt = rank_params / shard * float(self.cal["optimizer"]["adam_cpu_per_param"])

        # ---- work per pipeline rank (every dp x tp rank of a stage alike)
        work = np.zeros(P)
        for c in range(C):
            r = c % P
            boundaries = (c > 0) + (c < C - 1)
            work[r] += m * (F[c] + B[c]) + dp_cpu[c] + 2 * m * boundaries * p2p_cpu
        work += opt
        sync = np.zeros(P)
        for c in range(C):
            sync[c % P] += dp_wall[c]

        # ---- memory per pipeline rank (the activations in flight come from the schedule)
        mem = self.cal["memory"]
        total_params = self._model_params()
        if "worker_base" in mem:  # measured in the runtime's own worker (1-process probe)
            base = float(mem["worker_base"])
        else:
            base = float(mem["process"]) + float(mem["build_extra"]) + FP32 * total_params
        grads = rank_params * FP32 / np.where((zr >= 2) & (dp > 1), dp, 1)
        adam = rank_params * 2 * FP32 / shard
        gathered = np.where((zr >= 3) & (dp > 1), block_params * FP32, 0.0)
        transient = np.zeros(P)
        full_kept = self._kept_without_recompute(lay) if "full" in modes else None
        if full_kept is not None:  # the block being recomputed, on the stages that recompute
            transient += full_kept * (np.array(lay.recomputes) == "full")
        return self._result(
            lay, k, v, m, F, B, kept, np.full(C, p2p_wall), work, np.full(P, dp * tp), sync, opt,
            base, grads, adam, gathered, transient,
            {"dp_cpu": dp_cpu.tolist(), "dp_wall": dp_wall.tolist(), "p2p": float(p2p_wall),
             "rank_params": rank_params.tolist()},
        )  # fmt: skip

    def _result(
        self,
        lay: HybridLayout,
        k: int,
        v: int,
        m: int,
        F: np.ndarray,
        B: np.ndarray,
        kept: np.ndarray,
        p2p: np.ndarray,
        work: np.ndarray,
        sizes: np.ndarray,
        sync: np.ndarray,
        opt: np.ndarray,
        base: float,
        grads: np.ndarray,
        adam: np.ndarray,
        gathered: np.ndarray,
        transient: np.ndarray,
        breakdown: dict[str, Any],
    ) -> HybridResult:
        """Step time, memory and result from per-chunk times (``F``, ``B``, kept bytes
        ``kept``, p2p after chunk ``p2p``) and per-pipeline-rank figures (``work`` CPU
        seconds of one rank, ``sizes`` ranks per stage, data-parallel wall time ``sync``,
        optimizer ``opt``, memory terms); ``breakdown`` adds the caller's own figures.

        The step takes the larger of the total work over the ``k`` processes' cores and the
        critical path at one process's full speed: the schedule, then sync + step. (Slowing
        it by k / cores when all k processes compute would give the work bound again; where
        fewer compute -- pipeline fill and drain -- they run at full speed.)"""
        P = lay.pp
        total_work = float((work * sizes).sum())
        cores = k * speed_at(self.cal["speed"], k)
        share_time = total_work / cores
        makespan, rank_end, busy, _, peak_act = simulate_pipeline(
            PIPELINE_SCHEDULES[lay.schedule], P, v, m, F, B, p2p, p2p, kept.copy()
        )
        if makespan < 0:
            raise RuntimeError("CpuHybridModel: pipeline schedule deadlocked")
        path = float((rank_end + sync + opt).max())
        step = max(share_time, path)
        step_mem = grads + adam + gathered + peak_act + transient
        step_mem = step_mem + float(self.cal["memory"].get("step_residue", 0.0))
        peak_rank = base + step_mem
        oom = bool((peak_rank > np.array([dv.memory for dv in self.cluster.devices]).min()).any())
        mf = self.dims.model_flops(lay.global_batch)
        D = self.cluster.num_devices
        return HybridResult(
            step_time=float(step),
            lower_bound=0.0,
            oom=oom,
            device_busy=np.repeat(busy, sizes),
            peak_memory=np.repeat(peak_rank, sizes),
            link_bytes=np.zeros(len(self.cluster.links)),
            objective="makespan",
            extra={"pipeline_makespan": float(makespan), "model": "cpu_hybrid"},
            model_flops_per_device=mf / step / D,
            hardware_flops_per_device=mf / step / D,
            mfu=0.0,
            layout=lay,
            breakdown={
                "work_per_rank": work.tolist(),
                "total_work": total_work,
                "cores": float(cores),
                "share_time": float(share_time),
                "critical_path": path,
                "chunk_fwd": F.tolist(),
                "chunk_bwd": B.tolist(),
                "chunk_kept": kept.tolist(),
                "optimizer": opt.tolist(),
                "memory_base": base,
                "memory_grads": grads.tolist(),
                "memory_optimizer": adam.tolist(),
                "memory_gathered": gathered.tolist(),
                "memory_activations": peak_act.tolist(),
                "memory_transient": transient.tolist(),
                "memory_step": step_mem.tolist(),
                "memory_per_rank": peak_rank.tolist(),
                **breakdown,
            },
        )

    def _evaluate_submeshes(self, lay: HybridLayout) -> HybridResult:
        """A layout whose stages have their own ``dp_p x tp_p`` submeshes (``stage_meshes``,
        ``virtual_stages`` 1): stage ``p`` computes, communicates over its dp group and keeps
        what stage ``p`` of the uniform layout ``lay.stage_view(p)`` does (its chunk's
        forward / backward, data-parallel collectives, optimizer step, gradient, Adam,
        gathered and transient bytes); between stages ``p`` and ``p + 1`` each message
        carries the hidden state of the larger of the two stages' per-rank microbatch rows
        (what ``runtime.submesh`` sends: the busier end's rows). The pipeline schedule, the
        total work over the ``k`` processes' cores and the activations in flight are then
        computed for the combined stages as for a uniform layout."""
        d = self.dims
        P, m = lay.pp, lay.num_microbatches
        k = lay.world_size
        bd = [self._evaluate_uniform(lay.stage_view(p), k).breakdown for p in range(P)]

        def stage(key: str) -> np.ndarray:
            return np.array([float(bd[p][key][p]) for p in range(P)])

        F, B, kept = stage("chunk_fwd"), stage("chunk_bwd"), stage("chunk_kept")
        dp_cpu, dp_wall, opt = stage("dp_cpu"), stage("dp_wall"), stage("optimizer")
        rt = self.overheads(k)
        rows = lay.stage_microbatch_sizes
        p2p_wall, p2p_cpu = np.zeros(P), np.zeros(P)
        for p in range(P - 1):  # boundary p -> p + 1
            hid = FP32 * max(rows[p], rows[p + 1]) * d.seq * d.hidden
            p2p_wall[p] = max(0.0, self._coll("p2p", 2, hid, "wall") + rt.get("p2p", 0.0))
            p2p_cpu[p] = max(0.0, self._coll("p2p", 2, hid, "cpu") + rt.get("p2p", 0.0))
        messages = p2p_cpu + np.concatenate([[0.0], p2p_cpu[:-1]])  # out of and into stage p
        work = m * (F + B) + dp_cpu + 2 * m * messages + opt
        sizes = np.array([a * b for a, b in lay.meshes])
        return self._result(
            lay, k, 1, m, F, B, kept, p2p_wall, work, sizes, dp_wall, opt,
            float(bd[0]["memory_base"]), stage("memory_grads"), stage("memory_optimizer"),
            stage("memory_gathered"), stage("memory_transient"),
            {"dp_cpu": dp_cpu.tolist(), "dp_wall": dp_wall.tolist(),
             "p2p_per_boundary": p2p_wall[:-1].tolist(),
             "rank_params": stage("rank_params").tolist(), "stage_sizes": sizes.tolist()},
        )  # fmt: skip

    def _model_params(self) -> float:
        """The whole model's parameters (tp = 1 figures; the tied embedding once)."""
        one = self.cal["segments"].get("1")
        if one is not None:
            s = next(iter(one["segments"].values()))
            prm = np.asarray(s["params"], dtype=np.float64)
            if self.dims.tied:
                return float(prm.sum() - self.dims.vocab * self.dims.hidden)
            return float(prm.sum())
        raise ValueError("CpuHybridModel: the hybrid calibration has no tp = 1 segment figures")

    def _kept_without_recompute(self, lay: HybridLayout) -> float | None:
        """One block's saved bytes per microbatch without recomputation (what recomputing
        it in the backward holds at once), when calibrated."""
        by_tp = self.cal["segments"].get(str(lay.tp), {}).get("segments", {})
        s = by_tp.get(f"{lay.microbatch_size}/none")
        return None if s is None else float(s["kept"][1])


def predicted_run(plan: Any, graph: CompGraph, cluster: Cluster) -> dict[str, Any] | None:
    """What the calibrated model predicts for executing hybrid ``plan`` on ``cluster``:
    ``{"step_time": s, "peak_memory": [bytes per rank]}`` (each rank its stage's figure),
    or None when the plan has no layout or the cluster no hybrid calibration. Used by
    ``runners.execute`` to report predicted beside measured."""
    from placement_env.oracles.simulator import Simulator

    lay = getattr(plan, "layout", None)
    if lay is None or not cluster.meta.get("hybrid_calibration"):
        return None
    res = Simulator(graph, cluster).evaluate(plan)
    per_stage = res.breakdown["memory_per_rank"]
    return {
        "step_time": float(res.step_time),
        "peak_memory": [float(per_stage[lay.coords(r)[0]]) for r in range(lay.world_size)],
        "model": "CpuHybridModel",
    }


__all__ = [
    "CpuHybridModel",
    "UncalibratedLayoutError",
    "collective_cost",
    "predicted_run",
    "speed_at",
]
