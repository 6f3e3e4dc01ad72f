"""Calibrate the hybrid cost model to this CPU: what ``CpuHybridModel`` needs, measured on gloo processes.

:func:`calibrate_hybrid` measures, on this machine and under its present load:

* ``segments``: CPU seconds (``time.process_time``: every thread of the process, so
  independent of how many processes share the cores) of the forward and of the backward
  of each program segment of the model -- embeddings, each transformer block, head + loss
  -- at each microbatch size, tensor-parallel degree and recomputation mode, run by the
  runtime's own code (``export_with_loss``, ``parallelize_program``, ``stage_modules``,
  :class:`runtime.hybrid.HybridChunk`) in ``t`` gloo processes; a block's backward under
  recomputation includes its recomputed forward. Also the bytes each segment keeps for
  its backward (saved-tensor hooks) and the parameters of each segment on one rank.
* ``collectives``: gloo all-reduce, all-gather, reduce-scatter (over ``k`` processes) and
  p2p (2 processes) wall and CPU seconds per call by message size, fitted as
  ``latency + bytes / bandwidth``.
* ``speed``: per-process speed with ``k`` single-threaded processes computing at once
  (:func:`runtime.profile.measure_concurrent_speed`): ``k x speed`` is how many cores the
  processes get now (2 at most here, less when other jobs run).
* ``optimizer``: CPU seconds per parameter of an Adam step.
* ``memory``: resident bytes of a worker process after importing the runtime and joining
  the process group (``process``), and what building the model and exporting its program
  adds beyond the model's own weights (``build_extra``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from graphs.schema import is_whole
from runtime.dist import init_distributed, teardown
from runtime.launch import spawn

#: Message sizes (bytes) of the collective measurements.
COLLECTIVE_SIZES = (4096, 65536, 524288, 2097152, 8388608)


def _rss() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024.0
    return 0.0


def _saved_bytes() -> tuple[Any, list[int]]:
    """A saved-tensors hook context counting the bytes of distinct storages kept for backward."""
    seen: set[int] = set()
    total = [0]

    def pack(x: torch.Tensor) -> torch.Tensor:
        t = x.to_local() if hasattr(x, "to_local") else x
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            if key not in seen:
                seen.add(key)
                total[0] += st.nbytes()
        except (RuntimeError, NotImplementedError):
            total[0] += t.numel() * t.element_size()
        return x

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), total


def _time_chain(
    chunks: Sequence[Any], mb: tuple[Any, ...], mesh: Any, fwd: Any, bwd: Any, kept: Any
) -> None:
    """Forward each chunk on what the previous returned, then backward them in reverse,
    writing each one's CPU seconds into ``fwd`` / ``bwd`` and its saved bytes into ``kept``."""
    ins: tuple[Any, ...] = mb
    saved = []
    for k, ch in enumerate(chunks):
        xs = tuple(
            x.detach().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
            for x in ins
        )
        hooks, total = _saved_bytes()
        if mesh is not None:
            dist.barrier()
        c0 = time.process_time()
        with hooks:
            outs = ch(*xs)
        fwd[k] = time.process_time() - c0
        kept[k] = total[0]
        saved.append((xs, outs))
        ins = outs
    grads: list[Any] | None = None
    for k in reversed(range(len(chunks))):
        xs, outs = saved[k]
        if mesh is not None:
            dist.barrier()
        c0 = time.process_time()
        if grads is None:
            outs[0].backward()
        else:
            pairs = [
                (o, g)
                for o, g in zip(outs, grads)
                if isinstance(o, torch.Tensor) and o.requires_grad and g is not None
            ]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        bwd[k] = time.process_time() - c0
        grads = [x.grad if isinstance(x, torch.Tensor) else None for x in xs]


