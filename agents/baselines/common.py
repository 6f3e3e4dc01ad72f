"""Shared pieces of the baselines: colocation units, the internal cost model, memory fitting, plan finishing."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from graphs.schema import is_number, is_whole
from placement_env.oracles.base import Oracle, SimResult


class InfeasiblePlanError(ValueError):
    """No plan that respects every device's memory (and colocation) was found.

    ``oom`` is False when the reason is not memory: the plan found cannot run at all
    (the oracle's ``infeasible_reason``, e.g. the profiled runtime's ranks failed).
    """

    def __init__(self, message: str, *, oom: bool = True) -> None:
        super().__init__(message)
        self.oom = oom


def fmt_bytes(x: float) -> str:
    """``1536 -> '1.50 KiB'``: a byte count for error messages."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x:g} B"


@dataclass(frozen=True, eq=False)
class Problem:
    """A placement problem seen at the level of colocation units (the graph's groups).

    Under a 1F1B oracle the activation share is per device: device ``chain[k]``
    of the topology-aware chain (:func:`device_chain`) is charged as stage ``k``
    of a ``D``-stage PipeDream-flush pipeline, ``min(M, D - k) / M`` of its
    units' activations (``umem``); exact for contiguous pipelines along the
    chain, and the oracle's own OOM check has the last word for other plans.

    Everything is in the oracle's per-microbatch units: compute times come from
    ``oracle.node_times()`` when the oracle has it (else the roofline rule of the
    simulator, batch quantities divided by ``M``), and transfers move
    ``edge_bytes / M``. Memory is *static memory* = persistent state + the
    activations kept for backward (``param_bytes + act_fraction * act_bytes``,
    see :func:`default_act_fraction`), additive over units; capacities are device memory less a transient reserve
    (the largest per-microbatch node output), so a plan that fits here fits in
    the simulator unless its schedule keeps more than ``act_fraction`` of the
    batch's activations alive.

    Attributes (``U`` units, ``D`` devices, ``n`` nodes, ``E`` unit edges)::

        unit_of     int64[n]     unit index of each node
        node_time   float64[n,D] seconds per node per device (inf = cannot run)
        time        float64[U,D] seconds per unit per device (inf = cannot run)
        mem         float64[U]   static memory bytes of each unit
        capacity    float64[D]   usable bytes per device
        order       int64[U]     units sorted by their first node in a topological order
        usrc, udst  int64[E]     unit-level edges (distinct units), aggregated
        ubytes      float64[E]   bytes per microbatch on each unit edge
        bw, lat     float64[D,D] route bottleneck bandwidth (B/s) and latency (s)
    """

    graph: CompGraph
    cluster: Cluster
    oracle: Oracle
    microbatches: int
    unit_of: np.ndarray
    node_time: np.ndarray
    time: np.ndarray
    mem: np.ndarray
    capacity: np.ndarray
    order: np.ndarray
    usrc: np.ndarray
    udst: np.ndarray
    ubytes: np.ndarray
    bw: np.ndarray
    lat: np.ndarray
    umem: np.ndarray | None = None  # (U, D) static bytes of a unit on each device
    param: np.ndarray | None = None
    act: np.ndarray | None = None
    schedule: str = "gpipe"
    objective: str = "makespan"

    def stage_act_fraction(self, k: int, num_stages: int) -> float:
        """Share of a stage's activations held at once for stage ``k`` of a contiguous pipeline.

        1F1B (PipeDream-flush) keeps ``min(M, S - k)`` microbatches in flight on
        stage ``k`` of ``S``; GPipe keeps all ``M``; max-load counts no activations.
        """
        if self.objective == "max_load":
            return 0.0
        if self.schedule == "1f1b":
            return min(self.microbatches, max(num_stages - k, 1)) / self.microbatches
        return 1.0

    def stage_memory(self, units: np.ndarray, k: int, num_stages: int) -> float:
        """Static bytes of ``units`` as stage ``k`` of an ``num_stages``-stage pipeline."""
        assert self.param is not None and self.act is not None
        return float(
            self.param[units].sum() + self.stage_act_fraction(k, num_stages) * self.act[units].sum()
        )

    @property
    def num_units(self) -> int:
        return len(self.mem)

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def chain_memory(self, chain: list[int]) -> np.ndarray:
        """``float64[U, D]``: a unit's static bytes on each device when the devices form a
        pipeline in ``chain`` order (device ``chain[k]`` is stage ``k`` of ``len(chain)``)."""
        assert self.param is not None and self.act is not None
        frac = np.ones(self.num_devices)
        for k, d in enumerate(chain):
            frac[d] = self.stage_act_fraction(k, len(chain))
        return self.param[:, None] + self.act[:, None] * frac[None, :]

    def fits_pipeline(self, stage_pos: np.ndarray, chain: list[int]) -> bool:
        """True when the contiguous stages (stage of each order position on ``chain``) fit memory."""
        S = int(stage_pos.max()) + 1 if len(stage_pos) else 0
        for k in range(S):
            units = self.order[stage_pos == k]
            if self.stage_memory(units, k, S) > self.capacity[chain[k]]:
                return False
            if not np.isfinite(self.time[units, chain[k]]).all():
                return False
        return True

    @property
    def allowed(self) -> np.ndarray:
        """``bool[U, D]``: the unit can run on the device (finite time, fits alone)."""
        return np.isfinite(self.time) & (self.umem <= self.capacity[None, :])

    def comm(self, a: int, b: int, nbytes: float) -> float:
        """Uncontended transfer time (s) of ``nbytes`` from device a to b (0 on one device)."""
        if a == b:
            return 0.0
        return float(self.lat[a, b] + nbytes / self.bw[a, b])

    def node_placement(self, unit_place: np.ndarray) -> np.ndarray:
        """Expand a per-unit device array to a per-node placement."""
        return np.asarray(unit_place, dtype=np.int64)[self.unit_of]

    def memory_use(self, unit_place: np.ndarray) -> np.ndarray:
        """``float64[D]`` static bytes per device under a per-unit placement."""
        up = np.asarray(unit_place, dtype=np.int64)
        return np.bincount(
            up, weights=self.umem[np.arange(len(up)), up], minlength=self.num_devices
        )

    def fits(self, unit_place: np.ndarray) -> bool:
        """True when every unit may run where it is and no device is over capacity."""
        up = np.asarray(unit_place)
        ok_run = np.isfinite(self.time[np.arange(len(up)), up]).all()
        return bool(ok_run and (self.memory_use(up) <= self.capacity).all())

    def max_load(self, unit_place: np.ndarray) -> float:
        """Max-load of a unit placement (Tarnawski et al. 2020 style, the ILP/DP objective).

        A device's load is the compute time of its units plus, for every unit edge
        that crosses devices, the transfer time charged to both the sending and the
        receiving device. Returns the largest load in seconds.
        """
        return float(self.loads(unit_place).max())

    def loads(self, unit_place: np.ndarray) -> np.ndarray:
        up = np.asarray(unit_place, dtype=np.int64)
        D = self.num_devices
        load = np.zeros(D)
        np.add.at(load, up, self.time[np.arange(len(up)), up])
        a, b = up[self.usrc], up[self.udst]
        cross = a != b
        if cross.any():
            c = self.lat[a[cross], b[cross]] + self.ubytes[cross] / self.bw[a[cross], b[cross]]
            np.add.at(load, a[cross], c)
            np.add.at(load, b[cross], c)
        return load


