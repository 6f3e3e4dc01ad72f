"""alpa: Alpa-style hybrid planner -- an inter-op split of the layers into pipeline stages for each intra-op choice."""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.baselines.common import InfeasiblePlanError, check_flag, fmt_bytes
from agents.baselines.megatron_grid import (
    LayoutScorer,
    empty_grid_error,
    finish_hybrid,
    hybrid_arguments,
)
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import (
    GRID_MICROBATCH_SIZES,
    RECOMPUTE,
    ZERO_STAGES,
    HybridLayout,
    check_grid_axes,
    divisors,
    layout_grid,
    submesh_tps,
)
from graphs.plan import Plan
from placement_env.oracles.base import Oracle
from placement_env.oracles.hybrid import HybridModel


def split_layers(
    layers: int, stages: int, layer: float, first: float, last: float
) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges of ``layers`` layers in ``stages`` non-empty stages minimising the
    largest stage time, a stage of ``k`` layers costing ``k * layer`` plus ``first`` (the
    first stage) and ``last`` (the last stage).

    This is Alpa's inter-op objective (Zheng et al. OSDI'22, eq. 2: ``sum_i t_i + (m - 1)
    max_i t_i``) for one submesh shape: the sum is the same for every split, so the
    optimum minimises the maximum. Exact: binary search over the candidate maxima
    ``k * layer + {0, first, last, first + last}`` with a greedy feasibility check.
    """
    if not 1 <= stages <= layers:
        raise ValueError(f"split_layers: cannot split {layers} layers into {stages} stages")

    def fits(tmax: float) -> tuple[tuple[int, int], ...] | None:
        # fill stages greedily from the last one backwards, leaving >= 1 layer per stage
        out = []
        stop = layers
        for s in range(stages - 1, -1, -1):
            extra = (first if s == 0 else 0.0) + (last if s == stages - 1 else 0.0)
            if s == 0:
                k = stop
            else:
                k = int(np.floor((tmax - extra) / layer + 1e-9)) if layer > 0 else stop - s
                k = min(k, stop - s)
            if k < 1 or k * layer + extra > tmax * (1 + 1e-12):
                return None
            out.append((stop - k, stop))
            stop -= k
        return tuple(reversed(out))

    cands = sorted(
        {k * layer + e for k in range(1, layers + 1) for e in (0.0, first, last, first + last)}
    )
    lo = bisect.bisect_left(cands, max(first, last))
    hi = len(cands) - 1
    best = fits(cands[hi]) or fits(layers * layer + first + last)
    while lo <= hi:
        mid = (lo + hi) // 2
        r = fits(cands[mid])
        if r is None:
            lo = mid + 1
        else:
            best, hi = r, mid - 1
    assert best is not None
    return best


def submesh_sizes(num_devices: int, gpus_per_node: int) -> tuple[int, tuple[int, ...]]:
    """``(unit, sizes)``: the submesh sizes of the inter-op DP, in units of ``unit`` GPUs.

    Alpa's shapes (Zheng et al. OSDI'22, section 5.2) are ``(1, 2^k)`` inside one node and
    ``(n, M)`` whole nodes. On one node (or a cluster that is not whole nodes) the unit is one
    GPU and the sizes are the powers of two and the divisors of the GPU count; on several
    nodes the unit is a node and the sizes are the powers of two and the divisors of the
    node count (so every even split of the nodes is among them; a stage of part of a node
    would leave the rest of that node to another stage, whose rings then cross nodes)."""
    M = max(int(gpus_per_node), 1)
    if num_devices <= M or num_devices % M:
        unit, count = 1, num_devices
    else:
        unit, count = M, num_devices // M
    sizes = set(divisors(count))
    k = 1
    while k <= count:
        sizes.add(k)
        k *= 2
    return unit, tuple(sorted(sizes))


class _MeshOptions:
    """The stage choices of one (microbatch, SP, ZeRO) setting: for each ``(size, dp, tp,
    recompute, zero)`` (``recompute`` among ``recomputes``, ``zero`` among ``zeros``; default
    the template's) its :class:`StageProfile` and the most layers it can hold in memory as
    the last, a middle or the first stage of a 1F1B pipeline. ``opts[i]`` is ``(size, dp,
    tp, profile, recompute, zero)``."""

    def __init__(
        self,
        model: HybridModel,
        template: HybridLayout,
        unit: int,
        sizes: Sequence[int],
        max_tp: int,
        cap: float,
        recomputes: Sequence[str] | None = None,
        zeros: Sequence[int] | None = None,
        costs: Any = None,
    ) -> None:
        d = model.dims
        g = template.dp * template.microbatch_size  # samples per pipeline microbatch
        self.m = template.num_microbatches
        self.L = d.layers
        self.cap = cap
        tmpls = []
        for rc in recomputes or (template.recompute,):
            for z in zeros or (template.zero,):
                t = template.to_dict()
                t.pop("stage_recompute", None)
                t.pop("stage_zero", None)
                t.update(recompute=rc, zero=z)
                tmpls.append((rc, z, HybridLayout.from_dict(t)))
        opts = []
        self.queries = 0  # calibrated cost lookups answered (each counted as an oracle call)
        for size in sizes:
            n = size * unit
            for tp in submesh_tps(n, g, heads=d.heads, kv_heads=d.kv_heads, max_tp=max_tp):
                dp = n // tp
                for rc, z, tm in tmpls:
                    c = None if costs is None else costs.segment_costs(tp, g // dp, rc)
                    if costs is not None and c is None:  # uncalibrated: no option, no call
                        continue
                    prof = model.stage_profile(tm, dp, tp, g // dp)
                    if c is not None:  # seconds from the calibrated segments
                        self.queries += 1
                        prof.layer, prof.first, prof.last = c["layer"], c["first"], c["last"]
                    opts.append((size, dp, tp, prof, rc, z))
        self.opts = opts
        self.n = np.array([o[0] for o in opts], dtype=np.int64)
        self.layer = np.array([o[3].layer for o in opts])
        self.first = np.array([o[3].first for o in opts])
        self.last = np.array([o[3].last for o in opts])
        self._kmem: dict[tuple[int, int, int], np.ndarray] = {}

    def kmem(self, r: int, P: int) -> np.ndarray:
        """Most layers (0: none fits) each option holds in memory as rank ``r`` of ``P``."""
        m = self.m
        f = min(P - r, m)
        key = (r == 0, r == P - 1, f)
        if key not in self._kmem:
            self._kmem[key] = np.array(
                [o[3].most_layers(r, P, m, self.cap, self.L) for o in self.opts], dtype=np.int64
            )
        return self._kmem[key]

    def fit(self, T: float, r: int, P: int) -> np.ndarray:
        """Most layers each option holds as rank ``r`` of ``P`` within ``T`` seconds per
        microbatch and the memory cap (< 1: the option cannot be that stage)."""
        ends = (self.first if r == 0 else 0.0) + (self.last if r == P - 1 else 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.floor((T - ends) / self.layer * (1 + 1e-12))
        k = np.where(np.isfinite(k), k, self.L)
        return np.minimum(np.clip(k, 0, self.L).astype(np.int64), self.kmem(r, P))


_NEG = -(10**9)


def _interop_dp(mo: _MeshOptions, U: int, T: float, P_max: int) -> tuple[np.ndarray, list]:
    """Alpa's inter-op DP for one stage-time bound ``T``, built from the last stage back:
    ``G_j[u]`` is the most layers ``j + 1`` stages (the last ``j + 1`` of the pipeline)
    hold on exactly ``u`` units of devices, each within ``T`` and memory. Returns
    ``(cover, args)``: ``cover[P]`` the most layers a ``P``-stage pipeline on all ``U``
    units holds (>= the model's layers: feasible), and what reconstruction needs."""
    n = mo.n
    idx = np.arange(U + 1)[None, :] - n[:, None]
    ok = idx >= 0
    idxc = np.clip(idx, 0, U)
    cover = np.full(P_max + 1, _NEG, dtype=np.int64)
    G = np.full(U + 1, _NEG, dtype=np.int64)
    k_last = mo.fit(T, 1, 2)
    for i in np.flatnonzero(k_last >= 1):
        G[n[i]] = max(G[n[i]], k_last[i])
    args: list = [None]  # args[j][u]: the option of the j-th stage from the end
    for j in range(1, P_max):
        P = j + 1
        prev = np.where(ok, G[idxc], _NEG)
        # the first stage closes a pipeline of P stages on all U units
        kf = mo.fit(T, 0, P)
        cl = np.where((kf >= 1) & ok[:, U], prev[:, U] + kf, _NEG)
        cover[P] = int(cl.max()) if len(cl) else _NEG
        first_arg = int(cl.argmax()) if len(cl) else -1
        # a middle stage (rank 1 of P + 1: j stages after it, not the first)
        km = mo.fit(T, 1, j + 2)
        vals = np.where(ok & (km[:, None] >= 1), prev + km[:, None], _NEG)
        vals = np.maximum(vals, _NEG)
        arg = vals.argmax(0)
        args.append((arg, first_arg))
        G = vals[arg, np.arange(U + 1)]
        if G.max() <= _NEG // 2 and cover[P] <= _NEG // 2:
            break
    return cover, args


def _reconstruct(mo: _MeshOptions, U: int, T: float, P: int, args: list) -> list[tuple[int, int]]:
    """Options and layer capacities of the ``P`` stages (first to last) of :func:`_interop_dp`."""
    j = P - 1
    first = args[j][1]
    out = [(first, int(mo.fit(T, 0, P)[first]))]
    u = U - int(mo.n[first])
    for jj in range(j - 1, 0, -1):  # the middle stages, jj stages before the end
        i = int(args[jj][0][u])
        out.append((i, int(mo.fit(T, 1, jj + 2)[i])))
        u -= int(mo.n[i])
    k_last = mo.fit(T, 1, 2)
    cand = [i for i in range(len(mo.opts)) if mo.n[i] == u and k_last[i] >= 1]
    last = max(cand, key=lambda i: k_last[i])
    out.append((last, int(k_last[last])))
    return out


def _trim(mo: _MeshOptions, stages: list[tuple[int, int]], L: int) -> list[int]:
    """Layer counts of the stages (capacities ``stages[i][1]``) summing to ``L``: take a layer
    from the slowest stage holding more than one until they do (keeps every stage within
    the DP's bound and balances the rest)."""
    ks = [k for _, k in stages]
    P = len(ks)
    heap = []
    for r, (i, k) in enumerate(stages):
        prof = mo.opts[i][3]
        heapq.heappush(heap, (-prof.seconds(k, r == 0, r == P - 1), r))
    excess = sum(ks) - L
    while excess > 0:
        _, r = heapq.heappop(heap)
        if ks[r] <= 1:
            continue
        ks[r] -= 1
        excess -= 1
        prof = mo.opts[stages[r][0]][3]
        heapq.heappush(heap, (-prof.seconds(ks[r], r == 0, r == P - 1), r))
    return ks


def submesh_layouts(
    model: HybridModel,
    template: HybridLayout,
    *,
    max_tp: int,
    gpus_per_node: int,
    keep: int = 2,
    recomputes: Sequence[str] | None = None,
    zeros: Sequence[int] | None = None,
    costs: Any = None,
    counter: list[int] | None = None,
) -> list[tuple[float, HybridLayout]]:
    """Alpa's inter-op pass with a submesh per stage, for the intra-op setting of
    ``template`` (its microbatch of ``dp * microbatch_size`` samples, recomputation, SP,
    ZeRO): every pipeline depth ``P >= 2``, stages on submeshes of :func:`submesh_sizes`,
    each with its own ``dp x tp`` (``tp <= max_tp`` dividing the heads, ``dp`` dividing the
    microbatch) and, with ``recomputes``, its own recomputation mode among them (Aceso's
    per-stage recomputation; default: the template's for every stage) and, with ``zeros``,
    its own ZeRO stage among them (over the stage's own DP group). For a bound ``T``
    on a stage's per-microbatch seconds, :func:`_interop_dp` finds for every ``P`` whether
    the layers fit on all the devices within ``T`` and memory (:meth:`StageProfile.memory`);
    the least such ``T`` per ``P`` is bracketed on a geometric grid and bisected (10 steps)
    for the four most promising depths, whose layouts get Alpa's estimate ``sum_i t_i +
    (m - 1) max_i t_i`` (eq. 2). Returns the ``keep`` best ``(estimate, layout)`` pairs,
    best first.

    ``costs``: a model with ``segment_costs(tp, microbatch_size, recompute)`` (the
    calibrated :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel`) whose per-stage
    seconds replace the roofline's (memory stays ``model``'s); options it has no figures
    for are left out, and each lookup it answers is added to ``counter[0]``."""
    cl = model.cluster
    D = cl.num_devices
    unit, sizes = submesh_sizes(D, gpus_per_node)
    U = D // unit
    cap = float(model.device.memory)
    mo = _MeshOptions(model, template, unit, sizes, max_tp, cap, recomputes, zeros, costs)
    if counter is not None:
        counter[0] += mo.queries
    L, m = mo.L, mo.m
    P_max = min(L, U)
    if not mo.opts or P_max < 2:
        return []
    work = mo.layer * mo.n
    T_lo = float(L * work.min() / U)
    T_hi = float(L * mo.layer.max() + mo.first.max() + mo.last.max())
    grid = np.geomspace(max(T_lo, 1e-12), T_hi, 40)
    lo = np.full(P_max + 1, np.nan)
    hi = np.full(P_max + 1, np.nan)
    prev = 0.0
    for T in grid:
        cover, _ = _interop_dp(mo, U, float(T), P_max)
        new = (cover >= L) & np.isnan(hi)
        hi[new] = T
        lo[new] = prev
        prev = float(T)
        if not np.isnan(hi[2:]).any():
            break
    feas = [P for P in range(2, P_max + 1) if not np.isnan(hi[P])]
    if not feas:
        return []
    # most promising depths first (Alpa's estimate at the bracket's top), then bisect
    feas.sort(key=lambda P: (m + P - 1) * hi[P])
    out = []
    for P in feas[:4]:
        a, b = float(lo[P]), float(hi[P])
        args = None  # the DP's choices at b, the least feasible bound so far
        for _ in range(10):
            mid = (a + b) / 2
            cover, found = _interop_dp(mo, U, mid, P)
            if cover[P] >= L:
                b, args = mid, found
            else:
                a = mid
        if args is None:  # no bisection step was feasible: the grid's bracket top
            args = _interop_dp(mo, U, b, P)[1]
        stages = _reconstruct(mo, U, b, P, args)
        ks = _trim(mo, stages, L)
        secs = [
            mo.opts[i][3].seconds(k, r == 0, r == P - 1)
            for r, ((i, _), k) in enumerate(zip(stages, ks))
        ]
        est = sum(secs) + (m - 1) * max(secs)
        out.append((est, _stage_layout(template, [mo.opts[i] for i, _ in stages], ks)))
    out.sort(key=lambda x: x[0])
    return out[:keep]


def _stage_layout(template: HybridLayout, opts: list, ks: list[int]) -> HybridLayout:
    """The layout of a stage assignment: the first stage's mesh as ``dp``/``tp``, its
    recomputation as ``recompute`` and its ZeRO stage as ``zero``; ``stage_meshes`` /
    ``stage_recompute`` / ``stage_zero`` only where the stages differ."""
    meshes = [(o[1], o[2]) for o in opts]
    rcs = [o[4] for o in opts]
    zs = [o[5] for o in opts]
    g = template.dp * template.microbatch_size
    bounds = np.cumsum([0] + list(ks))
    d = template.to_dict()
    d.update(
        dp=meshes[0][0],
        tp=meshes[0][1],
        pp=len(ks),
        microbatch_size=g // meshes[0][0],
        virtual_stages=1,
        schedule="1f1b",
        stage_layers=[[int(bounds[i]), int(bounds[i + 1])] for i in range(len(ks))],
        sequence_parallel=template.sequence_parallel and max(t for _, t in meshes) > 1,
        recompute=rcs[0],
        zero=zs[0],
    )
    d.pop("stage_meshes", None)
    d.pop("stage_recompute", None)
    d.pop("stage_zero", None)
    if len(set(meshes)) > 1:
        d["stage_meshes"] = [list(mm) for mm in meshes]
    if len(set(rcs)) > 1:
        d["stage_recompute"] = rcs
    if len(set(zs)) > 1:
        d["stage_zero"] = zs
    return HybridLayout.from_dict(d)


def alpa(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    microbatch_sizes: Sequence[int] = GRID_MICROBATCH_SIZES,
    recompute: Sequence[str] = RECOMPUTE,
    zero: Sequence[int] = ZERO_STAGES,
    sequence_parallel: Sequence[bool] = (False, True),
    max_tp: int | None = None,
    submeshes: bool = True,
    submesh_settings: int = 4,
    stage_recompute: bool = True,
    stage_zero: bool = False,
) -> Plan:
    """Alpa-style planner over hybrid layouts (Zheng et al. OSDI'22).

    Two passes, every candidate scored by the oracle:

    1. Same submesh for every stage: for every intra-op choice (``tp`` and ``dp`` of the
       stage submesh, microbatch size, recomputation, SP, ZeRO) and pipeline depth ``pp``
       of :func:`graphs.layout.layout_grid` (``v = 1``), the per-layer and end-stage costs
       of that choice (:meth:`HybridModel.stage_costs`) feed the inter-op split
       :func:`split_layers`; the split layout (and the balanced one, if the split one
       does not fit) is scored.
    2. A submesh per stage (``submeshes=True``): for the ``submesh_settings`` best
       (microbatch, recomputation, SP, ZeRO) settings of pass 1, Alpa's inter-op DP over
       layer ranges x submesh shapes with the ``dp x tp`` choice per stage
       (:func:`submesh_layouts`, memory per stage in the DP); its layouts
       (``HybridLayout.stage_meshes``) are scored. With ``stage_recompute`` (default) each
       stage also picks its recomputation mode among ``recompute`` in the same DP (Aceso's
       per-stage recomputation, ``HybridLayout.stage_recompute``), and settings that differ
       only in recomputation are passed once. With ``stage_zero`` (off by default, so the
       default search is unchanged) each stage likewise picks its ZeRO stage among ``zero``
       (``HybridLayout.stage_zero``), and settings that differ only in ZeRO are passed once.

    Differences from Alpa: the intra-op space is Megatron's (column/row TP, SP, ZeRO, a
    recomputation mode per stage) rather than an ILP over every operator's sharding,
    and submesh sizes are powers of two and divisors of the GPU count on one node, of the
    node count beyond (:func:`submesh_sizes`).
    ``budget`` caps oracle calls, cost-model queries included (each counted as a call;
    a calibrated model's lookups for one submesh setting of pass 2 are made together and
    may pass it).
    """
    t0 = time.perf_counter()
    score = LayoutScorer(oracle)
    model = HybridModel(graph, cluster)
    # the per-layer costs of both passes from the oracle's own step model where it has one
    # (the calibrated CPU model on a hybrid-calibrated cpu_N); pass 2's memory per stage
    # from the roofline model's closed form
    costs = oracle.hybrid_model() if hasattr(oracle, "hybrid_model") else model
    calibrated = costs if hasattr(costs, "segment_costs") else None
    gb, budget = hybrid_arguments("alpa", graph, global_batch, budget)
    microbatch_sizes, recompute, zero, sequence_parallel, max_tp = check_grid_axes(
        "alpa", microbatch_sizes=microbatch_sizes, recompute=recompute, zero=zero,
        sequence_parallel=sequence_parallel, max_tp=max_tp,
    ).values()  # fmt: skip
    check_flag("alpa", "submeshes", submeshes)
    if (
        not isinstance(submesh_settings, int)
        or isinstance(submesh_settings, bool)
        or submesh_settings < 0
    ):
        raise ValueError(
            f"alpa: submesh_settings must be an integer >= 0, got {submesh_settings!r}"
        )
    for name, flag in (("stage_recompute", stage_recompute), ("stage_zero", stage_zero)):
        check_flag("alpa", name, flag)
    best: HybridLayout | None = None
    best_res, calls, least = None, 0, float("inf")
    D = cluster.num_devices
    gpn = int(cluster.meta.get("gpus_per_node", min(D, 8)))
    mtp = gpn if max_tp is None else int(max_tp)
    space = layout_grid(
        graph,
        cluster,
        global_batch=gb,
        microbatch_sizes=microbatch_sizes,
        virtual_stages=(1,),
        recompute=recompute,
        zero=zero,
        sequence_parallel=sequence_parallel,
        max_tp=max_tp,
    )
    settings: dict[tuple, tuple[float, HybridLayout]] = {}

    def consider(cand: HybridLayout) -> bool:
        nonlocal best, best_res, calls, least
        r = score(cand)
        if r is None:  # not calibrated: skipped, no call
            return False
        calls += 1
        if r.oom:
            least = min(least, float(r.peak_memory.max()))
            return False
        key = (cand.dp * cand.microbatch_size, cand.recompute, cand.sequence_parallel, cand.zero)
        if key not in settings or r.step_time < settings[key][0]:
            settings[key] = (float(r.step_time), cand)
        if best_res is None or r.step_time < best_res.step_time:
            best, best_res = cand, r
        return True

    def left() -> float:  # oracle calls left in the budget
        return float("inf") if budget is None else budget - calls

    for lay in space:
        if left() < 1:
            break
        tries = [lay]
        c = None
        if lay.pp > 1 and left() >= 2:  # the query and at least one layout scored
            try:
                c = costs.stage_costs(lay)
                calls += 1  # a cost-model query, counted like an evaluation
            except ValueError:  # a shape the calibrated model lacks: the balanced split,
                c = None  # and no call, as the oracle counts none for a refused layout
        if lay.pp > 1 and c is not None:
            split = split_layers(lay.num_layers, lay.pp, c["layer"], c["first"], c["last"])
            if split != lay.stage_layers:
                tries.insert(0, _with_stages(lay, split))
        for cand in tries:
            if left() < 1 or consider(cand):
                break
    hetero = per_stage_rc = per_stage_z = 0
    if submeshes and submesh_settings:
        ranked = sorted(settings.values(), key=lambda x: x[0])
        if stage_recompute or stage_zero:  # settings differing only in what the DP picks
            seen: set[tuple] = set()
            uniq = []
            for item in ranked:
                t = item[1]
                k = (
                    t.dp * t.microbatch_size,
                    t.sequence_parallel,
                    None if stage_recompute else t.recompute,
                    None if stage_zero else t.zero,
                )
                if k not in seen:
                    seen.add(k)
                    uniq.append(item)
            ranked = uniq
        rcs = tuple(recompute) if stage_recompute else None
        zs = tuple(zero) if stage_zero else None
        for _, template in ranked[:submesh_settings]:
            if left() < 1:
                break
            lookups = [0]
            found = submesh_layouts(
                model, template, max_tp=mtp, gpus_per_node=gpn, recomputes=rcs, zeros=zs,
                costs=calibrated, counter=lookups,
            )  # fmt: skip
            calls += lookups[0]
            for _, cand in found:
                if left() < 1:
                    break
                hetero += bool(cand.stage_meshes)
                per_stage_rc += bool(cand.stage_recompute)
                per_stage_z += bool(cand.stage_zero)
                consider(cand)
    if best is None:
        score.check_any_scored("alpa", graph, cluster)
        if calls == 0:
            raise empty_grid_error(
                "alpa", graph, cluster, gb, microbatch_sizes=microbatch_sizes, max_tp=max_tp
            )
        raise InfeasiblePlanError(
            f"alpa: no layout of {graph.meta.get('name', '?')!r} fits on {cluster.name!r} "
            f"(least peak memory {fmt_bytes(least)}){score.why()}"
        )
    return finish_hybrid(
        graph, cluster, best, best_res, "alpa", calls, t0, submesh_layouts_scored=hetero,
        stage_recompute_layouts_scored=per_stage_rc,
        **({"stage_zero_layouts_scored": per_stage_z} if stage_zero else {}),
        **score.meta(),
    )  # fmt: skip


def _with_stages(lay: HybridLayout, stages: tuple[tuple[int, int], ...]) -> HybridLayout:
    d = lay.to_dict()
    d["stage_layers"] = [list(r) for r in stages]
    return HybridLayout.from_dict(d)


__all__ = ["alpa", "split_layers", "submesh_layouts", "submesh_sizes"]