def _segment_worker(
    model: dict[str, Any], micro_sizes: Sequence[int], recomputes: Sequence[str], repeats: int
) -> dict[str, Any]:
    """One of ``t`` ranks: time each segment's forward / backward (CPU seconds, median)."""
    import runtime.worker  # noqa: F401 - the worker's imports count in the process baseline
    from runtime.dist import seed_everything
    from runtime.hybrid import HybridChunk, block_list, segment_of_nodes
    from runtime.model import load_model
    from runtime.pipeline import stage_modules
    from runtime.program import export_with_loss
    from runtime.tensor_parallel import implicit_replication, parallelize_program

    torch.set_num_threads(1)
    info = init_distributed("gloo")
    t = info.world_size
    try:
        base = _rss()
        seed_everything(0)
        zm = load_model(model)
        weights = sum(p.numel() * p.element_size() for p in zm.module.parameters())
        mesh = None
        if t > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (t,))
        out: dict[str, Any] = {"process": base, "segments": {}}
        for b in micro_sizes:
            mb = tuple(x[:b] for x in zm.example_inputs)
            gm = export_with_loss(zm.module, mb, zm.loss_fn)
            if b == micro_sizes[0]:
                out["build_extra"] = max(0.0, _rss() - base - weights)
            blocks, n_layer = block_list(gm)
            seg = segment_of_nodes(gm, blocks, n_layer)
            if mesh is not None:
                _, renamed = parallelize_program(gm, mesh, [blocks])
                seg.update({new: seg[old] for new, old in renamed.items() if old in seg})
            segments = stage_modules(gm, seg, n_layer + 2)
            for rc in recomputes:
                chunks = [
                    HybridChunk([s], [0 < k <= n_layer], tp_mesh=mesh, recompute=rc)
                    for k, s in enumerate(segments)
                ]
                params = [
                    sum(
                        (p.to_local() if hasattr(p, "to_local") else p).numel()
                        for p in ch.parameters()
                    )
                    for ch in chunks
                ]
                fwd = np.zeros((repeats + 1, len(chunks)))
                bwd = np.zeros_like(fwd)
                kept = np.zeros(len(chunks))
                for rep in range(repeats + 1):
                    ctx: Any = implicit_replication() if mesh is not None else nullcontext()
                    with ctx:
                        _time_chain(chunks, mb, mesh, fwd[rep], bwd[rep], kept)
                    for ch in chunks:
                        ch.zero_grad(set_to_none=True)
                out["segments"][f"{b}/{rc}"] = {
                    "fwd": np.median(fwd[1:], axis=0).tolist(),
                    "bwd": np.median(bwd[1:], axis=0).tolist(),
                    "kept": kept.tolist(),
                    "params": params,
                }
        out["n_layer"] = n_layer
        return out
    finally:
        teardown()