def mean_finite(t: np.ndarray) -> np.ndarray:
    """Row means of ``t`` over its finite entries (0 for a row with none): a device-neutral cost."""
    fin = np.isfinite(t)
    cnt = fin.sum(axis=1)
    return np.where(cnt > 0, np.where(fin, t, 0.0).sum(axis=1) / np.maximum(cnt, 1), 0.0)


def roofline_times(graph: CompGraph, cluster: Cluster, microbatches: int = 1) -> np.ndarray:
    """``(n, D)`` seconds per node per device, per microbatch, by the simulator's rule.

    Measured ``graph.times[kind]`` (microseconds, whole batch) wins where finite;
    ``inf`` there means the node cannot run on that kind. Otherwise
    ``max(flops / (peak * eff), bytes_accessed / mem_bw) + launch_overhead`` with
    batch-proportional quantities divided by ``M`` (optimizer nodes run once per
    step and are not divided).
    """
    M = max(int(microbatches), 1)
    div = np.where(graph.kind == 2, 1.0, float(M))
    out = np.empty((graph.num_nodes, cluster.num_devices))
    for d, dev in enumerate(cluster.devices):
        t = (
            np.maximum(
                graph.flops / div / (dev.peak_flops * dev.efficiency),
                graph.bytes_accessed / div / dev.mem_bw,
            )
            + dev.launch_overhead
        )
        meas = graph.times.get(dev.kind)
        if meas is not None:
            t = np.where(np.isnan(meas), t, meas * 1e-6 / div)
        out[:, d] = t
    return out


