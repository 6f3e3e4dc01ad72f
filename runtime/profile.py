"""Measure this machine: compute roofline figures of one process and gloo point-to-point latency/bandwidth."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import fx

from runtime.dist import init_distributed, teardown
from runtime.launch import rank_context, spawn


def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_device(
    *, threads: int = 1, n: int = 512, copy_mb: int = 64, repeats: int = 5
) -> dict[str, float]:
    """Roofline figures of one CPU process with ``threads`` threads.

    ``peak_flops`` from an ``n x n`` float32 matmul (2 n^3 flops), ``mem_bw`` from a
    ``copy_mb`` MiB tensor copy (read + write bytes), ``launch_overhead`` from a
    one-element add. ``efficiency`` is 1: the matmul rate is what kernels reach here.
    """
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    t_mm = _best_time(lambda: a @ b, repeats)
    src = torch.empty(copy_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    t_cp = _best_time(lambda: dst.copy_(src), repeats)
    x = torch.ones(1)
    t_ov = min(_best_time(lambda: x.add(x), 50) for _ in range(3))
    return {
        "peak_flops": 2.0 * n**3 / t_mm,
        "mem_bw": 2.0 * src.numel() * 4 / t_cp,
        "efficiency": 1.0,
        "launch_overhead": t_ov,
    }


def _matmul_rate(n: int, seconds: float, core: int | None, start: Any, out: Any) -> None:
    """Child of :func:`measure_concurrent_speed`: matmul FLOP/s of one process (one thread)."""
    torch.set_num_threads(1)
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start.wait()
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        k += 1
    out.put(2.0 * n**3 * k / (time.perf_counter() - t0))


def measure_concurrent_speed(
    counts: Sequence[int] = (1, 2, 3, 4), *, n: int = 256, seconds: float = 1.5
) -> dict[str, float]:
    """Per-process speed with ``k`` single-threaded processes computing at once, relative to one alone.

    For each ``k`` in ``counts``, ``k`` processes run ``n x n`` matmuls for
    ``seconds`` (pinned one per core when the machine has at least ``k`` cores);
    the result maps ``str(k)`` to the median per-process rate divided by the rate
    of a single process. On a machine with ``C`` free cores this is about
    ``min(1, C / k)``; on a shared or hyper-threaded machine it is lower.
    """
    if not counts or min(counts) < 1:
        raise ValueError(f"measure_concurrent_speed: counts must be >= 1, got {list(counts)}")
    ctx = rank_context()  # forked from the fork server: no interpreter start per process
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    rates: dict[int, float] = {}
    for k in sorted(set(int(c) for c in counts) | {1}):
        start, out = ctx.Barrier(k), ctx.Queue()  # all k start computing together
        pin = len(cores) >= k
        procs = [
            ctx.Process(
                target=_matmul_rate, args=(n, seconds, cores[i] if pin else None, start, out)
            )
            for i in range(k)
        ]
        for pr in procs:
            pr.start()
        got = [out.get(timeout=120 + seconds) for _ in procs]
        for pr in procs:
            pr.join()
        rates[k] = float(np.median(got))
    return {str(k): rates[k] / rates[1] for k in sorted(rates) if k in set(counts) or k == 1}


def _p2p_worker(sizes: Sequence[int], repeats: int) -> list[float]:
    info = init_distributed("gloo")
    try:
        out = []
        for size in sizes:
            buf = torch.zeros(max(1, size // 4))
            times = []
            for _ in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                if info.rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                times.append((time.perf_counter() - t0) / 2)
            out.append(float(np.min(times[1:])))  # first round is warm-up; min resists load
        return out
    finally:
        teardown()


def _handoff_worker(repeats: int, work: int) -> list[float]:
    info = init_distributed("gloo")
    torch.set_num_threads(1)
    try:
        a = torch.randn(work, work)
        buf = torch.zeros(1)
        t_work = _best_time(lambda: a @ a, 5)
        out = []
        dist.barrier()
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            if info.rank == 0:
                a @ a
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                a @ a
                dist.send(buf, 0)
            out.append(time.perf_counter() - t0)
        # rank 0's round trip = two matmuls + two hand-offs; first round is warm-up
        return [max(0.0, (t - 2 * t_work) / 2) for t in out[1:]]
    finally:
        teardown()


def measure_handoff(repeats: int = 50, work: int = 128) -> dict[str, float]:
    """Mean one-way hand-off time of a tiny message between two ranks that compute in between.

    Rank 0 computes (an ``work x work`` matmul), sends, waits; rank 1 receives,
    computes, replies. The round trip minus the two computations, halved, is what
    one blocking ``recv`` costs the runtime when its peer finishes: gloo latency plus
    the time a descheduled process takes to run again. On a loaded machine this is
    far above the idle ping-pong minimum of :func:`measure_p2p`. Returns ``mean``,
    ``median`` and ``min`` seconds.
    """
    t = np.asarray(spawn(_handoff_worker, 2, (repeats, work), timeout_s=300)[0])
    return {"mean": float(t.mean()), "median": float(np.median(t)), "min": float(t.min())}


def _overhead_worker(nbytes: int, repeats: int, work: int, rounds: int) -> dict[str, list[float]]:
    info = init_distributed("gloo")
    torch.set_num_threads(1)
    try:
        a = torch.randn(work, work)
        msg = torch.randn(max(1, nbytes // 4))
        K = repeats
        out: dict[str, list[float]] = {"loop": [], "send": [], "recv": []}

        def compute_loop() -> float:
            t0 = time.perf_counter()
            for _ in range(K):
                a @ a
            return time.perf_counter() - t0

        for _ in range(rounds):
            # C: both ranks compute K matmuls at once, no messages (the baseline)
            dist.barrier()
            out["loop"].append(compute_loop())
            # A: rank 0 computes and isends after each matmul (as OpLevelRunner sends a
            # partition's outputs); rank 1 has posted its receives and computes meanwhile
            dist.barrier()
            if info.rank == 0:
                t0 = time.perf_counter()
                works = []
                for k in range(K):
                    a @ a
                    t = msg.detach().contiguous()
                    works.append((dist.isend(t, dst=1, tag=k), t))
                out["send"].append(time.perf_counter() - t0)
                for w, _ in works:
                    w.wait()
            else:
                bufs = [torch.empty_like(msg) for _ in range(K)]
                works = [dist.irecv(b, src=0, tag=k) for k, b in enumerate(bufs)]
                compute_loop()
                for w in works:
                    w.wait()
            # B: rank 0 isends K messages up front and computes; rank 1 receives each
            # (blocking, into a new buffer, as OpLevelRunner does) before a matmul
            dist.barrier()
            if info.rank == 0:
                works = [(dist.isend(msg, dst=1, tag=K + k), None) for k in range(K)]
                compute_loop()
                for w, _ in works:
                    w.wait()
            else:
                t0 = time.perf_counter()
                for k in range(K):
                    buf = torch.empty_like(msg)
                    dist.recv(buf, src=0, tag=K + k)
                    buf.detach().requires_grad_(True)
                    a @ a
                out["recv"].append(time.perf_counter() - t0)
        return out
    finally:
        teardown()


def measure_transfer_overhead(
    nbytes: int = 1 << 17, repeats: int = 40, work: int = 192, rounds: int = 5
) -> dict[str, float]:
    """Compute-stream cost of one transfer on each endpoint (LogP's ``o``), seconds.

    Two single-threaded gloo ranks compute ``repeats`` ``work x work`` matmuls each,
    both at once. Per round: (C) no messages; (A) rank 0 ``isend``s a ``nbytes``
    message after every matmul while rank 1, its receives posted, computes; (B)
    rank 0 ``isend``s every message up front and computes while rank 1 does a
    blocking ``recv`` into a fresh buffer before every matmul (the messages are
    already on their way, so the wait for the sender is small). ``send`` = (A - C)
    / repeats on rank 0, ``recv`` = (B - C) / repeats on rank 1, each the median
    over ``rounds`` (clipped at 0); ``mean`` is their average, the per-endpoint
    ``Device.transfer_overhead``. Both ranks compute throughout, as in a pipeline,
    so gloo's background threads compete for the cores as they do there.
    """
    res = spawn(_overhead_worker, 2, (nbytes, repeats, work, rounds), timeout_s=300)
    r0, r1 = res
    send = [max(0.0, (t - c) / repeats) for t, c in zip(r0["send"], r0["loop"])]
    recv = [max(0.0, (t - c) / repeats) for t, c in zip(r1["recv"], r1["loop"])]
    s, r = float(np.median(send)), float(np.median(recv))
    return {"send": s, "recv": r, "mean": (s + r) / 2, "nbytes": float(nbytes)}


def fit_latency_bandwidth(sizes: Sequence[int], times: Sequence[float]) -> tuple[float, float]:
    """Least-squares fit of ``t = latency + bytes / bandwidth`` (both clipped positive)."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    A = np.stack([np.ones_like(x), x], axis=1)
    (lat, inv_bw), *_ = np.linalg.lstsq(A, y, rcond=None)
    lat = max(float(lat), float(y.min()) * 0.5, 1e-7)
    inv_bw = max(float(inv_bw), 1e-15)
    return lat, 1.0 / inv_bw


def measure_p2p(
    sizes: Sequence[int] = (4, 4096, 65536, 1 << 20, 4 << 20, 16 << 20), repeats: int = 10
) -> dict[str, Any]:
    """One-way gloo send/recv time between two processes (half the best round trip) per size, and the fit."""
    times = spawn(_p2p_worker, 2, (list(sizes), repeats), timeout_s=300)[0]
    lat, bw = fit_latency_bandwidth(sizes, times)
    return {"latency": lat, "bandwidth": bw, "sizes": list(sizes), "times": times}


class _OpTimer(fx.Interpreter):
    """Runs an FX module, keeping each ``call_function`` op's best wall time (seconds) in ``best``."""

    def __init__(self, gm: fx.GraphModule, best: dict[str, float]) -> None:
        super().__init__(gm)
        self.best = best

    def run_node(self, n: fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        t0 = time.perf_counter()
        out = super().run_node(n)
        dt = time.perf_counter() - t0
        self.best[n.name] = min(self.best.get(n.name, float("inf")), dt)
        return out


def measure_ops(model: dict[str, Any], *, repeats: int = 5, threads: int = 1) -> dict[str, float]:
    """Forward time (microseconds, best of ``repeats``) of every op of the model's exported program."""

    from runtime.dist import seed_everything
    from runtime.model import load_model
    from runtime.program import export_with_loss

    torch.set_num_threads(threads)
    seed_everything(0)
    zm = load_model(model)
    gm = export_with_loss(zm.module, zm.example_inputs, zm.loss_fn)
    best: dict[str, float] = {}
    with torch.no_grad():
        for _ in range(repeats + 1):
            _OpTimer(gm, best).run(*zm.example_inputs)
    return {k: v * 1e6 for k, v in best.items()}


def write_calibration(
    device: dict[str, float],
    link: dict[str, Any],
    path: str | Path,
    memory: float | None = None,
    concurrency: dict[str, float] | None = None,
    runtime: dict[str, dict[str, Any]] | None = None,
    hybrid: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the ``cpu_N`` calibration JSON read by ``graphs.cpu_cluster.cpu_cluster``.

    ``concurrency`` (from :func:`measure_concurrent_speed`), ``runtime`` (from
    :func:`calibrate_runtime`) and ``hybrid`` (from
    :func:`runtime.hybrid_profile.calibrate_hybrid_fitted`) are stored under those keys.
    """
    dev = dict(device)
    if memory is not None:
        dev["memory"] = float(memory)
    cal = {
        "device": dev,
        "link": {"bandwidth": float(link["bandwidth"]), "latency": float(link["latency"])},
        "measured": {
            "p2p_sizes": link.get("sizes"),
            "p2p_times": link.get("times"),
            "p2p_latency": float(link.get("latency_p2p", link["latency"])),
            "handoff": link.get("handoff"),
            "time": time.time(),
        },
    }
    if concurrency is not None:
        cal["concurrency"] = {str(k): float(v) for k, v in concurrency.items()}
    if runtime is not None:
        cal["runtime"] = {str(k): dict(v) for k, v in runtime.items()}
    if hybrid is not None:
        cal["hybrid"] = dict(hybrid)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(cal, indent=1))
    return cal


def measure_graph_times(
    graph: Any,
    model: dict[str, Any],
    *,
    microbatches: int = 1,
    repeats: int = 5,
    threads: int = 1,
    kind: str = "cpu",
) -> Any:
    """``graph`` with ``times[kind]`` measured on this process (microseconds, whole batch).

    The model runs at microbatch size in one process. Forward: every FX op is timed
    (best of ``repeats``, autograd recording on) and summed into the graph node that
    holds it (``meta["members"]`` for coarse graphs). Backward: the measured
    backward pass is shared among backward nodes in proportion to their forward
    node's time. Optimizer: the measured Adam step is shared among optimizer nodes
    in proportion to ``param_bytes``. Forward and backward times are multiplied by
    ``microbatches`` because the simulator divides their times by M; optimizer times
    are not (an optimizer node runs once per step and the simulator does not divide).
    """

    from graphs.compgraph import BWD, FWD, OPT
    from runtime.dist import seed_everything
    from runtime.model import load_model
    from runtime.program import export_with_loss
    from runtime.spec import forward_names

    torch.set_num_threads(threads)
    seed_everything(0)
    zm = load_model(model)
    M = int(microbatches)
    inputs = tuple(x.chunk(M, dim=0)[0] for x in zm.example_inputs)
    gm = export_with_loss(zm.module, inputs, zm.loss_fn)
    op: dict[str, float] = {}
    opt = torch.optim.Adam(gm.parameters(), lr=1e-4)
    t_bwd, t_opt = float("inf"), float("inf")
    for _ in range(repeats + 1):
        loss = _OpTimer(gm, op).run(*inputs)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        t_bwd, t_opt = min(t_bwd, t1 - t0), min(t_opt, t2 - t1)
    n = graph.num_nodes
    t = np.zeros(n)
    fwd_of = {}
    for i, names in forward_names(graph):
        t[i] = sum(op.get(m, 0.0) for m in names)
        fwd_of[graph.group[i]] = i
    bwd = np.flatnonzero(graph.kind == BWD)
    w = np.array([t[fwd_of.get(graph.group[j], j)] for j in bwd])
    if len(bwd) and w.sum() > 0:
        t[bwd] = t_bwd * w / w.sum()
    optn = np.flatnonzero(graph.kind == OPT)
    pb = (
        graph.param_bytes[[fwd_of.get(graph.group[j], j) for j in optn]]
        if len(optn)
        else np.zeros(0)
    )
    if len(optn) and pb.sum() > 0:
        t[optn] = t_opt * pb / pb.sum()
    assert FWD == 0
    times = dict(graph.times)
    times[kind] = t * 1e6 * np.where(graph.kind == OPT, 1, M)
    return graph.replace(times=times)


def node_owner(graph: Any) -> np.ndarray:
    """Per node, the node whose device it takes: a backward node its forward node, an
    optimizer node its group's forward node (where the runtime runs them)."""
    from placement_env.oracles.simulator import forward_of

    fwd = forward_of(graph)
    own = np.where(fwd >= 0, fwd, np.arange(graph.num_nodes))
    for j in np.flatnonzero(graph.kind == 2):
        same = np.flatnonzero((graph.group == graph.group[j]) & (graph.kind == 0))
        own[j] = same[0] if len(same) else j
    return own


def calibration_groups(ngroups: int, N: int) -> list[np.ndarray]:
    """Per-group devices of the runtime-calibration plans on N devices: contiguous blocks
    (N - 1 cuts; unequal where the groups divide evenly, so not the balanced split), a
    device change every second group, and a device change at every group.
    ``scripts/bench_fidelity.py`` keeps them out of the plans it evaluates."""
    if ngroups < N:
        raise ValueError(f"calibration plans for {N} devices need >= {N} groups, got {ngroups}")
    sizes = np.full(N, ngroups // N)
    sizes[: ngroups % N] += 1
    if ngroups % N == 0 and sizes[-1] > 1:
        sizes[0] += 1
        sizes[-1] -= 1
    g = np.arange(ngroups)
    return [np.repeat(np.arange(N), sizes), (g // 2) % N, g % N]


def calibration_placements(graph: Any, n: int) -> list[np.ndarray]:
    """Per-node placements of :func:`calibration_groups` for ``graph`` on ``n`` devices
    (groups in ``graph.group_index()`` order; backward and optimizer nodes with their
    forward node, as the runtime runs them)."""
    if n < 2:
        raise ValueError(f"calibration placements need >= 2 devices, got {n}")
    _, inv = graph.group_index()
    own = node_owner(graph)
    return [pg[inv][own] for pg in calibration_groups(int(inv.max()) + 1, n)]


def fit_runtime_slowdown(
    node_time: Sequence[float],
    transfers: Sequence[float],
    compute: Sequence[float],
    overhead: float | None = None,
) -> tuple[float, float, float]:
    """Least-squares ``compute = factor * node_time + overhead * transfers`` (both >= 0).

    One sample per rank of a calibration run: ``node_time`` is the rank's share of
    the one-process per-node times (seconds per step), ``transfers`` the number of
    transfer endpoints the simulator charges on it, ``compute`` the runtime's own
    compute timer. With ``overhead`` (seconds per endpoint, e.g. from
    :func:`measure_transfer_overhead`) only the factor is fitted; a few calibration
    plans pin the overhead down poorly (fits of single rounds ranged 0-330 us here),
    the factor well. If the held cost leaves no compute for the factor to explain
    (a tiny model whose transfers cost more than its ops), both are fitted instead,
    with a warning; if even then the transfers explain all of the compute (the factor
    comes out 0), the factor is kept at 1 and the cost alone is fitted, with a warning.
    The factor returned is always > 0. Returns ``(factor, overhead_seconds, mape)``, ``mape`` the fit's
    mean absolute percentage error over the samples.
    """
    from scipy.optimize import nnls

    a = np.column_stack([np.asarray(node_time, float), np.asarray(transfers, float)])
    y = np.asarray(compute, float)
    if a.shape[0] < 2 or a.shape[0] != y.shape[0]:
        raise ValueError(
            f"fit_runtime_slowdown needs >= 2 samples of equal length, got {a.shape[0]} "
            f"node times and {y.shape[0]} compute times"
        )
    if overhead is not None:
        if overhead < 0:
            raise ValueError(f"fit_runtime_slowdown: overhead must be >= 0, got {overhead}")
        rest = y - overhead * a[:, 1]
        f = float(a[:, 0] @ rest / max(a[:, 0] @ a[:, 0], 1e-300))
        coef = np.array([f, float(overhead)])
        if f <= 0:
            import warnings

            warnings.warn(
                f"fit_runtime_slowdown: an endpoint cost of {overhead * 1e6:.0f} us per transfer "
                "explains more than the measured compute; fitting factor and cost together",
                RuntimeWarning,
                stacklevel=2,
            )
    if overhead is None or coef[0] <= 0:
        if np.linalg.matrix_rank(a) < 2:
            raise ValueError(
                "fit_runtime_slowdown: the calibration plans must differ in their transfers per "
                "unit of compute (e.g. one cut and many cuts), else factor and overhead cannot "
                "be told apart"
            )
        coef, _ = nnls(a, y)
        if coef[0] <= 0:
            # the transfers alone explain the compute (a calibration model whose ops are
            # smaller than the timer's noise): no slowdown can be read off these runs, and a
            # factor of 0 would say compute is free (and be refused when the file is read).
            # Keep the one-process times (factor 1) and fit the endpoint cost to what is left.
            import warnings

            t = a[:, 1]
            o = max(0.0, float(t @ (y - a[:, 0]) / max(t @ t, 1e-300)))
            warnings.warn(
                "fit_runtime_slowdown: the per-transfer cost explains all the measured compute, so "
                "these runs cannot measure a slowdown; keeping factor 1 (the one-process times) "
                f"and fitting the cost alone ({o * 1e6:.0f} us per transfer). Calibrate with a "
                "larger model for a measured factor",
                RuntimeWarning,
                stacklevel=2,
            )
            coef = np.array([1.0, o])
    mape = float(np.mean(np.abs(a @ coef - y) / np.maximum(y, 1e-12)) * 100)
    return float(coef[0]), float(coef[1]), mape


def runtime_compute_shares(graph: Any, cluster: Any, placement: Any, microbatches: int) -> tuple:
    """Per device: seconds of node time and the number of transfer endpoints the
    ``in_order`` simulator charges (the regressors of :func:`fit_runtime_slowdown`)."""
    from placement_env.oracles.simulator import Simulator

    def busy(o: float) -> np.ndarray:
        c = cluster.with_endpoint_costs(o)
        sim = Simulator(graph, c, microbatches=microbatches, schedule="in_order")
        return np.asarray(sim.evaluate(np.asarray(placement)).device_busy, float)

    b0 = busy(0.0)
    return b0, np.rint((busy(1e-3) - b0) / 1e-3)


def fit_runtime_runs(
    runs: Sequence[dict[str, Any]],
    timed: Any,
    cluster: Any,
    microbatches: int,
    overhead: float | None = None,
) -> dict[str, Any]:
    """Fit :func:`fit_runtime_slowdown` to executed calibration runs.

    Each run is ``{"placement": [...], "devices": [...], "compute": [...]}`` (the
    placement executed, the cluster device of each rank, each rank's compute seconds
    per step); the regressors come from ``timed`` (one-process per-node times) through
    :func:`runtime_compute_shares`, so runs can be refitted with later per-node times.
    ``overhead`` fixes the per-endpoint cost (see :func:`fit_runtime_slowdown`).
    """
    node, transfers, compute = [], [], []
    shares: dict[tuple[int, ...], tuple] = {}  # rounds repeat the same few placements
    for run in runs:
        key = tuple(run["placement"])
        if key not in shares:
            shares[key] = runtime_compute_shares(timed, cluster, run["placement"], microbatches)
        b, n = shares[key]
        for dev, c in zip(run["devices"], run["compute"]):
            node.append(float(b[dev]))
            transfers.append(float(n[dev]))
            compute.append(float(c))
    f, o, mape = fit_runtime_slowdown(node, transfers, compute, overhead)
    procs = sorted({len(run["devices"]) for run in runs})
    return {
        "processes": procs,
        "factor": f,
        "transfer_overhead": o,
        "fit_mape": mape,
        "samples": len(compute),
        "overhead_fixed": overhead is not None and o == overhead,
    }


def measure_runtime_slowdown(
    graph: Any,
    cluster: Any,
    placements: Sequence[Any],
    *,
    timed: Any,
    model: dict[str, Any],
    microbatches: int,
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
    overhead: float | None = None,
) -> dict[str, Any]:
    """How much slower the runtime computes with several processes at once, and what
    each transfer costs the compute stream, measured on the runtime itself.

    Executes every calibration placement (op-level, ``runtime.execute_many``: one
    process per device it uses, all placements one after another in one launch, as
    the plans one then measures should be) and records each rank's compute timer.
    ``timed`` is ``graph`` with one-process per-node times (:func:`measure_graph_times`). The per-rank samples are fitted by
    :func:`fit_runtime_runs`: the returned ``factor`` multiplies the one-process node
    times of plans with that many processes, and ``transfer_overhead`` is the
    per-endpoint ``Device.transfer_overhead`` (fixed to ``overhead`` if given). The
    calibration placements should not be the plans one then evaluates. ``runs`` holds what was executed, for pooling
    several calls and refitting them.
    """
    from graphs.plan import Plan
    from runtime.execute import execute_many

    plans, procs = [], set()
    for placement in placements:
        p = np.asarray(placement, np.int64)
        used = sorted(set(p.tolist()))
        procs.add(len(used))
        if len(used) < 2:
            raise ValueError(
                "measure_runtime_slowdown: a calibration placement must use >= 2 devices, "
                f"this one uses {used}"
            )
        plans.append(
            Plan.for_graph(
                p, graph, cluster, microbatches=microbatches, schedule="gpipe",
                meta={"model": model},
            )
        )  # fmt: skip
    if len(procs) != 1:
        raise ValueError(
            f"measure_runtime_slowdown: calibration placements use {sorted(procs)} processes; "
            "give placements with one process count per call"
        )
    results = execute_many(plans, graph, cluster, steps=steps, warmup=warmup, optimizer="adam",
                           timeout_s=timeout_s)  # fmt: skip
    runs = [
        {"placement": plan.placement.tolist(), "devices": list(res.devices),
         "compute": list(res.compute)}
        for plan, res in zip(plans, results)
    ]  # fmt: skip
    return dict(fit_runtime_runs(runs, timed, cluster, microbatches, overhead), runs=runs)


def calibrate_runtime(
    model: dict[str, Any],
    devices: Sequence[int] = (2,),
    *,
    microbatches: int = 4,
    rounds: int = 6,
    steps: int = 5,
    calibration: dict[str, Any] | None = None,
    overhead: float | None = None,
) -> dict[str, dict[str, Any]]:
    """The runtime's multi-process compute factor and per-transfer cost for each count in
    ``devices``, measured on ``model`` (a ``runtime.model.load_model`` spec).

    Per-node times of the model are measured in one process
    (:func:`measure_graph_times`); then, ``rounds`` times, the :func:`calibration_placements`
    on n devices are executed (:func:`measure_runtime_slowdown`) and all runs are fitted
    together (:func:`fit_runtime_runs`; ``overhead`` fixes the per-transfer cost, e.g.
    :func:`measure_transfer_overhead`'s, and only the factor is fitted). Returns ``str(n) -> fit`` (``factor``,
    ``transfer_overhead``, ``fit_mape``, ``samples``, ``model``, ``microbatches``), the
    ``runtime`` entry of the calibration file that ``graphs.cpu_cluster`` reads.
    """
    from graphs.cpu_cluster import cpu_cluster
    from runtime.model import graph_for_model

    graph = graph_for_model(model)
    timed = measure_graph_times(graph, model, microbatches=microbatches)
    out: dict[str, dict[str, Any]] = {}
    base = {k: v for k, v in (calibration or {}).items() if k != "runtime"}
    for n in devices:
        cluster = cpu_cluster(int(n), calibration=base)
        placements = calibration_placements(graph, int(n))
        runs: list[dict[str, Any]] = []
        for r in range(rounds):
            fit = measure_runtime_slowdown(
                graph, cluster, placements, timed=timed, model=model,
                microbatches=microbatches, steps=steps, overhead=overhead,
            )  # fmt: skip
            runs += fit["runs"]
            print(
                f"runtime calibration cpu_{n}, round {r + 1}/{rounds}: factor "
                f"{fit['factor']:.3f}, endpoint cost {fit['transfer_overhead'] * 1e6:.0f} us",
                flush=True,
            )
        fit = fit_runtime_runs(runs, timed, cluster, microbatches, overhead)
        out[str(n)] = dict(fit, model=dict(model), microbatches=int(microbatches))
    return out


def calibrate_hybrid(model: dict, **options: Any) -> dict[str, Any]:
    """The hybrid cost model's calibration of this machine: see
    :func:`runtime.hybrid_profile.calibrate_hybrid` (``cpu_cluster(n, calibration={"hybrid":
    ...})`` then scores hybrid plans with
    :class:`placement_env.oracles.hybrid_cpu.CpuHybridModel`)."""
    from runtime.hybrid_profile import calibrate_hybrid as calibrate

    return calibrate(model, **options)
