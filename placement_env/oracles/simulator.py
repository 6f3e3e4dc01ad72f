"""Simulator: the cost-model oracle (discrete-event makespan and max-load objectives)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphs.cluster import EAGER_ROUTE_DEVICES, Cluster
from graphs.compgraph import KIND_NAMES, OPT, CompGraph
from graphs.layout import HybridLayout
from graphs.plan import MAX_MICROBATCHES, Plan, check_graph_cluster, check_placement
from graphs.schema import is_whole
from placement_env.oracles import _kernels
from placement_env.oracles.base import ScheduleEvent, SimResult

#: Schedule name -> kernel code.
SCHEDULES: dict[str, int] = {"gpipe": 0, "1f1b": 1, "in_order": 2}
#: Valid objectives.
OBJECTIVES: tuple[str, ...] = ("makespan", "max_load")


class Simulator:
    """Cost-model oracle: scores a placement of ``graph`` on ``cluster`` in microseconds.

    Implements :class:`placement_env.oracles.Oracle`. Everything that does not
    depend on the placement is precomputed here; ``evaluate`` runs a compiled
    (numba) kernel. ``docs/simulator.md`` states the same rules with examples.

    ## Compute time
    Node ``i`` on device ``d`` of kind ``k`` runs once per microbatch (fwd and bwd
    nodes; ``s = M``) or once per step (opt nodes; ``s = 1``) and takes, per run:

    * ``graph.times[k][i] * 1e-6 / s`` seconds when that value is present and finite;
      ``+inf`` means the node cannot run on ``k``: the placement is infeasible
      (``SimResult.infeasible_reason`` says which node, ``step_time = inf``);
    * else ``max((flops/s) / (peak_flops*efficiency), (bytes_accessed/s) / mem_bw)
      + launch_overhead``.

    ## Objective ``"makespan"``: one training step of ``M`` microbatches
    * Tasks: ``(fwd or bwd node, microbatch)`` and ``(opt node)``. A per-microbatch
      task waits for the same microbatch of its per-microbatch predecessors; an opt
      task waits for *all* microbatches of its predecessors; a task fed by an opt
      node waits for that single run.
    * One compute stream per device runs one task at a time, non-preemptively;
      whenever it is idle it starts the ready task of highest priority:
      ``gpipe``: all forwards (microbatch, then topological order) before backwards
      (same order), then optimizer nodes; a backward task may start only when every
      forward task on its device has finished (the GPipe flush).
      ``1f1b``: backwards before forwards, earlier microbatch first, then
      topological order, optimizer nodes last; the forward task of microbatch ``m``
      on device ``d`` may start only if ``m < c_d + K_d`` where ``c_d`` counts the
      leading microbatches whose every task on ``d`` has finished and the cap
      ``K_d = min(M, 1 + the largest number of device changes on a forward-only
      path that starts at a forward node on d)`` -- ``p - s`` for stage ``s`` of a
      ``p``-stage pipeline, as in PipeDream-flush.
      ``in_order``: the static order of the op-level runtime
      (``runtime.oplevel.OpLevelRunner``), not work-conserving. Forward nodes are
      cut into *partitions* keyed by ``(depth, device)``, ``depth`` = the largest
      number of device changes on a forward path reaching the node. Each device
      runs, in this order and nothing else: forward runs by ``(m, depth,
      topological position)``; then backward runs by ``(M-1-m, reverse depth,
      topological position)`` where a backward node ``bwd:X`` belongs to ``X``'s
      partition (it must be on ``X``'s device); then optimizer runs. A device whose
      next run is not ready waits (idles). A partition starts only when every
      transfer into any of its runs has arrived (the runtime receives a
      partition's inputs before computing it), and the transfers of its runs
      leave when its last run finishes (the runtime sends a partition's outputs
      after computing it). The order is topological, so nothing deadlocks.
      If these gates leave every device and link idle with work left (possible
      only when backward or optimizer results feed forward work), they are lifted
      for one dispatch round, so the simulation always ends.
    * Transfers: when a producer run finishes on device ``a``, one transfer goes to
      every other device ``b`` holding a consumer, however many consumers sit
      there; its size is the largest edge bytes from the producer to a consumer on
      ``b`` divided by the producer's ``s``. It follows ``cluster.route(a, b)``
      store-and-forward: each hop waits for its directed link, which serves
      transfers first-in first-out (ties at the same instant by producer run, then
      destination) and is held for ``latency + bytes / bandwidth``; the next hop
      starts when the previous one ends. Transfers overlap compute. If an edge to
      ``b`` has a ``graph.edge_time`` (not NaN), the transfer instead takes the
      largest such time ``* 1e-6 / s`` and uses no link (no contention, no link bytes).
    * Endpoint cost (LogP's ``o``, ``Device.transfer_overhead``, default 0): each
      transfer adds ``transfer_overhead`` of the sender to the producer run (it
      leaves after it) and ``transfer_overhead + receive_overhead`` of the receiver
      to the first run on the receiving device that needs it (smallest schedule
      priority; in ``in_order`` the first run of that run's partition). These
      seconds count as busy time.
    * Time advances event by event; all events at the same instant are applied
      before links and then devices are dispatched (a "round").
    * ``step_time`` = finish time of the last task.

    ## Memory (makespan)
    Per device: ``param_bytes`` of its nodes (weights + gradients + optimizer state)
    ``+ act_bytes(its nodes) / M * peak microbatches in flight`` (a microbatch is
    in flight on ``d`` from the start of its first task there until all its tasks
    there finished, as simulated) ``+`` the largest transient, the largest
    ``out_bytes / s`` of a node there. ``oom`` when any device exceeds ``memory``.

    ## Objective ``"max_load"`` (Tarnawski et al., NeurIPS 2020)
    Steady-state time per sample of a pipeline; the graph as given is one sample
    (``microbatches`` and ``schedule`` are not used). Load of device ``d`` =
    compute of its nodes (``times[k][i]`` microseconds as written, else the
    roofline for the whole batch) + transfer costs: for each node ``u`` with
    consumers on other devices, each such device ``b`` is charged ``c(u, b)`` and
    ``u``'s own device is charged ``max_b c(u, b)``, where ``c(u, b)`` is the largest
    ``edge_time`` of an edge from ``u`` to ``b`` if any is set, else the
    store-and-forward time ``sum(latency + bytes/bandwidth)`` of the largest edge
    bytes over the route. Devices of kind ``"cpu"`` pay no transfer cost. With the
    Fiddle format (one cost per source node) this is exactly the objective of
    ``msr-fiddle/dnn-partitioning`` (``computeLoadForResultOrg``).
    ``step_time`` = largest load in seconds, ``extra["load"]`` = the same in the
    graph's own units (microseconds as written, no conversion), ``extra["loads"]``
    per device; memory = ``param_bytes`` per device.

    ## Lower bound
    With ``t_i = min_d`` (per-run time of node ``i`` on device ``d``):
    ``max(longest path of the graph weighted by t_i, sum_i runs_i * t_i / D)``
    (critical path on the fastest devices without communication, and total work
    at the fastest speed spread over all ``D`` devices). For max_load:
    ``max(max_i t_i, sum_i t_i / D)`` with whole-batch times.

    Args:
        graph: the training graph.
        cluster: the devices and links.
        microbatches: ``M >= 1``.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"in_order"``.
        objective: ``"makespan"`` or ``"max_load"``.

    A :class:`graphs.Plan` passed to ``evaluate`` is checked against the graph
    and cluster hashes; its own microbatches/schedule fields are not used (the
    simulator's are). A plan this model cannot score is refused with a
    ``ValueError`` naming the field: ``schedule="interleaved"`` (no interleaved
    schedule here) and a ``tp_degree`` above 1 (tensor parallelism is not modelled
    for op placements). Colocation groups are not enforced here.
    """

    def __init__(
        self,
        graph: CompGraph,
        cluster: Cluster,
        *,
        microbatches: int = 1,
        schedule: str = "gpipe",
        objective: str = "makespan",
    ) -> None:
        check_graph_cluster("Simulator", graph, cluster)  # AttributeErrors before (2 Dec 2026)
        if not isinstance(schedule, str) or schedule not in SCHEDULES:  # a list: unhashable
            raise ValueError(
                f"Simulator: unknown schedule {schedule!r}; valid: {sorted(SCHEDULES)}"
            )
        if not isinstance(objective, str) or objective not in OBJECTIVES:
            raise ValueError(f"Simulator: unknown objective {objective!r}; valid: {OBJECTIVES}")
        if not is_whole(microbatches, 1) or microbatches > MAX_MICROBATCHES:
            raise ValueError(
                f"Simulator: microbatches must be an integer in [1, {MAX_MICROBATCHES:,}] (a "
                f"plan's bound), got {microbatches!r}"
            )
        self.graph = graph
        self.cluster = cluster
        self.microbatches = int(microbatches)
        self.schedule = schedule
        self.objective = objective
        self.calls = 0

        self._hybrid: Any = None
        self._prepared = False
        if cluster.num_devices <= EAGER_ROUTE_DEVICES:
            self._prepare()

    def _prepare(self) -> None:
        """Placement-independent tables of the op-level kernels (made on first use for
        clusters of more than ``EAGER_ROUTE_DEVICES`` devices, which hybrid plans score
        without them)."""
        if self._prepared:
            return
        self._prepared = True
        graph, cluster, schedule = self.graph, self.cluster, self.schedule
        g, c, M = graph, cluster, self.microbatches
        n, D = g.num_nodes, c.num_devices
        self._permb = np.ascontiguousarray(g.kind != OPT)
        self._kind = np.ascontiguousarray(g.kind.astype(np.int8))
        s = np.where(self._permb, float(M), 1.0)
        self._s = s

        # ---- compute time per run (seconds) and whole-batch (microseconds)
        dur = np.empty((n, D))
        comp_us = np.empty((n, D))
        for d, dev in enumerate(c.devices):
            roof = (
                np.maximum(
                    (g.flops / s) / (dev.peak_flops * dev.efficiency),
                    (g.bytes_accessed / s) / dev.mem_bw,
                )
                + dev.launch_overhead
            )
            roof_full = (
                np.maximum(
                    g.flops / (dev.peak_flops * dev.efficiency), g.bytes_accessed / dev.mem_bw
                )
                + dev.launch_overhead
            )
            t = g.times.get(dev.kind)
            if t is None:
                dur[:, d] = roof
                comp_us[:, d] = roof_full * 1e6
            else:
                has = ~np.isnan(t)
                dur[:, d] = np.where(has, t * 1e-6 / s, roof)
                comp_us[:, d] = np.where(has, t, roof_full * 1e6)
        self._dur = dur
        _check_runnable(g, c, dur)
        self._comp_us = comp_us

        # ---- distinct successors (parallel edges merged: largest bytes / time)
        src, dst = g.src, g.dst
        et = g.edge_time if g.edge_time is not None else np.full(g.num_edges, np.nan)
        order = np.lexsort((dst, src))
        src_o, dst_o = src[order], dst[order]
        first = np.ones(len(order), bool)
        if len(order):
            first[1:] = (src_o[1:] != src_o[:-1]) | (dst_o[1:] != dst_o[:-1])
        uid = np.cumsum(first) - 1
        nu = int(first.sum())
        sb_raw = np.zeros(nu)
        np.maximum.at(sb_raw, uid, g.edge_bytes[order])
        se_raw = np.full(nu, -np.inf)
        eto = et[order]
        has_t = ~np.isnan(eto)
        np.maximum.at(se_raw, uid[has_t], eto[has_t])
        se_raw[np.isneginf(se_raw)] = np.nan
        usrc, udst = src_o[first], dst_o[first]
        self._sptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(usrc, minlength=n), out=self._sptr[1:])
        self._sidx = np.ascontiguousarray(udst, dtype=np.int64)
        self._sbytes_raw = sb_raw
        self._sexpl_us = se_raw
        self._sbytes = sb_raw / s[usrc]
        self._stime = se_raw * 1e-6 / s[usrc]
        # notifications per run: M from a per-microbatch producer into an opt consumer
        w = np.where(self._permb[usrc] & ~self._permb[udst], M, 1)
        self._pend0 = np.bincount(udst, weights=w, minlength=n).astype(np.int64)
        self._topo = np.require(g.topo_order, np.int64, ["C", "W"])
        self._topo_pos = np.empty(n, np.int64)
        self._topo_pos[self._topo] = np.arange(n)
        # run tables of the makespan kernel (placement-independent)
        self._base, self._inst_node, self._pkey, self._gated, self._pend = _kernels.prepare_tasks(
            M, SCHEDULES[schedule], self._kind, self._permb, self._topo_pos, self._pend0
        )
        self._fwd_of = forward_of(g)
        if schedule == "in_order":
            lone = np.flatnonzero((g.kind == 1) & (self._fwd_of < 0))
            if len(lone):
                raise ValueError(
                    f"Simulator: schedule 'in_order' needs the forward node of every backward "
                    f"node (named 'bwd:' + its name, or the forward node of its group); "
                    f"{g.name[lone[0]]!r} has none"
                )

        # ---- routes
        rptr = np.zeros(D * D + 1, np.int64)
        rl: list[int] = []
        for a in range(D):
            for b in range(D):
                rl.extend(c.route(a, b))
                rptr[a * D + b + 1] = len(rl)
        self._rptr, self._rlink = rptr, np.asarray(rl, dtype=np.int64)
        self._lat = np.array([ln.latency for ln in c.links], dtype=np.float64)
        self._bw = np.array([ln.bandwidth for ln in c.links], dtype=np.float64)
        self._nocomm = np.array([dev.kind == "cpu" for dev in c.devices])
        self._ovh_send = np.array([dev.transfer_overhead for dev in c.devices], dtype=np.float64)
        self._ovh_recv = self._ovh_send + np.array([dev.receive_overhead for dev in c.devices])
        self._capacity = c.memory

        # ---- memory terms per node
        self._transient = np.ascontiguousarray(g.out_bytes / s)
        # writeable copies where the graph's arrays are read-only: numba compiles a kernel once
        # per signature, and a read-only array is another signature (another 3-17 s compile)
        self._param_bytes = np.require(g.param_bytes, np.float64, ["C", "W"])
        self._act_bytes = np.require(g.act_bytes, np.float64, ["C", "W"])
        self._has_inf = bool(np.isinf(dur).any())
        self._lower_bound = self._compute_lower_bound()

    # ------------------------------------------------------------------ API
    def node_times(self) -> np.ndarray:
        """``float64[n, D]`` seconds of one run of each node on each device (+inf: cannot run)."""
        self._prepare()
        return self._dur.copy()

    def lower_bound(self) -> float:
        """A step time no placement can beat (see the class docstring), seconds."""
        self._prepare()
        return self._lower_bound

    def static_memory(self, placement: Any) -> np.ndarray:
        """``float64[D]`` bytes per device the schedule allows at most, before simulating.

        ``makespan``: param bytes + activation bytes x (in-flight cap / M) + the
        largest transient, with the cap ``M`` for gpipe and in_order and ``K_d`` for 1f1b;
        ``max_load``: param bytes. Equals ``peak_memory`` when the cap is reached.
        """
        p = self._check(placement)
        self._prepare()
        D = self.cluster.num_devices
        params, act, trans = self._sums(p)
        if self.objective == "max_load":
            return params
        M = self.microbatches
        if self.schedule != "1f1b":
            inflight = np.full(D, float(M))
        else:
            inflight = _kernels.inflight_cap(
                p, M, D, self._kind, self._topo, self._sptr, self._sidx
            ).astype(float)
        return params + act / M * inflight + trans

    def evaluate(self, placement_or_plan: np.ndarray | Plan, *, record: bool = False) -> SimResult:
        """Score a placement (device index per node) or a :class:`Plan` for this graph.

        A plan with a ``layout`` (:meth:`graphs.plan.Plan.hybrid`) is scored by the hybrid
        step model (:class:`placement_env.oracles.hybrid.HybridModel`) and returns a
        :class:`~placement_env.oracles.hybrid.HybridResult`; ``record`` is ignored there.
        """
        if not isinstance(record, (bool, np.bool_)):  # "yes" and 1 were taken (fuzzing)
            raise TypeError(f"Simulator.evaluate: record must be True or False, got {record!r}")
        if isinstance(placement_or_plan, Plan) and placement_or_plan.layout is not None:
            return self.evaluate_layout(placement_or_plan.layout, plan=placement_or_plan)
        p = self._check(placement_or_plan)
        if isinstance(placement_or_plan, Plan):  # its microbatches and schedule were ignored
            m, sched = placement_or_plan.microbatches, placement_or_plan.schedule
            # with one microbatch gpipe and 1f1b are the same pipeline (in_order is not)
            same = m == self.microbatches and (
                sched == self.schedule or (m == 1 and "in_order" not in (sched, self.schedule))
            )
            if not same:
                raise ValueError(
                    f"Simulator.evaluate: the plan is for {m} microbatches, schedule "
                    f"{sched!r}; this simulator runs {self.microbatches}, {self.schedule!r}: "
                    f"score it with Simulator(graph, cluster, microbatches={m}, "
                    f"schedule={sched!r}), or pass plan.placement to score its placement here"
                )
        self._prepare()
        self.calls += 1
        if self.schedule == "in_order" and self.objective == "makespan":
            f = self._fwd_of
            bad_b = np.flatnonzero((self.graph.kind == 1) & (p != p[np.maximum(f, 0)]))
            if len(bad_b):
                j = int(bad_b[0])
                raise ValueError(
                    f"Simulator(schedule='in_order'): backward node {self.graph.name[j]!r} is on "
                    f"device {p[j]}, its forward node {self.graph.name[f[j]]!r} on {p[f[j]]}; the "
                    "op-level runtime runs a backward node where its forward node runs"
                )
        bad = np.isinf(self._dur[np.arange(len(p)), p]) if self._has_inf else None
        if bad is not None and bad.any():
            i = int(np.flatnonzero(bad)[0])
            dev = self.cluster.devices[p[i]]
            return self._infeasible(
                p,
                f"node {self.graph.name[i]!r} cannot run on device {p[i]} ({dev.name}, kind "
                f"{dev.kind!r}): times[{dev.kind!r}] is inf",
            )
        if self.objective == "max_load":
            return self._max_load(p)
        return self._makespan(p, record)

    def evaluate_layout(self, layout: Any, *, plan: Plan | None = None) -> Any:
        """Score a :class:`graphs.layout.HybridLayout` of this graph on this cluster (the
        hybrid step model; counts as one call). ``plan``, when given, is checked first.

        A ``cpu_N`` cluster whose calibration has a ``hybrid`` section
        (``cluster.meta["hybrid_calibration"]``, from
        ``runtime.hybrid_profile.calibrate_hybrid``) is scored by the calibrated
        :class:`placement_env.oracles.hybrid_cpu.CpuHybridModel` (this machine's gloo
        processes), every other cluster by :class:`placement_env.oracles.hybrid.HybridModel`."""
        if not isinstance(layout, HybridLayout):  # an AttributeError from inside (2 Dec 2026)
            hint = " (HybridLayout.from_dict(...) reads one)" if isinstance(layout, dict) else ""
            raise TypeError(
                f"Simulator.evaluate_layout: layout must be a graphs.layout.HybridLayout{hint}, "
                f"got {type(layout).__name__}"
            )
        if plan is not None:
            plan.check(self.graph, self.cluster)
        res = self.hybrid_model().evaluate(layout)
        self.calls += 1  # a layout the model refuses (e.g. uncalibrated) is not a call
        return res

    def layout_unscorable(self, layout: Any) -> str | None:
        """Why :meth:`evaluate_layout` cannot score ``layout`` without evaluating it: on a
        hybrid-calibrated ``cpu_N``, the ``(tp, microbatch size, recompute)`` the calibration
        lacks (:meth:`CpuHybridModel.missing`); None when it can (always on other clusters).
        The hybrid env keeps such layouts out of its moves."""
        model = self.hybrid_model()
        missing = getattr(model, "missing", None)
        return None if missing is None else missing(layout)

    def hybrid_model(self) -> Any:
        """The hybrid step model :meth:`evaluate_layout` uses on this cluster
        (:class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel` on a hybrid-calibrated
        ``cpu_N``, else :class:`~placement_env.oracles.hybrid.HybridModel`); its
        ``stage_costs`` weigh the Alpa-style planner's inter-op split, and a
        ``CpuHybridModel``'s ``missing`` is what the hybrid env masks with."""
        from placement_env.oracles.hybrid import HybridModel
        from placement_env.oracles.hybrid_cpu import CpuHybridModel

        if self._hybrid is None:
            hcal = self.cluster.meta.get("hybrid_calibration")
            if hcal:
                self._hybrid = CpuHybridModel(self.graph, self.cluster, hcal)
            else:
                self._hybrid = HybridModel(self.graph, self.cluster)
        return self._hybrid

    # ------------------------------------------------------------ internals
    def _check(self, placement_or_plan: Any) -> np.ndarray:
        if isinstance(placement_or_plan, Plan):
            _refuse_unmodelled(placement_or_plan)
            placement_or_plan.check(self.graph, self.cluster)
            return np.require(placement_or_plan.placement, np.int64, ["C", "W"])
        # writeable: a read-only placement would compile every kernel again (see __init__)
        return np.require(
            check_placement(placement_or_plan, self.graph, self.cluster), np.int64, ["C", "W"]
        )

    def _sums(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per device: param bytes, activation bytes, largest transient of the nodes there."""
        return _kernels.placement_sums(
            p, self.cluster.num_devices, self._param_bytes, self._act_bytes, self._transient
        )

    def _compute_lower_bound(self) -> float:
        g, D = self.graph, self.cluster.num_devices
        if self.objective == "max_load":
            t = self._comp_us.min(axis=1) * 1e-6
            if not len(t):
                return 0.0
            return float(max(t.max(), t.sum() / D))
        t = self._dur.min(axis=1)
        if not len(t):
            return 0.0
        runs = np.where(self._permb, self.microbatches, 1)
        work = float((runs * t).sum()) / D
        finish = np.zeros(g.num_nodes)
        sptr, sidx = self._sptr, self._sidx
        for i in self._topo:
            finish[i] += t[i]
            succ = sidx[sptr[i] : sptr[i + 1]]
            if len(succ):
                finish[succ] = np.maximum(finish[succ], finish[i])
        return float(max(finish.max(), work))

    def _infeasible(self, p: np.ndarray, reason: str) -> SimResult:
        D, L = self.cluster.num_devices, len(self.cluster.links)
        return SimResult(
            step_time=float("inf"),
            lower_bound=self._lower_bound,
            oom=False,
            device_busy=np.zeros(D),
            peak_memory=self.static_memory(p) if self.objective == "makespan" else np.zeros(D),
            link_bytes=np.zeros(L),
            objective=self.objective,
            extra={},
            infeasible_reason=reason,
        )

    def _makespan(self, p: np.ndarray, record: bool) -> SimResult:
        M = self.microbatches
        (
            makespan,
            busy,
            peak,
            link_bytes,
            tstart,
            tdur,
            rec_x,
            rec_l,
            rec_s,
            rec_e,
            x_inst,
            x_dev,
        ) = _kernels.simulate_makespan(
            p,
            M,
            SCHEDULES[self.schedule],
            self._kind,
            self._permb,
            self._topo,
            self._dur,
            self._sptr,
            self._sidx,
            self._sbytes,
            self._stime,
            self._base,
            self._inst_node,
            self._pkey,
            self._gated,
            self._pend,
            self._rptr,
            self._rlink,
            self._lat,
            self._bw,
            self._ovh_send,
            self._ovh_recv,
            self._fwd_of,
            self._topo_pos,
            record,
        )
        if makespan < 0:  # cannot happen for a DAG; guards the kernel
            raise RuntimeError("Simulator: the schedule deadlocked (no ready task left)")
        params, act, trans = self._sums(p)
        mem = params + act / M * peak + trans
        events = None
        if record:
            events = self._events(p, tstart, tdur, rec_x, rec_l, rec_s, rec_e, x_inst, x_dev)
        return SimResult(
            step_time=float(makespan),
            lower_bound=self._lower_bound,
            oom=bool((mem > self._capacity).any()),
            device_busy=busy,
            peak_memory=mem,
            link_bytes=link_bytes,
            objective="makespan",
            events=events,
            extra={
                "microbatches_in_flight": peak,
                "param_bytes": params,
                "schedule": self.schedule,
                "microbatches": M,
            },
        )

    def _events(
        self,
        p: np.ndarray,
        tstart: np.ndarray,
        tdur: np.ndarray,
        rec_x: np.ndarray,
        rec_l: np.ndarray,
        rec_s: np.ndarray,
        rec_e: np.ndarray,
        x_inst: np.ndarray,
        x_dev: np.ndarray,
    ) -> tuple[ScheduleEvent, ...]:
        g, M = self.graph, self.microbatches
        runs = np.where(self._permb, M, 1)
        base = np.concatenate([[0], np.cumsum(runs)])
        inst_node = np.repeat(np.arange(g.num_nodes), runs)
        out: list[ScheduleEvent] = []
        for t, i in enumerate(inst_node):
            m = int(t - base[i]) if self._permb[i] else -1
            d = int(p[i])
            s = float(tstart[t])
            out.append(
                ScheduleEvent(
                    "device", d, int(i), m, s, s + float(tdur[t]),
                    f"{KIND_NAMES[g.kind[i]]} {g.name[i]}",
                )
            )  # fmt: skip
        names = [dv.name for dv in self.cluster.devices]
        for x, lk, s, e in zip(rec_x, rec_l, rec_s, rec_e):
            t = int(x_inst[x])
            i = int(inst_node[t])
            m = int(t - base[i]) if self._permb[i] else -1
            out.append(
                ScheduleEvent(
                    "link", int(lk), i, m, float(s), float(e),
                    f"{g.name[i]} -> {names[int(x_dev[x])]}",
                )
            )  # fmt: skip
        out.sort(key=lambda ev: (ev.start, ev.resource, ev.index))
        return tuple(out)

    def _max_load(self, p: np.ndarray) -> SimResult:
        compute, comm, link_bytes = _kernels.max_load_kernel(
            p,
            self._comp_us,
            self._sptr,
            self._sidx,
            self._sexpl_us,
            self._sbytes_raw,
            self._rptr,
            self._rlink,
            self._lat,
            self._bw,
            self._nocomm,
        )
        loads = compute + comm
        load = float(loads.max()) if len(loads) else 0.0
        mem = self._sums(p)[0]
        return SimResult(
            step_time=load * 1e-6,
            lower_bound=self._lower_bound,
            oom=bool((mem > self._capacity).any()),
            device_busy=compute * 1e-6,
            peak_memory=mem,
            link_bytes=link_bytes,
            objective="max_load",
            extra={"load": load, "loads": loads, "compute": compute, "comm": comm},
        )

    def __repr__(self) -> str:
        return (
            f"Simulator(graph={self.graph.meta.get('name', '?')!r}, cluster={self.cluster.name!r}, "
            f"microbatches={self.microbatches}, schedule={self.schedule!r}, objective={self.objective!r})"
        )


def _refuse_unmodelled(plan: Plan) -> None:
    """Raise ``ValueError`` naming the first field of an op-placement ``plan`` the simulator ignores.

    Only plain op placements are checked: a hybrid plan (``layout``) is scored by
    its own model, which reads its schedule and tensor-parallel degrees.
    """
    if getattr(plan, "layout", None) is not None:
        return
    if plan.schedule == "interleaved":
        raise ValueError(
            "Simulator: Plan.schedule='interleaved' cannot be modelled: the simulator has "
            f"schedules {sorted(SCHEDULES)} only; make the plan with 'gpipe' or '1f1b'"
        )
    tp = {g: d for g, d in plan.tp_degree.items() if d != 1}
    if tp:
        g, d = next(iter(tp.items()))
        raise ValueError(
            f"Simulator: Plan.tp_degree={{{g}: {d}}} cannot be modelled: tensor parallelism "
            f"of an op placement is not simulated ({len(tp)} group(s) with degree != 1); "
            "score it with the profiled oracle or leave tp_degree empty"
        )


def memory_floor(
    graph: CompGraph, cluster: Any, microbatches: int = 1, objective: str = "makespan"
) -> str | None:
    """Why no op placement of ``graph`` can fit ``cluster``'s memory, or None when one might.

    A necessary condition, so a reason is a proof: every node's ``param_bytes`` sit on one
    device, and (``makespan``) a device that runs a node holds at least one microbatch of
    its activations, so the devices together need at least ``sum(param_bytes) +
    sum(act_bytes) / M`` (``max_load``: the parameters alone) against the sum of their
    memories. None does not promise that a plan fits."""
    params = float(np.sum(graph.param_bytes))
    act = float(np.sum(graph.act_bytes)) / max(int(microbatches), 1)
    need = params + (act if objective != "max_load" else 0.0)
    have = float(np.sum(cluster.memory))
    if need <= have:
        return None
    what = f"{params / 2**30:,.1f} GiB of parameter state" + (
        f" + {act / 2**30:,.1f} GiB for one microbatch's activations" if need > params else ""
    )
    return (
        f"{graph.meta.get('name', 'the graph')!r} needs at least {what} = {need / 2**30:,.1f} GiB "
        f"on every placement, more than the {have / 2**30:,.1f} GiB of {cluster.name!r} "
        f"({cluster.num_devices} devices) together"
    )


def forward_of(graph: CompGraph) -> np.ndarray:
    """``int64[n]``: for each backward node its forward node (``"bwd:" + name``, else the
    forward node of its colocation group when there is exactly one), for a forward node
    itself, else -1."""
    n = graph.num_nodes
    out = np.full(n, -1, np.int64)
    index = {str(nm): i for i, nm in enumerate(graph.name)}
    fwd_in_group: dict[int, list[int]] = {}
    for i in np.flatnonzero(graph.kind == 0):
        out[i] = i
        fwd_in_group.setdefault(int(graph.group[i]), []).append(int(i))
    for i in np.flatnonzero(graph.kind == 1):
        nm = str(graph.name[i])
        j = index.get(nm[4:], -1) if nm.startswith("bwd:") else -1
        if j >= 0 and graph.kind[j] == 0:
            out[i] = j
            continue
        cands = fwd_in_group.get(int(graph.group[i]), [])
        if len(cands) == 1:
            out[i] = cands[0]
    return out


__all__ = ["OBJECTIVES", "SCHEDULES", "Simulator", "forward_of"]


def _check_runnable(graph: CompGraph, cluster: Cluster, dur: np.ndarray) -> None:
    """Refuse a graph that no placement on ``cluster`` can run or that it cannot time: a node
    with no kernel on any of its devices (the lower bound was inf and every plan cost the
    same), or measured times for none of its device kinds beside no FLOPs and no bytes (a
    Fiddle graph on a GPU cluster scored 0 s; both found by fuzzing)."""
    bad = np.flatnonzero(np.isinf(dur).all(axis=1)) if len(dur) else []
    kinds = sorted({d.kind for d in cluster.devices})
    if len(bad):
        names = ", ".join(repr(str(graph.name[i])) for i in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ValueError(
            f"Simulator: node(s) {names}{more} of {graph.meta.get('name', '?')!r} can run on no "
            f"device of {cluster.name!r} (device kinds {kinds}): no placement can run the graph"
        )
    measured = sorted(graph.times)
    if (
        measured
        and not set(measured) & set(kinds)
        and not graph.flops.any()
        and not graph.bytes_accessed.any()
    ):
        raise ValueError(
            f"Simulator: graph {graph.meta.get('name', '?')!r} has measured times for device "
            f"kinds {measured} only and no FLOPs or bytes to estimate others, but "
            f"{cluster.name!r} has kinds {kinds}: every node would take 0 s"
        )