def default_act_fraction(oracle: Oracle, num_devices: int) -> float:
    """Share of a batch's activations a device may hold at once under the oracle's schedule.

    ``max_load`` counts persistent state only (0); GPipe keeps all ``M``
    microbatches (1); 1F1B keeps at most ``min(M, D)`` of them in flight.
    """
    if getattr(oracle, "objective", "makespan") == "max_load":
        return 0.0
    M = max(int(getattr(oracle, "microbatches", 1) or 1), 1)
    if getattr(oracle, "schedule", "gpipe") == "1f1b":
        return min(M, num_devices) / M
    return 1.0


def make_problem(
    graph: CompGraph, cluster: Cluster, oracle: Oracle, *, act_fraction: float | None = None
) -> Problem:
    """Collect the unit-level view of ``graph`` on ``cluster`` that the baselines plan with.

    ``act_fraction`` defaults to :func:`default_act_fraction` of the oracle.
    """
    if oracle.graph is not graph and oracle.graph.content_hash() != graph.content_hash():
        raise ValueError("baseline: the oracle was built for another graph than the one given")
    if oracle.cluster is not cluster and oracle.cluster.content_hash() != cluster.content_hash():
        raise ValueError("baseline: the oracle was built for another cluster than the one given")
    pipeline_memory = act_fraction is None and getattr(oracle, "schedule", "") == "1f1b"
    if act_fraction is None:
        act_fraction = default_act_fraction(oracle, cluster.num_devices)
    if not (0.0 <= act_fraction <= 1.0):
        raise ValueError(f"baseline: act_fraction must be in [0, 1], got {act_fraction}")
    M = max(int(getattr(oracle, "microbatches", 1) or 1), 1)
    nt = getattr(oracle, "node_times", None)
    node_time = (
        np.asarray(nt(), dtype=np.float64) if callable(nt) else roofline_times(graph, cluster, M)
    )
    if node_time.shape != (graph.num_nodes, cluster.num_devices):
        raise ValueError(
            f"baseline: oracle.node_times() has shape {node_time.shape}, expected "
            f"({graph.num_nodes}, {cluster.num_devices})"
        )
    _, unit_of = graph.group_index()
    U = int(unit_of.max()) + 1 if graph.num_nodes else 0
    D = cluster.num_devices
    time_u = np.zeros((U, D))
    np.add.at(time_u, unit_of, node_time)
    param = np.bincount(unit_of, weights=graph.param_bytes, minlength=U)
    act = np.bincount(unit_of, weights=graph.act_bytes, minlength=U)
    mem = param + act_fraction * act
    umem = np.repeat(mem[:, None], cluster.num_devices, axis=1)
    if pipeline_memory and getattr(oracle, "objective", "makespan") != "max_load":
        # 1F1B: device chain[k] is treated as stage k of D and keeps min(M, D - k) microbatches
        frac = np.empty(cluster.num_devices)
        for k, d in enumerate(device_chain(cluster)):
            frac[d] = min(M, cluster.num_devices - k) / M
        umem = param[:, None] + act[:, None] * frac[None, :]
    # max-load counts parameter bytes only (Simulator): no transient reserve
    max_load = getattr(oracle, "objective", "makespan") == "max_load"
    reserve = 0.0 if max_load else float(graph.out_bytes.max(initial=0.0)) / M
    capacity = np.maximum(cluster.memory - reserve, 0.0)
    if not max_load:
        # a unit cannot go where its own largest transient and its state exceed the memory:
        # with the reserve clamped at 0, units without static memory "fitted" a device
        # smaller than their transient and every plan then ran out of memory in the oracle,
        # while all of them fitted a host CPU (found by fuzzing)
        own = np.zeros(U)
        np.maximum.at(own, unit_of, graph.out_bytes / M)
        least = param + act / M  # its state, one microbatch's activations at the least
        time_u[(least + own)[:, None] > cluster.memory[None, :]] = np.inf
    pos = np.empty(graph.num_nodes, dtype=np.int64)
    pos[graph.topo_order] = np.arange(graph.num_nodes)
    first = np.full(U, graph.num_nodes, dtype=np.int64)
    np.minimum.at(first, unit_of, pos)
    order = np.argsort(first, kind="stable")
    us, ud = unit_of[graph.src], unit_of[graph.dst]
    keep = us != ud
    key = us[keep] * max(U, 1) + ud[keep]
    uniq, inv = np.unique(key, return_inverse=True)
    ubytes = np.bincount(inv, weights=graph.edge_bytes[keep] / M, minlength=len(uniq))
    return Problem(
        graph=graph,
        cluster=cluster,
        oracle=oracle,
        microbatches=M,
        unit_of=unit_of,
        node_time=node_time,
        time=time_u,
        mem=mem,
        umem=umem,
        param=param,
        act=act,
        schedule=str(getattr(oracle, "schedule", "gpipe")),
        objective=str(getattr(oracle, "objective", "makespan")),
        capacity=capacity,
        order=order,
        usrc=(uniq // max(U, 1)).astype(np.int64),
        udst=(uniq % max(U, 1)).astype(np.int64),
        ubytes=ubytes,
        bw=cluster.bandwidth_matrix(),
        lat=cluster.latency_matrix(),
    )


_CHAIN_CACHE: dict[str, list[int]] = {}


def usable_chain(prob: Problem, chain: list[int]) -> list[int]:
    """``chain`` without the devices that can run none of the units (every ``prob.time`` entry
    inf there, e.g. an accelerator smaller than each unit's own transient): a stage on one is
    always infeasible, so leaving it out loses no split; before, the chain planners put their
    first stage on it and found no plan where the host could take everything (fuzzing,
    30 Nov 2026). The whole chain is kept when no device is usable (the planners then refuse)."""
    ok = [d for d in chain if np.isfinite(prob.time[:, d]).any()] if prob.num_units else chain
    return ok or list(chain)


def device_chain(cluster: Cluster) -> list[int]:
    """A topology-aware order of the devices: a path whose neighbours talk fastest.

    Maximises the slowest hop's bandwidth, then the summed hop bandwidth (exact
    search over all orders up to 8 devices, greedy nearest-neighbour from every
    start above). On a DGX-1 this finds a Hamiltonian path of bonded NVLinks.
    """
    key = cluster.content_hash()
    if key in _CHAIN_CACHE:
        return list(_CHAIN_CACHE[key])
    D = cluster.num_devices
    bw = cluster.bandwidth_matrix()

    def score(path: tuple[int, ...]) -> tuple[float, float]:
        hops = [bw[a, b] for a, b in itertools.pairwise(path)]
        return (min(hops, default=np.inf), sum(hops))

    if D <= 8:
        best = max(
            (p for p in itertools.permutations(range(D)) if D < 2 or p[0] < p[-1]),
            key=lambda p: (*score(p), tuple(-x for x in p)),
        )
    else:
        cands = []
        for s in range(D):
            path, left = [s], set(range(D)) - {s}
            while left:
                nxt = max(sorted(left), key=lambda b, a=path[-1]: bw[a, b])
                path.append(nxt)
                left.remove(nxt)
            cands.append(tuple(path))
        best = max(cands, key=lambda p: score(p))
    _CHAIN_CACHE[key] = list(best)
    return list(best)


def repair_memory(prob: Problem, unit_place: np.ndarray) -> np.ndarray:
    """Move units off devices that cannot run them or are over-full; raise if impossible.

    Units on a device that cannot run them move to the allowed device with room
    that cuts the fewest bytes. Then, greedily: from the most over-full device, move the unit whose move to a device
    with room adds the fewest cut bytes (ties: the larger unit first), until it fits.
    """
    up = np.asarray(unit_place, dtype=np.int64).copy()
    allowed = prob.allowed
    use = prob.memory_use(up)
    nbrs: list[list[tuple[int, float]]] = [[] for _ in range(prob.num_units)]
    for s, d, b in zip(prob.usrc.tolist(), prob.udst.tolist(), prob.ubytes.tolist()):
        nbrs[s].append((d, b))
        nbrs[d].append((s, b))
    for u in np.flatnonzero(~np.isfinite(prob.time[np.arange(len(up)), up])):
        room = [
            t
            for t in range(prob.num_devices)
            if allowed[u, t] and use[t] + prob.umem[u, t] <= prob.capacity[t]
        ]
        if not room:
            raise InfeasiblePlanError(
                f"no device can run the group of node {prob.graph.name[np.flatnonzero(prob.unit_of == u)[0]]!r} "
                "and hold it"
            )
        t = min(room, key=lambda t, u=u: sum(b * (up[v] != t) for v, b in nbrs[u]))
        use[up[u]] -= prob.umem[u, up[u]]
        use[t] += prob.umem[u, t]
        up[u] = t
    for _ in range(prob.num_units * prob.num_devices + 1):
        over = use - prob.capacity
        d = int(np.argmax(over))
        if over[d] <= 0:
            return up
        best: tuple[float, float, int, int] | None = None
        for u in np.flatnonzero(up == d):
            for t in range(prob.num_devices):
                if t == d or not allowed[u, t] or use[t] + prob.umem[u, t] > prob.capacity[t]:
                    continue
                delta = sum(b * (int(up[v] == d) - int(up[v] == t)) for v, b in nbrs[u])
                cand = (delta, -prob.mem[u], int(u), t)
                if best is None or cand < best:
                    best = cand
        if best is None:
            raise InfeasiblePlanError(
                f"cannot fit the units of device {prob.cluster.devices[d].name!r} "
                f"({fmt_bytes(use[d])} static memory > {fmt_bytes(prob.capacity[d])} usable) "
                "on any device with room"
            )
        _, _, u, t = best
        use[d] -= prob.umem[u, d]
        use[t] += prob.umem[u, t]
        up[u] = t
    raise InfeasiblePlanError("memory repair did not converge")


def oracle_calls_start(oracle: Oracle) -> tuple[float, int]:
    """``(t0, calls0)`` to measure a search's wall time and oracle evaluations."""
    return time.perf_counter(), int(oracle.calls)


def evaluate_units(prob: Problem, unit_place: np.ndarray) -> SimResult:
    """Score a per-unit placement with the oracle."""
    return prob.oracle.evaluate(prob.node_placement(unit_place))


def result_ok(res: SimResult) -> bool:
    """A result counts when it fits in memory and has a finite step time."""
    return (not res.oom) and bool(np.isfinite(res.step_time))


def finish(
    prob: Problem,
    unit_place: np.ndarray,
    algorithm: str,
    start: tuple[float, int],
    *,
    result: SimResult | None = None,
    stage_device: list[int] | None = None,
    unit_stage: np.ndarray | None = None,
    **meta: Any,
) -> Plan:
    """Score ``unit_place`` (unless ``result`` is given) and wrap it as a :class:`Plan`.

    Raises :class:`InfeasiblePlanError` when the oracle reports OOM or a node on
    a device that cannot run it: an infeasible plan is never returned.
    """
    t0, calls0 = start
    up = np.asarray(unit_place, dtype=np.int64)
    if result is None:
        result = evaluate_units(prob, up)
    if result.oom:
        over = [
            prob.cluster.devices[d].name
            for d in range(prob.num_devices)
            if result.peak_memory[d] > prob.cluster.devices[d].memory
        ]
        why = result.extra.get("oom")  # the oracle's own account (e.g. a measured peak)
        raise InfeasiblePlanError(
            f"{algorithm}: its plan for {prob.graph.meta.get('name', '?')!r} runs out of memory on {over}"
            + (f" ({why})" if why else "")
        )
    if not np.isfinite(result.step_time):
        if result.infeasible_reason:
            raise InfeasiblePlanError(
                f"{algorithm}: its plan cannot run: {result.infeasible_reason}", oom=False
            )
        raise InfeasiblePlanError(
            f"{algorithm}: its plan puts a node on a device that cannot run it"
        )
    placement = prob.node_placement(up)
    kw: dict[str, Any] = {}
    if stage_device is not None and unit_stage is not None:
        kw = {"stage": np.asarray(unit_stage)[prob.unit_of], "stage_device": tuple(stage_device)}
    info = {
        "algorithm": algorithm,
        "step_time": float(result.step_time),
        "lower_bound": float(result.lower_bound),
        "oracle_calls": int(prob.oracle.calls) - calls0,
        "search_seconds": time.perf_counter() - t0,
        "devices_used": int(len(np.unique(placement))),
        **meta,
    }
    return Plan.for_graph(
        placement,
        prob.graph,
        prob.cluster,
        microbatches=prob.microbatches,
        schedule=str(getattr(prob.oracle, "schedule", "1f1b")),
        meta=info,
        **kw,
    )


# ---------------------------------------------------------------- C library output
class CapturedOutput:
    """What :func:`c_output_captured` caught."""

    text = ""


@contextlib.contextmanager
def c_output_captured() -> Iterator[CapturedOutput]:
    """Capture what C code writes to file descriptors 1 and 2 while the block runs (METIS
    prints its warnings and HiGHS its banner past Python's ``sys.stdout``); the text is in
    the yielded object's ``text`` afterwards. Nothing is captured when descriptor 1 or 2 is
    closed."""
    out = CapturedOutput()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or replaced stream: nothing to flush
            stream.flush()
    try:  # copies above 2, so that redirecting 1 and 2 cannot overwrite them
        saved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in (1, 2)]
    except OSError:  # descriptor 1 or 2 closed (a daemon): nothing reaches a terminal
        yield out
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            try:
                _libc_flush()
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            tmp.seek(0)
            out.text = tmp.read().decode(errors="replace")


