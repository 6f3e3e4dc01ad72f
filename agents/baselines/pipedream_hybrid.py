"""`pipedream`: PipeDream's partitioning DP with replicated stages, on hybrid plans.

PipeDream (Narayanan et al., SOSP 2019, section 3.1) splits a model's layers into
contiguous pipeline stages and lets a stage run as ``r`` data-parallel *replicas*; its
dynamic program picks the split and the replication that minimise the slowest stage:

    A(i -> j, m) = min( T(i -> j, m),
                        min_{i <= s < j, 1 <= m' < m} max(A(i -> s, m - m'), 2 a_s / B, T(s+1 -> j, m')) )
    T(i -> j, m) = (1 / m) * max( sum_l compute_l, 2 (m - 1) sum_l |w_l| / B )

(``a_s``: the activation sent at the boundary after layer ``s``, ``w_l``: layer ``l``'s
weights, ``B``: the bandwidth joining the machines). An operator placement cannot
express a replicated stage (each node sits on one device), which is why the
op-placement ``chain_dp`` (alias ``pipedream_dp``) is the replication-free special case;
a :class:`~graphs.layout.HybridLayout` with a submesh per stage (``stage_meshes``) can,
so this planner is PipeDream's DP proper, for the layered transformers of the hybrid
envs, every stage a ``dp_p x 1`` submesh (no tensor parallelism, ZeRO 0: PipeDream's
space).

**Adapted to a synchronous 1F1B pipeline** (PipeDream-Flush, Narayanan et al., ICML
2021), which is what the simulator and the runtime execute: a step is ``M`` microbatches
of ``g`` samples, a stage's ``r`` replicas share each microbatch (``g / r`` samples each;
the ``1 / m`` of ``T``), and the gradient all-reduce of its weights happens once per step,
so per microbatch it costs ``1 / M`` of one all-reduce. Per microbatch, a stage of ``k``
layers on ``r`` GPUs costs

    max( forward + backward of its k layers (and the embedding / head on the end stages)
             for g / r samples  [HybridModel's roofline, StageProfile.seconds],
         all-reduce of its gradients over its r GPUs / M  [Topology.allreduce],
         2 x p2p of its output hidden state to the next stage  [Topology.p2p; not the last] )

and the DP minimises the largest such cost (PipeDream's objective, the steady-state time
per microbatch). Since the pipeline flushes, a ``P``-stage plan of bottleneck ``t`` takes
about ``(M + P - 1) t``; the DP solves every depth ``P`` at once and the most promising
depths of every setting are scored by the oracle.

**Memory**, which PipeDream's DP leaves out, is a constraint here, so every plan
returned fits: a stage of rank ``r`` of a ``P``-stage 1F1B pipeline keeps ``min(P - r,
M)`` microbatches in flight (:meth:`~placement_env.oracles.hybrid.StageProfile.memory`),
so the DP runs from the last stage back with the number of stages after a stage in its
state: ``F[q][j][u]`` = the least bottleneck of layers ``j..L-1`` as exactly ``q``
stages on the last ``u`` device units, each within memory. Settings searched: the
samples per microbatch ``g`` (a multiple of the unit that divides the global batch) and
the recomputation mode (none / selective / full: PipeDream-2BW's planner weighs
recomputation too). Device units are GPUs on one node and whole nodes on several
(:func:`agents.baselines.alpa.submesh_sizes`); a stage's size must divide ``g``. PipeDream's
DP is hierarchical: at the upper level a stage's replica may itself be a pipeline over the
GPUs of a node (``A^{k-1}`` inside ``T^k``); a layout's stage is one data-parallel group of
GPUs, so that nesting is neither expressed nor searched here -- one level, in those units.
:func:`replicated_split` is the DP on precomputed costs (tested against brute force).

On a hybrid-calibrated ``cpu_N`` (the oracle's ``hybrid_model()`` has ``segment_costs``) a
stage's compute comes from the calibrated segments of its ``(tp = 1, samples per replica,
recompute)``, as ``alpa``'s submesh DP takes it, and replica counts the calibration lacks are
not offered; each lookup answered counts as an oracle call. Memory stays the roofline's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agents.baselines.alpa import _stage_layout, submesh_sizes
from agents.baselines.common import InfeasiblePlanError, fmt_bytes
from agents.baselines.megatron_grid import LayoutScorer, finish_hybrid, hybrid_arguments
from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.layout import RECOMPUTE, HybridLayout, check_axis, check_grid_axes
from graphs.plan import Plan
from graphs.schema import is_whole
from placement_env.oracles.base import Oracle
from placement_env.oracles.hybrid import HybridModel

#: Stage ends: a middle stage, the first (embedding), the last (head and loss), the only one.
MID, FIRST, LAST, ONLY = 0, 1, 2, 3

#: Samples per pipeline microbatch tried, in device units (``g = unit * x``).
DEFAULT_SAMPLES = (1, 2, 4, 8, 16, 32)


def replicated_split(
    L: int,
    U: int,
    sizes: Sequence[int],
    cost: Callable[[int, int, int, int], float],
    kmax: Callable[[int, int, int], int],
    max_stages: int | None = None,
) -> tuple[np.ndarray, Callable[[int], list[tuple[int, int]]]]:
    """PipeDream's DP with memory, from the last stage back, on precomputed costs.

    ``L`` layers, ``U`` device units; a stage takes ``k >= 1`` consecutive layers on ``s``
    units (``s`` in ``sizes``), all ``U`` units used. ``cost(k, s, end, off)``: its time
    per microbatch (``end`` one of :data:`MID`, :data:`FIRST`, :data:`LAST`, :data:`ONLY`;
    ``off`` its first unit, counted from the first stage's); ``kmax(s, end, q)``: the most
    layers it holds in memory with ``q`` stages from it to the last (itself included).

    Returns ``(best, stages)``: ``best[P]`` the least bottleneck (the largest stage cost)
    of a ``P``-stage split (``inf``: none fits), and ``stages(P)`` that split as ``[(k,
    s), ...]`` from the first stage. Exact for this objective (tests compare it with
    brute force over every split and every size sequence)."""
    Q = min(L, U) if max_stages is None else min(int(max_stages), L, U)
    sizes = sorted({int(s) for s in sizes if 1 <= int(s) <= U})
    inf = np.inf
    rows: dict[tuple[int, int, int], np.ndarray] = {}

    def row(k: int, s: int, end: int) -> np.ndarray:
        """cost(k, s, end, off) of a stage on the last u units, for u = s..U."""
        key = (k, s, end)
        if key not in rows:
            rows[key] = np.array([cost(k, s, end, U - u) for u in range(s, U + 1)])
        return rows[key]

    # F[q][j, u]: least bottleneck of layers j..L-1 as q stages on the last u units
    F = [np.full((L + 1, U + 1), inf)]
    ch: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0), np.zeros(0))]
    best = np.full(Q + 1, inf)
    # q = 1: the last stage, layers j..L-1 on all u units (the only stage when j == 0)
    F1 = np.full((L + 1, U + 1), inf)
    for s in sizes:
        off = U - s
        for j in range(L):
            k = L - j
            end = ONLY if j == 0 else LAST
            if k <= kmax(s, end, 1):
                F1[j, s] = cost(k, s, end, off)
    F.append(F1)
    ch.append((np.zeros((L + 1, U + 1), np.int64), np.zeros((L + 1, U + 1), np.int64)))
    best[1] = F1[0, U]
    for q in range(2, Q + 1):
        Fq = np.full((L + 1, U + 1), inf)
        Ck = np.zeros((L + 1, U + 1), np.int64)
        Cs = np.zeros((L + 1, U + 1), np.int64)
        prev = F[q - 1]
        if not np.isfinite(prev).any():
            break
        for s in sizes:
            km = kmax(s, MID, q)
            kf = kmax(s, FIRST, q)
            for k in range(1, L - (q - 1) + 1):
                if k > km and k > kf:
                    break
                # this stage: layers j..j+k-1 on units [U-u, U-u+s); the rest: q-1 stages
                # of layers j+k.. on the last u-s units
                rest = prev[k : L + 1, : U + 1 - s]  # rows j = 0..L-k, cols u = s..U
                if k <= km:
                    cand = np.maximum(rest, row(k, s, MID)[None, :])
                else:
                    cand = np.full_like(rest, inf)
                cand[0] = np.maximum(rest[0], row(k, s, FIRST)) if k <= kf else inf
                view = Fq[: L + 1 - k, s:]
                better = cand < view
                if better.any():
                    view[better] = cand[better]
                    Ck[: L + 1 - k, s:][better] = k
                    Cs[: L + 1 - k, s:][better] = s
        F.append(Fq)
        ch.append((Ck, Cs))
        best[q] = Fq[0, U]

    def stages(P: int) -> list[tuple[int, int]]:
        if not 1 <= P < len(F) or not np.isfinite(F[P][0, U]):
            raise ValueError(f"replicated_split: no {P}-stage split fits")
        out, j, u = [], 0, U
        for q in range(P, 1, -1):
            k, s = int(ch[q][0][j, u]), int(ch[q][1][j, u])
            out.append((k, s))
            j, u = j + k, u - s
        out.append((L - j, u))
        return out

    return best, stages


class _Costs:
    """The stage costs and memory limits of one setting (samples per microbatch ``g``,
    recomputation ``rc``) for :func:`replicated_split`."""

    def __init__(
        self,
        model: HybridModel,
        gb: int,
        g: int,
        rc: str,
        unit: int,
        sizes: Sequence[int],
        calibrated: Any = None,
    ) -> None:
        d = model.dims
        self.model, self.unit, self.g = model, unit, g
        self.L = d.layers
        self.m = gb // g
        self.template = HybridLayout(
            dp=1, tp=1, pp=1, microbatch_size=g, global_batch=gb, recompute=rc,
            stage_layers=((0, d.layers),),
        )  # fmt: skip
        self.cap = float(model.device.memory)
        topo = model.topo
        D = model.cluster.num_devices
        self.prof = {}
        # (s, off) -> (seconds at 0 bytes, seconds per byte) of the all-reduce: the ring and
        # hierarchical times are affine in the bytes, so two calls give every stage's
        self.sync = {}
        self.p2p = {}  # (s, off) -> seconds of the 2 p2p's to the next stage (inf: none)
        self.queries = 0  # calibrated segment lookups answered
        for s in sizes:
            r = s * unit
            seg = None if calibrated is None else calibrated.segment_costs(1, g // r, rc)
            if calibrated is not None and seg is None:
                continue  # the calibration has no figures for this stage: not offered
            self.prof[s] = model.stage_profile(self.template, r, 1, g // r)
            if seg is not None:  # seconds from the calibrated segments, memory the roofline's
                self.queries += 1
                self.prof[s].layer, self.prof[s].first, self.prof[s].last = (
                    seg["layer"], seg["first"], seg["last"]
                )  # fmt: skip
            hid = self.prof[s].t["sent"]
            for off in range(0, D // unit - s + 1):
                ranks = np.arange(off * unit, (off + s) * unit)
                a1 = topo.allreduce(1e9, ranks)
                a2 = topo.allreduce(2e9, ranks)
                self.sync[s, off] = (a1 - (a2 - a1), (a2 - a1) / 1e9)
                nxt = (off + s) * unit
                self.p2p[s, off] = 2.0 * topo.p2p(hid, nxt - 1, nxt) if nxt < D else np.inf
        self._kmax: dict[tuple[int, int, int], int] = {}

    @staticmethod
    def _ends(end: int) -> tuple[bool, bool]:
        return end in (FIRST, ONLY), end in (LAST, ONLY)

    def cost(self, k: int, s: int, end: int, off: int) -> float:
        prof = self.prof[s]
        first, last = self._ends(end)
        comp = prof.seconds(k, first, last)
        c0, c1 = self.sync[s, off]
        grads = prof.params(k, first, last, 1 if end == ONLY else 2) * self.model.grad_bytes
        sync = (c0 + c1 * grads) / self.m if s * self.unit > 1 else 0.0
        out = 0.0 if last else self.p2p[s, off]
        return max(comp, sync, out)

    def kmax(self, s: int, end: int, q: int) -> int:
        """Most layers a stage on ``s`` units holds with ``q`` stages from it to the last."""
        f = min(q, self.m)
        key = (s, end, f)
        if key not in self._kmax:
            first, last = self._ends(end)
            # rank r of P with P - r = q stages from this one on (first: r = 0)
            r, P = (0, q) if first else (1, q + 1)
            self._kmax[key] = self.prof[s].most_layers(r, P, self.m, self.cap, self.L)
        return self._kmax[key]


def pipedream(
    graph: CompGraph,
    cluster: Cluster,
    oracle: Oracle,
    budget: int | None = None,
    /,
    *,
    global_batch: int | None = None,
    samples: Sequence[int] = DEFAULT_SAMPLES,
    recompute: Sequence[str] = RECOMPUTE,
    depths: int = 2,
) -> Plan:
    """PipeDream's DP with replicated stages (module docstring), scored by ``oracle``.

    For every setting -- ``g = unit * x`` samples per microbatch (``x`` in ``samples``, ``g``
    dividing ``global_batch``) and recomputation mode in ``recompute`` -- the DP gives the
    least bottleneck of every pipeline depth; the ``depths`` depths of least ``(M + P - 1)
    x bottleneck`` are scored and the fastest memory-feasible layout is returned (stage
    ``p`` on a ``dp_p x 1`` submesh, ``HybridLayout.stage_meshes`` where the stages
    differ). ``budget`` caps the oracle calls. Raises :class:`InfeasiblePlanError` when no
    stage of even one layer fits a GPU's memory (PipeDream has no tensor parallelism or
    ZeRO to shrink one) or no scored layout fits."""
    t0 = time.perf_counter()
    score = LayoutScorer(oracle)
    gb, budget = hybrid_arguments("pipedream", graph, global_batch, budget)
    if not isinstance(depths, int) or isinstance(depths, bool) or depths < 1:
        raise ValueError(f"pipedream: depths must be an integer >= 1, got {depths!r}")
    samples = tuple(
        int(x)
        for x in check_axis(
            "pipedream", "samples", samples, lambda x: is_whole(x, 1), "integers >= 1"
        )
    )
    (recompute,) = check_grid_axes("pipedream", recompute=recompute).values()
    model = HybridModel(graph, cluster)
    # on a calibrated cpu_N the stage seconds come from the oracle's own calibrated segments
    # (as alpa's submesh DP takes them), the memory from the roofline's closed form
    costs = oracle.hybrid_model() if hasattr(oracle, "hybrid_model") else model
    calibrated = costs if hasattr(costs, "segment_costs") else None
    lookups = 0
    D = cluster.num_devices
    gpn = int(cluster.meta.get("gpus_per_node", min(D, 8)))
    unit, _ = submesh_sizes(D, gpn)
    U = D // unit
    L = model.dims.layers
    cands: list[tuple[float, HybridLayout, dict[str, Any]]] = []
    dp_seconds = 0.0
    settings = 0
    tried: list[int] = []
    for x in sorted({int(v) for v in samples}):
        g = unit * x
        if g > gb or gb % g:
            continue
        tried.append(g)
        sizes = [s for s in range(1, U + 1) if x % s == 0]
        for rc in recompute:
            t1 = time.perf_counter()
            c = _Costs(model, gb, g, rc, unit, sizes, calibrated)
            lookups += c.queries
            best, stages = replicated_split(L, U, list(c.prof), c.cost, c.kmax)
            dp_seconds += time.perf_counter() - t1
            settings += 1
            P_ok = [P for P in range(1, len(best)) if np.isfinite(best[P])]
            P_ok.sort(key=lambda P: (c.m + P - 1) * best[P])
            for P in P_ok[:depths]:
                split = stages(P)
                opts = [(s, s * unit, 1, None, rc, 0) for _, s in split]
                lay = _stage_layout(c.template, opts, [k for k, _ in split])
                est = (c.m + P - 1) * float(best[P])
                cands.append(
                    (est, lay, {"g": g, "recompute": rc, "P": P, "bottleneck": float(best[P])})
                )
    if not tried:
        raise ValueError(
            f"pipedream: no samples-per-microbatch setting divides the global batch {gb}: "
            f"tried {[unit * x for x in sorted(set(samples))]} (a device unit is {unit} GPU(s))"
        )
    if not cands:
        raise InfeasiblePlanError(
            f"pipedream: no split of {graph.meta.get('name', '?')!r} on {cluster.name!r} fits: "
            f"with no tensor parallelism or ZeRO, not even one layer's weights, gradients, "
            f"optimizer state and activations fit a GPU's {fmt_bytes(float(model.device.memory))} "
            f"(samples per microbatch tried: {tried}, recompute {list(recompute)})"
        )
    cands.sort(key=lambda x: x[0])
    best_lay, best_res, calls, least, info = None, None, lookups, float("inf"), {}
    for est, lay, why in cands:
        if budget is not None and calls >= budget:
            break
        r = score(lay)
        if r is None:
            continue
        calls += 1
        if r.oom:
            least = min(least, float(r.peak_memory.max()))
            continue
        if best_res is None or r.step_time < best_res.step_time:
            best_lay, best_res, info = lay, r, {**why, "estimate": est}
    if best_lay is None:
        score.check_any_scored("pipedream", graph, cluster)
        raise InfeasiblePlanError(
            f"pipedream: none of {calls} layouts of {graph.meta.get('name', '?')!r} fits on "
            f"{cluster.name!r} (least peak memory {fmt_bytes(least)}){score.why()}"
        )
    return finish_hybrid(
        graph, cluster, best_lay, best_res, "pipedream", calls, t0,
        dp_seconds=dp_seconds, settings=settings, layouts_found=len(cands),
        dp_bottleneck=info["bottleneck"], dp_estimate=info["estimate"],
        **score.meta(),
    )  # fmt: skip


__all__ = ["pipedream", "replicated_split"]