def measure_segments(
    model: dict[str, Any],
    tps: Sequence[int],
    micro_sizes: Sequence[int],
    recomputes: Sequence[str] = ("none", "full"),
    *,
    repeats: int = 3,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Per-segment forward / backward CPU seconds for each tensor-parallel degree in ``tps``
    (``str(t) -> {"b/recompute" -> {"fwd", "bwd", "kept", "params"}}``, rank 0's figures,
    the ranks' CPU seconds averaged), plus the process baseline and build residue."""
    out: dict[str, Any] = {}
    for t in tps:
        ranks = spawn(
            _segment_worker, t, (model, list(micro_sizes), list(recomputes), repeats),
            timeout_s=timeout_s,
        )  # fmt: skip
        res = ranks[0]
        for key, seg in res["segments"].items():
            for f in ("fwd", "bwd"):
                seg[f] = np.mean([r["segments"][key][f] for r in ranks], axis=0).tolist()
        res["process"] = float(np.median([r["process"] for r in ranks]))
        res["build_extra"] = float(np.median([r["build_extra"] for r in ranks]))
        out[str(t)] = res
    return out


def _collective_worker(sizes: Sequence[int], repeats: int) -> dict[str, Any]:
    """Wall and CPU seconds (median) per gloo collective over the whole world, by size."""
    torch.set_num_threads(1)
    info = init_distributed("gloo")
    k = info.world_size
    try:
        res: dict[str, Any] = {}
        for name in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
            if name == "p2p" and k != 2:
                continue
            walls, cpus = [], []
            for size in sizes:
                n = max(k, size // 4 // k * k)
                full = torch.ones(n)
                part = torch.ones(n // k)
                w, c = [], []
                for _ in range(repeats + 1):
                    dist.barrier()
                    t0, c0 = time.perf_counter(), time.process_time()
                    if name == "all_reduce":
                        dist.all_reduce(full)
                    elif name == "all_gather":
                        dist.all_gather_single(full, part)
                    elif name == "reduce_scatter":
                        dist.reduce_scatter_single(part, full)
                    elif info.rank == 0:
                        dist.send(full, 1)
                    else:
                        dist.recv(full, 0)
                    w.append(time.perf_counter() - t0)
                    c.append(time.process_time() - c0)
                walls.append(float(np.median(w[1:])))
                cpus.append(float(np.median(c[1:])))
            res[name] = {"wall": walls, "cpu": cpus}
        return res
    finally:
        teardown()


def fit_line(sizes: Sequence[float], times: Sequence[float]) -> dict[str, float]:
    """Least-squares ``time = latency + bytes * per_byte`` (both clipped at 0)."""
    x, y = np.asarray(sizes, dtype=np.float64), np.asarray(times, dtype=np.float64)
    A = np.stack([np.ones_like(x), x], axis=1)
    (lat, per), *_ = np.linalg.lstsq(A, y, rcond=None)
    return {"latency": float(max(lat, 0.0)), "per_byte": float(max(per, 0.0))}


def measure_collectives(
    worlds: Sequence[int] = (2, 4, 8),
    sizes: Sequence[int] = COLLECTIVE_SIZES,
    *,
    repeats: int = 5,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """``str(k) -> {collective -> {"wall": fit, "cpu": fit, "sizes", raw}}`` for each world size."""
    out: dict[str, Any] = {}
    for k in worlds:
        ranks = spawn(_collective_worker, k, (list(sizes), repeats), timeout_s=timeout_s)
        per: dict[str, Any] = {}
        for name in ranks[0]:
            wall = np.max([r[name]["wall"] for r in ranks], axis=0)  # the slowest rank
            cpu = np.mean([r[name]["cpu"] for r in ranks], axis=0)
            per[name] = {
                "sizes": list(sizes),
                "wall_raw": wall.tolist(),
                "cpu_raw": cpu.tolist(),
                "wall": fit_line(sizes, wall),
                "cpu": fit_line(sizes, cpu),
            }
        out[str(k)] = per
    return out


def measure_wrappers(
    model: dict[str, Any], *, microbatch: int = 2, repeats: int = 7
) -> dict[str, float]:
    """CPU seconds that the runtime's data-parallel wrappers add to the plain module, on a
    1-rank gloo group (no communication and no time sharing), one thread.

    The runtime wraps each data-parallel chunk in FSDP2 (``fully_shard`` on every block and
    on the chunk; ZeRO-3 reshards after forward, ZeRO 1-2 not) or ``replicate`` (ZeRO-0),
    whose parameters are DTensors. Forward + backward of one microbatch of ``microbatch``
    sequences is timed for the plain module and each wrapping, interleaved round by round
    (``repeats`` rounds after one warm-up, medians), and one Adam step over plain and
    ``fully_shard`` parameters. Returns, each clipped at 0: ``fsdp_unit`` /
    ``fsdp_unit_no_reshard`` (per FSDP unit -- a block, or a chunk's root -- and microbatch),
    ``replicate`` (per wrapped chunk and microbatch), ``adam_dtensor`` (per parameter tensor
    and step), and the raw medians (``*_fwd_bwd``, ``*_adam``, ``units``, ``tensors``).
    """
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from runtime.model import load_model

    if dist.is_initialized():
        raise RuntimeError("measure_wrappers needs a process without a default process group")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def sharded(reshard: bool) -> Any:
            rm = load_model(model)
            for sub in rm.module.modules():
                if type(sub).__name__.endswith("Block"):
                    fully_shard(sub, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(rm.module, mesh=mesh, reshard_after_forward=reshard)
            return rm

        plain = load_model(model)
        rep = load_model(model)
        replicate(rep.module, mesh=mesh)
        kinds = {"plain": plain, "fsdp": sharded(True), "fsdp_nr": sharded(False), "rep": rep}
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for i in range(1 + repeats):
            for k, rm in kinds.items():
                x = tuple(t[:microbatch] for t in rm.example_inputs)
                c0 = time.process_time()
                rm.loss_fn(rm.module(*x[:1]), *x).backward()
                if i:
                    times[k].append(time.process_time() - c0)
        fb = {k: float(np.median(v)) for k, v in times.items()}
        opts = {
            k: torch.optim.Adam(kinds[k].module.parameters(), lr=1e-4) for k in ("plain", "fsdp")
        }
        adam: dict[str, list[float]] = {k: [] for k in opts}
        for i in range(1 + repeats):
            for k, opt in opts.items():
                c0 = time.process_time()
                opt.step()
                if i:
                    adam[k].append(time.process_time() - c0)
        ad = {k: float(np.median(v)) for k, v in adam.items()}
        units = 1 + sum(1 for s in plain.module.modules() if type(s).__name__.endswith("Block"))
        tensors = len(list(plain.module.parameters()))
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    return {
        "fsdp_unit": max(0.0, fb["fsdp"] - fb["plain"]) / units,
        "fsdp_unit_no_reshard": max(0.0, fb["fsdp_nr"] - fb["plain"]) / units,
        "replicate": max(0.0, fb["rep"] - fb["plain"]),
        "adam_dtensor": max(0.0, ad["fsdp"] - ad["plain"]) / tensors,
        "plain_fwd_bwd": fb["plain"],
        "fully_shard_fwd_bwd": fb["fsdp"],
        "fully_shard_no_reshard_fwd_bwd": fb["fsdp_nr"],
        "replicate_fwd_bwd": fb["rep"],
        "plain_adam": ad["plain"],
        "fully_shard_adam": ad["fsdp"],
        "units": float(units),
        "tensors": float(tensors),
        "microbatch": float(microbatch),
    }


def measure_optimizer(params: int = 1 << 22, repeats: int = 5) -> float:
    """CPU seconds per parameter of one ``torch.optim.Adam`` step (one thread)."""
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(params))
    opt = torch.optim.Adam([p], lr=1e-3)
    p.grad = torch.ones_like(p)
    opt.step()
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        opt.step()
        best = min(best, time.process_time() - c0)
    return best / params


#: Probe plans of :func:`measure_runtime_overhead` by process count: ``(overhead, (dp, tp, pp,
#: microbatch size, ZeRO))`` in the order they are solved (each with the earlier ones applied).
#: None of them is a plan of ``scripts/fidelity_hybrid.py``'s benchmark.
PROBES: dict[int, tuple[tuple[str, tuple[int, int, int, int, int]], ...]] = {
    1: (("microbatch", (1, 1, 1, 2, 0)),),
    2: (
        ("p2p", (1, 1, 2, 2, 0)),
        ("tp", (1, 2, 1, 4, 0)),
        ("ddp", (2, 1, 1, 4, 0)),
        ("fsdp", (2, 1, 1, 4, 3)),
    ),
    4: (
        ("p2p", (1, 1, 4, 1, 0)),
        ("tp", (1, 4, 1, 4, 0)),
        ("ddp", (4, 1, 1, 1, 0)),
        ("fsdp", (4, 1, 1, 1, 3)),
    ),
    8: (
        ("tp", (1, 4, 2, 4, 0)),
        ("p2p", (1, 2, 4, 1, 0)),
        ("ddp", (8, 1, 1, 1, 0)),
        ("fsdp", (4, 2, 1, 1, 3)),
    ),
}


def probe_plan(
    graph: Any, k: int, name: str, *, global_batch: int = 8, meta: dict[str, Any] | None = None
) -> Any:
    """The hybrid :class:`~graphs.plan.Plan` of probe ``name`` of :data:`PROBES` on
    ``cpu_cluster(k)``; ``ValueError`` naming the known probes otherwise."""
    from graphs.cpu_cluster import cpu_cluster
    from graphs.plan import Plan

    table = dict(PROBES.get(int(k), ()))
    if name not in table:
        known = sorted(f"{c}/{n}" for c, ps in PROBES.items() for n, _ in ps)
        raise ValueError(f"unknown runtime probe '{k}/{name}' (known: {', '.join(known)})")
    dp, tp, pp, b, z = table[name]
    return Plan.hybrid(
        graph, cpu_cluster(int(k)), dp=dp, tp=tp, pp=pp, microbatch_size=b,
        global_batch=global_batch, zero=z, meta=meta,
    )  # fmt: skip


def _solve(f: Any, target: float, lo: float = -0.01, hi: float = 0.5, iters: int = 40) -> float:
    """``x`` in ``[lo, hi]`` with ``f(x) = target`` for increasing ``f`` (bisection, clipped)."""
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def solve_runtime_overhead(
    graph: Any, cal: dict[str, Any], measured: dict[str, float], *, global_batch: int = 8
) -> dict[str, dict[str, float]]:
    """The overheads by process count that make
    :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel` with ``cal`` predict each probe's
    measured step time (``measured``: ``"k/name"`` -> seconds, the :data:`PROBES` keys), in
    the order of :data:`PROBES`, twice over (a probe solved early -- p2p under tp, say --
    then sees the later ones' figures). :func:`measure_runtime_overhead` uses it on what it
    measured; ``scripts/fidelity_hybrid.py --resimulate`` re-solves under other speeds."""
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel

    over: dict[str, dict[str, float]] = {}
    for k in sorted({int(key.split("/")[0]) for key in measured}):
        found: dict[str, float] = {}
        over[str(k)] = found
        cl = cpu_cluster(k)
        for name, _ in PROBES[k] * 2:
            lay = probe_plan(graph, k, name, global_batch=global_batch).layout

            def predict(
                x: float, name: str = name, lay: Any = lay, cl: Any = cl, found: Any = found
            ) -> float:
                c = dict(cal, runtime={**over, str(lay.world_size): {**found, name: x}})
                return CpuHybridModel(graph, cl, c).evaluate(lay).step_time

            found[name] = _solve(predict, measured[f"{k}/{name}"])
    return over


def fit_to_probes(
    graph: Any,
    cal: dict[str, Any],
    *,
    global_batch: int = 8,
    microbatch_bounds: tuple[float, float] = (0.0, 0.05),
    speed_bounds: tuple[float, float] = (0.05, 1.0),
) -> dict[str, Any]:
    """``cal`` with the per-microbatch overhead and the per-process speed of every process
    count fitted *jointly* to the runtime's own probe plans (``cal["runtime_probes"]``, the
    :data:`PROBES` measured by :func:`measure_runtime_overhead`, none of them a benchmark
    plan): the values that minimise the sum over all probes of the squared log error of
    :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel`'s step time (bounded
    Nelder-Mead from three starts; deterministic). No k-process overheads are used.

    Why jointly: the 1-process probe alone gives the overhead only as a residual -- its step
    time minus segment and Adam times measured at other moments --, which moved from 2.8 to
    10.1 ms per microbatch between otherwise identical calibrations and, charged to every
    rank of a pipeline, decided how far pipelined plans were over-predicted
    (``docs/fidelity.md``). Fitted together with the speeds, the k-process probes (pipelines
    of 4 microbatches per rank among them) constrain it as well.

    Returns a new calibration: ``speed`` = ``{"1": 1.0, k: fitted}``, ``runtime`` =
    ``{"1": {"microbatch": fitted}}``, ``collectives`` = the probes' own
    (``runtime_collectives``), and ``probe_fit`` = the fitted values, the loss and each
    probe's measured and predicted step time.
    """
    from scipy.optimize import minimize

    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel

    probes = cal.get("runtime_probes") or {}
    if not probes:
        raise ValueError(
            "fit_to_probes: the calibration has no runtime_probes; measure them with "
            "calibrate_hybrid(..., parts=('runtime',), probe_worlds=(4, 8))"
        )
    ks = sorted({int(key.split("/")[0]) for key in probes} - {1})
    cases = []
    for key, p in sorted(probes.items()):
        k, name = int(key.split("/")[0]), key.split("/")[1]
        lay = probe_plan(graph, k, name, global_batch=global_batch).layout
        cases.append((key, k, lay, float(p["measured"])))
    colls = cal.get("runtime_collectives") or cal.get("collectives") or {}
    lo = np.array([microbatch_bounds[0]] + [speed_bounds[0]] * len(ks))
    hi = np.array([microbatch_bounds[1]] + [speed_bounds[1]] * len(ks))

    def calib(x: np.ndarray) -> dict[str, Any]:
        speed = {"1": 1.0, **{str(k): float(v) for k, v in zip(ks, x[1:])}}
        return dict(cal, speed=speed, collectives=colls, runtime={"1": {"microbatch": float(x[0])}})

    def predict(c: dict[str, Any], k: int, lay: Any) -> float:
        return CpuHybridModel(graph, cpu_cluster(k), c).evaluate(lay).step_time

    def loss(x: np.ndarray) -> float:
        c = calib(np.clip(x, lo, hi))
        return float(sum(np.log(predict(c, k, lay) / t) ** 2 for _, k, lay, t in cases))

    best = None
    for mb0, s0 in ((0.002, 0.5), (0.01, 0.3), (0.02, 0.15)):
        x0 = np.array([mb0] + [s0] * len(ks))
        r = minimize(
            loss, x0, method="Nelder-Mead", bounds=list(zip(lo, hi)),
            options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 2000},
        )  # fmt: skip
        if best is None or r.fun < best.fun:
            best = r
    x = np.clip(best.x, lo, hi)
    out = calib(x)
    out["probe_fit"] = {
        "microbatch": float(x[0]),
        "speed": {str(k): float(v) for k, v in zip(ks, x[1:])},
        "loss": float(best.fun),
        "probes": {
            key: {"measured": t, "predicted": predict(out, k, lay)} for key, k, lay, t in cases
        },
    }
    return out


def measure_runtime_overhead(
    model: dict[str, Any],
    cal: dict[str, Any],
    worlds: Sequence[int] = (1, 4, 8),
    *,
    global_batch: int = 8,
    steps: int = 5,
    warmup: int = 2,
    launches: int = 2,
    timeout_s: float = 900.0,
) -> dict[str, Any]:
    """The runtime's own per-step costs on ``k`` processes that the segment and collective
    figures miss, from running it on the :data:`PROBES` plans of each ``k`` in ``worlds``.

    Each probe runs ``launches`` times (:func:`runtime.execute.run_specs`, the runtime's
    hybrid mode, Adam); its median step time is the target. Then, per ``k`` and in the order
    of :data:`PROBES` (twice over, so each sees the others' figures), the overhead is found
    (bisection) that makes
    :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel` (with ``cal`` -- whose
    ``speed`` and ``collectives`` should be measured now, and cover ``k`` -- and the
    overheads found so far) predict that step time: ``microbatch`` (k = 1: CPU seconds per
    microbatch and rank -- scheduling, timers, autograd glue -- used for every k), and for
    each k > 1 ``p2p`` (per pipeline message), ``tp`` (per block and microbatch under tensor
    parallelism), ``ddp`` (per model chunk and step under ZeRO-0 data parallelism) and
    ``fsdp`` (per ZeRO all-gather / reduce-scatter call): what the runtime's synchronisation
    costs when ``k`` processes time-share this machine's cores. Each is clipped to
    ``[-0.01, 0.5]`` s (negative: the segment figures overstate the runtime). Memory, from
    the 1-process probe: ``worker_base`` = its resident set after the build
    (:attr:`runtime.execute.ExecResult.base_memory`: process, torch, gloo, the model) and
    ``step_residue`` = its measured step memory minus the model's step terms (allocator and
    optimizer temporaries). Returns ``{"overhead": {str(k): {...}}, "memory": {...},
    "probes": raw}``.
    """
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel
    from runtime.execute import run_specs
    from runtime.model import graph_for_model
    from runtime.spec import make_run_spec

    worlds = sorted({1} | {int(k) for k in worlds})
    graph = graph_for_model(model)
    plans: dict[tuple[int, str], Any] = {}
    for k in worlds:
        for name, _ in PROBES[k]:
            plans[(k, name)] = probe_plan(
                graph, k, name, global_batch=global_batch, meta={"model": model}
            )
    runs: dict[tuple[int, str], list[Any]] = {key: [] for key in plans}
    for _ in range(launches):
        for k in worlds:
            keys = [key for key in plans if key[0] == k]
            specs = [
                make_run_spec(
                    plans[key],
                    graph,
                    cpu_cluster(k),
                    model,
                    steps=steps,
                    warmup=warmup,
                    optimizer="adam",
                )  # fmt: skip
                for key in keys
            ]
            for key, res in zip(keys, run_specs(specs, timeout_s=timeout_s)):
                runs[key].append(res)
    measured = {key: float(np.median([r.step_time for r in rs])) for key, rs in runs.items()}
    over = solve_runtime_overhead(graph, cal, {f"{k}/{n}": t for (k, n), t in measured.items()})
    single = runs[(1, "microbatch")]
    lay = plans[(1, "microbatch")].layout
    bd = CpuHybridModel(graph, cpu_cluster(1), dict(cal, runtime=over)).evaluate(lay).breakdown
    base = float(np.median([r.base_memory[0] for r in single]))
    step = float(np.median([r.step_memory[0] for r in single]))
    return {
        "overhead": over,
        "memory": {"worker_base": base, "step_residue": step - bd["memory_step"][0]},
        "probes": {
            f"{k}/{name}": {
                "layout": list(PROBES[k][[n for n, _ in PROBES[k]].index(name)][1]),
                "measured": measured[(k, name)],
                "runs": [r.step_time for r in rs],
                "base_memory": [r.base_memory for r in rs],
                "step_memory": [r.step_memory for r in rs],
            }  # fmt: skip
            for (k, name), rs in runs.items()
        },
    }


def calibrate_hybrid(
    model: dict[str, Any],
    *,
    tps: Sequence[int] = (1, 2, 4),
    micro_sizes: Sequence[int] = (1, 2, 4, 8),
    recomputes: Sequence[str] = ("none", "full"),
    worlds: Sequence[int] = (2, 4, 8),
    speed_counts: Sequence[int] = (1, 2, 4, 8),
    repeats: int = 3,
    parts: Sequence[str] = ("segments", "collectives", "speed", "optimizer", "runtime"),
    base: dict[str, Any] | None = None,
    probe_worlds: Sequence[int] = (),
    probe_steps: int = 5,
    probe_launches: int = 2,
) -> dict[str, Any]:
    """Measure what :class:`placement_env.oracles.hybrid_cpu.CpuHybridModel` needs (see the
    module docstring); ``parts`` picks what to measure (e.g. only ``("speed",
    "collectives")`` to refresh the load-dependent figures between measurements).
    ``"runtime"`` (:func:`measure_runtime_overhead`, needs the ``"segments"`` of its
    :data:`PROBES`) runs the runtime on its 1-process probe and, for each ``k`` in
    ``probe_worlds``, on its k-process probes, and adds ``runtime`` (the overheads by process
    count) and ``memory.worker_base`` / ``memory.step_residue``. The k-process probes are
    off by default: solved under a per-process speed sampled while other jobs come and go,
    their overheads made the fidelity benchmark worse (``docs/fidelity.md``). ``base``: an
    earlier calibration to add the measured parts to. ``probe_steps`` timed steps per probe
    run and ``probe_launches`` runs of each probe (median): fewer measure faster, noisier.

    The calibration the hybrid fidelity benchmark validated (``docs/fidelity.md``,
    ``--speed joint``) is this one with ``probe_worlds=(4, 8)`` passed through
    :func:`fit_to_probes`, which fits the per-microbatch overhead and the per-process speeds
    to those probes."""
    from runtime.profile import measure_concurrent_speed

    cal: dict[str, Any] = {**(base or {}), "model": model, "time": time.time()}
    if "segments" in parts:
        cal["segments"] = measure_segments(model, tps, micro_sizes, recomputes, repeats=repeats)
        one = cal["segments"][str(min(tps))]
        cal["memory"] = {"process": one["process"], "build_extra": one["build_extra"]}
    if "collectives" in parts:
        cal["collectives"] = measure_collectives(worlds)
    if "speed" in parts:
        cal["speed"] = {
            str(k): float(v)
            for k, v in measure_concurrent_speed(tuple(speed_counts), seconds=1.0).items()
        }
    if "optimizer" in parts:
        cal["optimizer"] = {"adam_cpu_per_param": measure_optimizer()}
    if "runtime" in parts:
        now = dict(cal)  # the probes' own load: speed and collectives measured now
        ks = sorted({1} | {int(k) for k in probe_worlds})
        now["speed"] = {
            str(k): float(v) for k, v in measure_concurrent_speed(tuple(ks), seconds=1.0).items()
        }
        groups = sorted({g for k in ks for g in (2, 4, 8) if g <= k})
        if groups:
            now["collectives"] = {**cal.get("collectives", {}), **measure_collectives(groups)}
        rt = measure_runtime_overhead(model, now, ks, steps=probe_steps, launches=probe_launches)
        cal["runtime_speed"] = now["speed"]
        cal["runtime_collectives"] = now["collectives"]
        cal["runtime"] = rt["overhead"]
        cal["memory"] = {**cal.get("memory", {}), **rt["memory"]}
        cal["runtime_probes"] = rt["probes"]
    return cal


def check_hybrid_settings(
    *,
    tps: Sequence[Any],
    micro_sizes: Sequence[Any],
    recomputes: Sequence[Any],
    worlds: Sequence[Any],
    probe_worlds: Sequence[Any],
    repeats: Any,
    probe_steps: Any = 5,
    probe_launches: Any = 2,
) -> None:
    """The arguments of :func:`calibrate_hybrid_fitted` (also ``runners.profile``'s
    ``hybrid.*``), checked: ``ValueError`` naming the first bad one by its index (``tps[1] = 0; ...``)."""
    for name, vals in (("tps", tps), ("micro_sizes", micro_sizes), ("worlds", worlds)):
        if not vals:
            raise ValueError(f"{name} is empty; expected integers >= 1")
        for i, v in enumerate(vals):
            if not is_whole(v, 1):
                raise ValueError(f"{name}[{i}] = {v!r}; expected an integer >= 1")
    if not probe_worlds:
        raise ValueError("probe_worlds is empty; expected some of 2, 4, 8")
    for i, v in enumerate(probe_worlds):
        if not is_whole(v, 2) or int(v) not in PROBES:
            raise ValueError(
                f"probe_worlds[{i}] = {v!r}; expected 2, 4 or 8 (the process counts with runtime "
                "probe plans)"
            )
    if not recomputes:
        raise ValueError("recomputes is empty; expected some of none, full, selective")
    for i, v in enumerate(recomputes):
        if v not in ("none", "full", "selective"):
            raise ValueError(f"recomputes[{i}] = {v!r}; expected none, full or selective")
    for name, v in (("repeats", repeats), ("probe_steps", probe_steps),
                    ("probe_launches", probe_launches)):  # fmt: skip
        if not is_whole(v, 1):
            raise ValueError(f"{name} = {v!r}; expected an integer >= 1")


def check_probe_model(model: dict[str, Any], probe_worlds: Sequence[int]) -> tuple[Any, int]:
    """``(graph, global batch)`` of ``model`` after checking that every probe plan of
    :data:`PROBES` at 1 and ``probe_worlds`` processes can be laid out on it; the
    ``ValueError`` names the probe and what it needs (e.g. 4 layers for 4 pipeline stages)."""
    from runtime.model import graph_for_model

    batch = int((model.get("config") or {}).get("batch", 8) or 8)
    graph = graph_for_model(model)
    for k in (1, *probe_worlds):
        for name, shape in PROBES[int(k)]:
            try:
                probe_plan(graph, int(k), name, global_batch=batch)
            except ValueError as exc:
                dp, tp, pp, b, _ = shape
                raise ValueError(
                    f"hybrid calibration: the runtime probe '{k}/{name}' (dp {dp}, tp {tp}, pp "
                    f"{pp}, microbatch size {b}) cannot be laid out on {model.get('name')!r} "
                    f"{dict(model.get('config') or {})}: {exc}. Give the model at least 4 "
                    "layers and 4 heads and a batch of 8 (the global batch), or fewer "
                    "probe_worlds"
                ) from None
    return graph, batch


def check_model_settings(
    model: dict[str, Any], graph: Any, batch: int, *, tps: Sequence[Any], micro_sizes: Sequence[Any]
) -> None:
    """``tps`` and ``micro_sizes`` against the model: every tensor-parallel degree divides
    its attention heads and key/value heads (the runtime splits whole heads), every
    microbatch size is at most its global batch (a segment measured on the first ``b`` rows
    of a smaller batch would be stored as ``b``); ``ValueError`` naming the value."""
    from graphs.layout import model_dims, tp_fits

    d = model_dims(graph)
    what = f"{model.get('name')!r} {dict(model.get('config') or {})}"
    for i, t in enumerate(tps):
        if not tp_fits(int(t), heads=d.heads, kv_heads=d.kv_heads, max_tp=int(t)):
            raise ValueError(
                f"hybrid calibration: tps[{i}] = {t}: a tensor-parallel degree must divide the "
                f"{d.heads} attention heads and {d.kv_heads} key/value heads of {what}"
            )
    for i, b in enumerate(micro_sizes):
        if int(b) > batch:
            raise ValueError(
                f"hybrid calibration: micro_sizes[{i}] = {b} is larger than the global batch "
                f"{batch} of {what}"
            )


def calibrate_hybrid_fitted(
    model: dict[str, Any],
    *,
    tps: Sequence[int] = (1, 2, 4),
    micro_sizes: Sequence[int] = (1, 2, 4, 8),
    recomputes: Sequence[str] = ("none", "full"),
    worlds: Sequence[int] = (2, 4, 8),
    probe_worlds: Sequence[int] = (4, 8),
    repeats: int = 3,
    echo: Callable[[str], None] | None = None,
    probe_steps: int = 5,
    probe_launches: int = 2,
) -> dict[str, Any]:
    """The hybrid calibration of ``model`` as the fidelity benchmark validated it
    (``docs/fidelity.md``, ``--speed joint``): segment times and memory for every ``(tp,
    microbatch size, recompute)`` of ``tps x micro_sizes x recomputes``, Adam's cost, gloo
    collectives on ``worlds`` processes, the runtime's own probe plans
    (:data:`PROBES`) at 1 and ``probe_worlds`` processes, then the per-microbatch overhead and
    per-process speeds fitted jointly to those probes (:func:`fit_to_probes`). What
    ``python -m runners.profile hybrid.model=...`` stores under the calibration's ``hybrid``
    key; a ``cpu_N@PATH`` cluster then scores hybrid plans of that model with
    :class:`~placement_env.oracles.hybrid_cpu.CpuHybridModel`.

    The probes need ``model`` to allow them: at 4 processes tp 4 and 4 pipeline stages
    (4 heads, 4 layers), at 8 also 8 samples per step (``config.batch`` is the global
    batch). Bad arguments raise ``ValueError`` naming them before anything is measured."""

    say = echo or (lambda _msg: None)
    try:
        check_hybrid_settings(
            tps=tps, micro_sizes=micro_sizes, recomputes=recomputes, worlds=worlds,
            probe_worlds=probe_worlds, repeats=repeats, probe_steps=probe_steps,
            probe_launches=probe_launches,
        )  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"calibrate_hybrid_fitted: {exc}") from None
    graph, batch = check_probe_model(model, probe_worlds)
    check_model_settings(model, graph, batch, tps=tps, micro_sizes=micro_sizes)
    probes = [shape for k in (1, *probe_worlds) for _, shape in PROBES[int(k)]]
    tps = sorted({int(t) for t in tps} | {t for _, t, _, _, _ in probes})
    sizes = sorted({int(b) for b in micro_sizes} | {b for _, _, _, b, _ in probes})
    # the probes run without recomputation: its segments are always measured
    recomputes = list(dict.fromkeys(["none", *recomputes]))
    say(f"segments: tp {tps}, microbatch sizes {sizes}, recompute {list(recomputes)}; "
        f"collectives on {list(worlds)}; Adam")  # fmt: skip
    cal = calibrate_hybrid(
        model, tps=tps, micro_sizes=sizes, recomputes=tuple(recomputes),
        worlds=tuple(int(w) for w in worlds), repeats=int(repeats),
        parts=("segments", "collectives", "optimizer"),
    )  # fmt: skip
    say(f"runtime probes at 1 and {sorted(int(k) for k in probe_worlds)} processes")
    cal = calibrate_hybrid(
        model, probe_worlds=tuple(int(k) for k in probe_worlds), parts=("runtime",), base=cal,
        probe_steps=int(probe_steps), probe_launches=int(probe_launches),
    )  # fmt: skip
    say("fitting the per-microbatch overhead and per-process speeds to the probes")
    return fit_to_probes(graph, cal, global_batch=batch)


__all__ = [
    "calibrate_hybrid",
    "calibrate_hybrid_fitted",
    "check_hybrid_settings",
    "check_model_settings",
    "check_probe_model",
    "fit_line",
    "fit_to_probes",
    "measure_collectives",
    "measure_runtime_overhead",
    "probe_plan",
    "solve_runtime_overhead",
    "measure_optimizer",
    "measure_wrappers",
    "measure_segments",
]