def _libc_flush() -> None:
    """Flush C's stdio buffers (``fflush(NULL)``) so that captured output is complete."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no libc to call: nothing buffered we can reach
        pass


def check_seconds(who: str, name: str, value: Any) -> float:
    """``value`` as seconds: a finite number > 0, else ``ValueError`` naming ``who`` and
    ``name`` (a limit of 0 or -1 used to be taken, stopping the search before it began)."""
    if not is_number(value, 0, lo_open=True):
        raise ValueError(f"{who}: {name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def check_flag(who: str, name: str, value: Any) -> bool:
    """A planner's on/off option: ``True`` or ``False`` (numpy's too), else ``ValueError``
    naming ``who`` and ``name`` (``"no"`` and ``"maybe"`` used to switch an option on)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{who}: {name} must be true or false, got {value!r}")
    return bool(value)


#: The largest seed a planner takes: METIS's options hold a signed 64-bit integer.
MAX_SEED = 2**63 - 1


def check_seed(who: str, seed: Any) -> int:
    """A random seed: an integer in ``0..MAX_SEED`` (``ValueError`` naming ``who``; -1 and 1.5
    raised numpy's or METIS's own errors, METIS took -1, and 2**70 raised pybind11's
    ``TypeError`` from inside METIS, found by fuzzing)."""
    if not is_whole(seed, 0):
        raise ValueError(f"{who}: seed must be an integer >= 0, got {seed!r}")
    if int(seed) > MAX_SEED:
        raise ValueError(f"{who}: seed must be an integer >= 0, got {seed!r} (at most 2**63-1)")
    return int(seed)


def check_budget(who: str, budget: Any, default: int | None) -> int | None:
    """An oracle-call budget: ``default`` for ``None`` (``None``: no cap), else an integer >= 1
    (``ValueError`` naming ``who``; a fractional budget such as 2.5 used to be cut to 2
    without a word)."""
    if budget is None:
        return default
    if not is_whole(budget, 1):
        raise ValueError(f"{who}: budget must be an integer >= 1 evaluation, got {budget!r}")
    return int(budget)
