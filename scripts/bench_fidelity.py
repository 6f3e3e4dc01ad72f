"""Simulator fidelity: measured (runtime.execute) vs simulated step time of many plans of a small GPT-2 on cpu_N.

Hybrid plans (dp x tp x pp, ZeRO, recomputation): ``--hybrid``, see scripts/fidelity_hybrid.py.

Usage: python scripts/bench_fidelity.py [--devices 2] [--random 14] [--rounds 2]
       [--microbatches 4] [--nice -10] [--seed 0] [--json RAW.json] [--resimulate RAW.json]
       [--out docs/fidelity.md] [--plot docs/fidelity.png] [--plot-from RAW.json]

Calibrates cpu_N with runtime.profile (device roofline figures, per-op overhead, gloo
p2p, hand-off latency, per-transfer endpoint cost, per-process speed with k processes
at once) unless the calibration file already has them; measures per-node times of the
model in one process; makes baseline plans (agents.baselines, scored by the simulator)
and random group-respecting placements with a spread of cut counts for each N;
executes every plan (gloo, op-level, one process per device used) in --rounds
shuffled interleaved rounds and takes the median -- in each round all plans with
the same process count run one after another in one launch
(runtime.execute_many), each with its own model build and warm-up steps; simulates each plan with
placement_env.oracles.simulator under several inputs (the runtime's ``in_order``
schedule and, for comparison, ``gpipe``); and writes Spearman rank correlation and
MAPE per cluster and input to a markdown file (rewritten after every round; text
after the ANALYSIS marker is kept). The hand-off latency and the endpoint cost are
re-measured before every round, under that moment's load, and their means used.
--resimulate reuses the measured runs (and per-node times) of an earlier --json file.
Each run also draws predicted against measured step times (--plot, default beside --out);
--plot-from RAW.json redraws that plot from an earlier --json file without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphs import zoo  # noqa: E402
from graphs.cpu_cluster import concurrency_factor, cpu_cluster  # noqa: E402
from graphs.plan import Plan  # noqa: E402
from placement_env.oracles.simulator import Simulator  # noqa: E402
from runners.common import save_figure  # noqa: E402
from runtime.execute import execute_many  # noqa: E402
from runtime.profile import calibration_groups, calibration_placements, node_owner  # noqa: E402

CONFIG = dict(batch=8, seq=64, n_layer=4, d_model=256, n_head=4, vocab=512, n_ctx=64)
MODEL = {"name": "gpt2", "config": CONFIG, "max_groups": 12}
BASELINES = ("round_robin", "expert", "metis", "m_etf", "m_sct", "pipedream_dp")


def calibrate(path: Path, counts: list[int]) -> dict:
    from runtime.profile import (
        measure_concurrent_speed,
        measure_device,
        measure_handoff,
        measure_ops,
        measure_p2p,
        measure_transfer_overhead,
        write_calibration,
    )

    dev = measure_device(threads=1)
    ops = measure_ops({"name": "gpt2", "config": CONFIG})
    small = np.sort(np.fromiter(ops.values(), float))[: max(1, len(ops) // 2)]
    dev["launch_overhead"] = float(np.median(small)) * 1e-6
    conc = measure_concurrent_speed(sorted(set(counts) | {1}), seconds=3.0)
    link = measure_p2p()
    link["handoff"] = measure_handoff()
    link["latency_p2p"] = link["latency"]
    link["latency"] = link["handoff"]["mean"]  # what a blocking recv costs the runtime here
    cal = write_calibration(dev, link, path, memory=4 * 2**30, concurrency=conc)
    cal["measured"]["transfer_overhead"] = measure_transfer_overhead(nbytes=message_bytes())
    Path(path).write_text(json.dumps(cal, indent=1))
    return cal


def message_bytes(microbatches: int = 4) -> int:
    """Bytes of one activation of the model at microbatch size (batch/M x seq x d_model x fp32)."""
    return CONFIG["batch"] // microbatches * CONFIG["seq"] * CONFIG["d_model"] * 4


def per_op_times(graph, cluster, microbatches: int) -> np.ndarray:
    """Roofline node times (us, whole batch) with one launch overhead per original op, not per coarse node."""
    sim = Simulator(graph, cluster, microbatches=microbatches, schedule="gpipe")
    per_run = sim.node_times()[:, 0]
    members = graph.meta.get("members") or [[n] for n in graph.name]
    extra = np.array([max(0, len(m) - 1) for m in members]) * cluster.devices[0].launch_overhead
    runs = np.where(graph.kind == 2, 1, microbatches)
    return (per_run + extra) * runs * 1e6


def used(placement: np.ndarray) -> int:
    """Processes the runtime launches for a placement: one per device it uses."""
    return len(np.unique(placement))


def canonical(per_group) -> tuple[int, ...]:
    """A per-group placement up to renaming devices."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(int(x), len(first)) for x in per_group)


def make_plans(
    graph, cluster, n_random: int, rng: np.random.Generator, M: int, exclude=()
) -> list[tuple[str, Plan]]:
    from agents import baselines

    sim = Simulator(graph, cluster, microbatches=M, schedule="gpipe")
    plans = []
    for name in BASELINES:
        try:
            p = baselines.get(name)(graph, cluster, sim, 200)
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot plan is reported, not fatal
            print(f"  {name}: no plan ({type(exc).__name__}: {exc})", flush=True)
            continue
        plans.append((name, p))
    _, inv = graph.group_index()
    ngroups = int(inv.max()) + 1
    D = cluster.num_devices

    # random plans: the groups (a chain, in order) cut at c random boundaries, c drawn
    # afresh for every plan, so cut counts spread from 1 to ngroups - 1; every plan's
    # placement (up to renaming devices) differs from all plans before it and from ``exclude``
    seen = {canonical(np.asarray(p.placement)[first_of_group(graph)]) for _, p in plans}
    seen |= {canonical(x) for x in exclude}
    i = 0
    for _ in range(1000 * max(n_random, 1)):
        if i == n_random:
            break
        c = int(rng.integers(1, ngroups)) if D > 1 else 0
        per_group = np.zeros(ngroups, np.int64)
        per_group[0] = rng.integers(0, D)
        cut_at = set(rng.choice(np.arange(1, ngroups), size=c, replace=False).tolist())
        for k in range(1, ngroups):
            step = rng.integers(1, D) if k in cut_at else 0
            per_group[k] = (per_group[k - 1] + step) % D
        key = canonical(per_group)
        if key in seen:
            continue
        seen.add(key)
        plans.append((f"random{i}", Plan.for_graph(per_group[inv], graph, cluster)))
        i += 1
    # the simulator scores placements, not stages: every plan runs as an op-level plan; the
    # runtime runs a backward/optimizer node where its forward node runs, so plans say so too
    own = node_owner(graph)
    return [
        (
            name,
            Plan.for_graph(
                np.asarray(p.placement)[own], graph, cluster, microbatches=M, schedule="gpipe",
                meta={"model": MODEL},
            ),
        )
        for name, p in plans
    ]  # fmt: skip


def first_of_group(graph) -> np.ndarray:
    """Index of the first node of each colocation group (groups in ``group_index`` order)."""
    _, inv = graph.group_index()
    return np.array([int(np.flatnonzero(inv == k)[0]) for k in range(int(inv.max()) + 1)])


def cuts(graph, placement: np.ndarray) -> int:
    """Forward edges whose ends are on different devices (each is a hand-off forward and back)."""
    f = (graph.kind[graph.src] == 0) & (graph.kind[graph.dst] == 0)
    return int((placement[graph.src[f]] != placement[graph.dst[f]]).sum())


ANALYSIS = "<!-- analysis: written by hand, kept when the script rewrites the file -->"
# the first input is the main one: per-node times x the runtime's multi-process compute factor,
# fitted on separate calibration plans executed by the runtime
COLUMNS = {
    "calibrated": "in_order, measured per-node times x runtime compute factor (k >= 2 processes; "
    "fitted with the measured endpoint cost held fixed), hand-off latency, endpoint cost",
    "calibrated_free": "as the first row, factor and endpoint cost both fitted to the runtime",
    "in_order": "in_order, measured per-node times, hand-off latency, endpoint cost",
    "in_order_o0": "in_order, measured per-node times, hand-off latency, no endpoint cost",
    "in_order_p2p": "in_order, measured per-node times, idle p2p latency, endpoint cost",
    "rendezvous": "in_order, measured per-node times, idle p2p latency, endpoint cost, "
    "each receive waits one hand-off (gloo rendezvous)",
    "roofline": "in_order, roofline (launch overhead per original op), hand-off latency, endpoint cost",
    "shared": "in_order as the first row, device speed x measured time-sharing factor",
    "gpipe": "gpipe order (work-conserving), otherwise as the first row",
}


def main() -> None:
    if "--hybrid" in sys.argv[1:]:  # hybrid plans: scripts/fidelity_hybrid.py
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "fidelity_hybrid", Path(__file__).with_name("fidelity_hybrid.py")
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["fidelity_hybrid"] = mod
        spec.loader.exec_module(mod)
        mod.main()
        return
    from scripts.argtypes import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "fidelity.md"))
    ap.add_argument("--devices", type=int, nargs="+", default=[2])
    ap.add_argument("--random", type=int, default=14)
    ap.add_argument("--microbatches", type=positive_int, default=4)
    ap.add_argument("--steps", type=positive_int, default=5)
    ap.add_argument(
        "--rounds", type=int, default=2, help="measure every plan this many times, interleaved"
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="os.nice increment for this process and its children (negative needs root)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the random plans")
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--json", default=None, help="also write raw rows here")
    ap.add_argument(
        "--resimulate",
        default=None,
        help="JSON of an earlier run: reuse its measured runs, recompute only the simulated columns",
    )
    ap.add_argument(
        "--plot", default=None,
        help="the predicted-vs-measured plot (PNG); default: --out with the suffix .png",
    )  # fmt: skip
    ap.add_argument(
        "--plot-from", default=None, metavar="RAW.json",
        help="only draw the plot of an earlier --json file (no measurement) to --plot",
    )  # fmt: skip
    args = ap.parse_args()
    if args.plot_from:
        old = json.loads(Path(args.plot_from).read_text())
        rounds = min(len(r["runs"]) for r in old["rows"])
        out = plot_fidelity(old["rows"], Path(args.plot or Path(args.plot_from).with_suffix(".png")),
                            f"{rounds} round(s), from {Path(args.plot_from).name}")  # fmt: skip
        print(f"wrote {out}")
        return
    if args.nice:
        os.nice(args.nice)

    load_before = os.getloadavg()
    cal_path = Path(args.calibration or ROOT / "outputs" / "fidelity" / "cpu_calibration.json")
    cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
    if cal is None or "transfer_overhead" not in cal.get("measured", {}):
        print("calibrating ...", flush=True)
        cal = calibrate(cal_path, args.devices)
    graph = zoo.build("gpt2", max_groups=MODEL["max_groups"], precision="fp32", **CONFIG)
    from runtime.profile import (
        measure_concurrent_speed,
        measure_graph_times,
        measure_handoff,
        measure_runtime_slowdown,
        measure_transfer_overhead,
    )

    M = args.microbatches
    old = json.loads(Path(args.resimulate).read_text()) if args.resimulate else {}
    if "node_times_us" in old:  # the per-node times measured with those runs
        timed = graph.replace(times={"cpu": np.asarray(old["node_times_us"], float)})
    else:
        timed = measure_graph_times(graph, MODEL, microbatches=M)
    # per-node times are re-measured before every round (under that moment's load) and averaged
    node_times = [np.asarray(x, float) for x in old.get("node_times_rounds", [])]
    if not node_times:
        node_times = [timed.times["cpu"]]
    rng = np.random.default_rng(args.seed)
    jobs = []
    _, inv = graph.group_index()
    # runtime-calibration placements per device count (not among the evaluated plans)
    calib = {N: calibration_placements(graph, N) for N in args.devices if N >= 2}
    for N in args.devices:
        cluster = cpu_cluster(N, calibration=cal)
        excl = calibration_groups(int(inv.max()) + 1, N) if N >= 2 else []
        for name, plan in make_plans(graph, cluster, args.random, rng, M, exclude=excl):
            row = dict(
                cluster=f"cpu_{N}", N=N, plan=name, world=used(plan.placement), runs=[],
                placement=plan.placement.tolist(),
            )  # fmt: skip
            jobs.append((row, plan, cluster))
    rows = [row for row, _, _ in jobs]
    placements = {(row["cluster"], row["plan"]): plan.placement for row, plan, _ in jobs}
    old_measured = old.get("calibration", {}).get("measured", {})
    handoffs = list(old_measured.get("handoff_during_runs") or [])
    overheads = list(old_measured.get("transfer_overhead_during_runs") or [])
    concs = list(old_measured.get("concurrency_during_runs") or [])
    slow_runs = list(old_measured.get("runtime_runs") or [])  # runtime-calibration executions
    if args.resimulate:
        runs = {(r["cluster"], r["plan"]): r for r in old["rows"]}
        for row in rows:
            was = runs[row["cluster"], row["plan"]]
            for key in ("runs", "compute", "comm", "idle"):
                if key in was:
                    row[key] = was[key]
            if "placement" in was:  # the plans as measured (plan generation may have changed since)
                row["placement"] = was["placement"]
                row["world"] = used(np.asarray(was["placement"]))
                placements[row["cluster"], row["plan"]] = np.asarray(was["placement"], np.int64)
        done = min(len(row["runs"]) for row in rows)
        seconds = old.get("seconds", float("nan"))
        report(
            rows, placements, cal, args, seconds, old["load"], done, timed, graph, handoffs,
            overheads, concs, node_times, slow_runs,
        )  # fmt: skip
        return
    t_start = time.time()
    for r in range(args.rounds):  # interleaved: a load drift hits every plan alike
        # the hand-off latency under the load of this moment (see measure_handoff)
        handoffs.append(measure_handoff()["mean"])
        if r > 0:
            node_times.append(measure_graph_times(graph, MODEL, microbatches=M).times["cpu"])
            timed = graph.replace(times={"cpu": np.mean(node_times, axis=0)})
        overheads.append(measure_transfer_overhead(nbytes=message_bytes(M))["send"])
        concs.append(measure_concurrent_speed(sorted(set(args.devices) | {1}), seconds=2.0))
        for N, pls in calib.items():  # the runtime's own multi-process compute factor
            slow = measure_runtime_slowdown(
                graph, cpu_cluster(N, calibration=cal), pls, timed=timed, model=MODEL,
                microbatches=M, steps=args.steps, overhead=overheads[-1],
            )  # fmt: skip
            slow_runs.extend(slow["runs"])
            print(f"round {r}: cpu_{N} runtime compute factor {slow['factor']:.2f}, endpoint "
                  f"cost {slow['transfer_overhead'] * 1e6:.0f} us (fit {slow['fit_mape']:.1f} %)",
                  flush=True)  # fmt: skip
        print(f"round {r}: hand-off {handoffs[-1] * 1e6:.0f} us, endpoint cost "
              f"{overheads[-1] * 1e6:.0f} us", flush=True)  # fmt: skip
        order = rng.permutation(len(jobs))
        for N in args.devices:  # one execute_many per cluster: a launch per process count
            mine = [i for i in order if jobs[i][0]["N"] == N]
            try:
                results = execute_many(
                    [jobs[i][1] for i in mine], graph, jobs[mine[0]][2], steps=args.steps,
                    warmup=2, optimizer="adam", timeout_s=1800,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - record the failure in the table
                for i in mine:
                    jobs[i][0]["error"] = str(exc)[:200]
                print(f"round {r}: cpu_{N} failed: {exc}", flush=True)
                continue
            for i, res in zip(mine, results):
                row = jobs[i][0]
                row["runs"].append(res.step_time)
                for key in ("compute", "comm", "idle"):  # per rank, seconds per step
                    row.setdefault(key, []).append(getattr(res, key))
                print(r, row["cluster"], row["plan"], f"{res.step_time * 1e3:.0f} ms", flush=True)
        # written after every round, so a stopped run still leaves its completed rounds
        load = {"before": load_before, "after": os.getloadavg()}
        args_ = (time.time() - t_start, load, r + 1, timed, graph, handoffs, overheads, concs)
        args_ = (*args_, node_times, slow_runs)
        report(rows, placements, cal, args, *args_)


def simulate(rows: list[dict], placements: dict, cal: dict, graph, timed, M: int) -> None:
    """Fill each row's simulated step time (seconds) for every simulator input of COLUMNS.

    Devices run at their one-process speed (each process of a 2-process plan has a
    vCPU of its own) except in ``shared``, where speed is scaled by the measured
    time-sharing factor of the plan's process count. Link latency is the hand-off
    latency (``cal["link"]``) or the idle p2p latency (``rendezvous`` adds one hand-off
    to every receive instead); the endpoint cost is
    ``cal["measured"]["transfer_overhead_used"]``.
    """
    free = dict(cal, concurrency={})
    # per fit variant and process count: (per-node times x factor, fitted endpoint cost)
    fitted = {
        key: {
            int(k): (timed.replace(times={"cpu": timed.times["cpu"] * v["factor"]}),
                     v["transfer_overhead"])
            for k, v in cal["measured"].get(src, {}).items()
        }
        for key, src in (("calibrated", "runtime_slowdown"),
                         ("calibrated_free", "runtime_slowdown_free"))
    }  # fmt: skip
    p2p = dict(free, link=dict(cal["link"], latency=cal["measured"]["p2p_latency"]))
    o = float(cal["measured"]["transfer_overhead_used"])
    hand = float(cal["link"]["latency"])  # the hand-off latency (mean over the rounds)
    for row in rows:
        N, k, placement = row["N"], row["world"], placements[row["cluster"], row["plan"]]
        cluster = cpu_cluster(N, calibration=free)
        idle = cpu_cluster(N, calibration=p2p)  # idle p2p latency on the links
        scaled = cpu_cluster(N, calibration=cal, processes=k)
        f = concurrency_factor(cal, k)
        roof_ops = graph.replace(times=dict(graph.times, cpu=per_op_times(graph, cluster, M)))
        t_scaled = timed.replace(times={"cpu": timed.times["cpu"] / f})

        def sim(g, c, schedule="in_order", p=placement):
            return float(Simulator(g, c, microbatches=M, schedule=schedule).evaluate(p).step_time)

        calibrated = {}
        for key, fs in fitted.items():
            if k >= 2 and fs:  # the fit of the nearest measured process count
                t_rt, o_rt = fs[min(fs, key=lambda n: (abs(n - k), n))]
                calibrated[key] = sim(t_rt, cluster.with_endpoint_costs(o_rt))
            else:  # one process: the per-node times were measured in one process
                calibrated[key] = sim(timed, cluster.with_endpoint_costs(o))
        row.update(
            **calibrated,
            in_order=sim(timed, cluster.with_endpoint_costs(o)),
            in_order_o0=sim(timed, cluster),
            in_order_p2p=sim(timed, idle.with_endpoint_costs(o)),
            rendezvous=sim(timed, idle.with_endpoint_costs(o, hand)),
            roofline=sim(roof_ops, cluster.with_endpoint_costs(o)),
            shared=sim(t_scaled, scaled.with_endpoint_costs(o)),
            gpipe=sim(timed, cluster.with_endpoint_costs(o), "gpipe"),
            cuts=cuts(graph, placement),
        )


def report(
    rows: list[dict],
    placements: dict,
    cal: dict,
    args,
    seconds: float,
    load: dict,
    rounds: int,
    timed,
    graph,
    handoffs: list[float],
    overheads: list[float],
    concs: list[dict[str, float]],
    node_times: list[np.ndarray],
    slow_runs: list[dict] = (),
) -> None:
    """Simulate, take each plan's median run, Spearman/MAPE per cluster and column, write markdown (and JSON).

    With hand-off latencies and endpoint costs measured during the runs, their means
    are the link latency and the devices' transfer overhead.
    """
    measured = dict(cal["measured"])
    measured["transfer_overhead_used"] = measured["transfer_overhead"]["send"]
    if handoffs:
        measured["handoff_during_runs"] = list(handoffs)
        cal = dict(cal, link=dict(cal["link"], latency=float(np.mean(handoffs))))
    if overheads:
        measured["transfer_overhead_during_runs"] = list(overheads)
        measured["transfer_overhead_used"] = float(np.mean(overheads))
    if concs:
        measured["concurrency_during_runs"] = list(concs)
        mean_conc = {k: float(np.mean([c[k] for c in concs])) for k in concs[0]}
        cal = dict(cal, concurrency=mean_conc)
    measured["node_times_total_ms"] = [float(np.sum(x) / 1e3) for x in node_times]
    if slow_runs:  # pooled over the rounds, refitted with the final per-node times
        from runtime.profile import fit_runtime_runs

        measured["runtime_runs"] = list(slow_runs)
        by_n: dict[int, list[dict]] = {}
        for run in slow_runs:
            by_n.setdefault(len(run["devices"]), []).append(run)
        o_used = measured["transfer_overhead_used"]
        for key, o in (("runtime_slowdown", o_used), ("runtime_slowdown_free", None)):
            measured[key] = {  # a calibration placement uses all k devices of cpu_k
                str(k): fit_runtime_runs(
                    runs, timed, cpu_cluster(k, calibration=cal), args.microbatches, o
                )
                for k, runs in by_n.items()
            }
    cal = dict(cal, measured=measured)
    simulate(rows, placements, cal, graph, timed, args.microbatches)
    for row in rows:
        row["measured"] = float(np.median(row["runs"])) if row["runs"] else None
    stats_by = {
        cl: {c: summarize([r for r in rows if r["cluster"] == cl], c) for c in COLUMNS}
        for cl in dict.fromkeys(r["cluster"] for r in rows)
    }
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "by_cluster": stats_by,
                    "calibration": cal,
                    "load": load,
                    "seconds": seconds,
                    "node_times_us": timed.times["cpu"].tolist(),
                    "node_times_rounds": [list(map(float, x)) for x in node_times],
                },
                indent=1,
            )
        )
    write_markdown(Path(args.out), rows, stats_by, cal, args, seconds, load, rounds)
    plot_fidelity(rows, Path(args.plot or Path(args.out).with_suffix(".png")),
                  f"{rounds} round(s), {args.microbatches} microbatches")  # fmt: skip
    for cl, st in stats_by.items():
        for key, (rho, mape) in st.items():
            print(f"{cl} {key}: Spearman {rho:.3f}, MAPE {mape:.1f} %", flush=True)


#: The inputs drawn in the plot: the method fixed in advance, and the same without the
#: runtime's compute factor (what the factor corrects).
PLOT_COLUMNS = ("calibrated", "in_order")


def plot_fidelity(rows: list[dict], path: Path, title: str = "") -> Path:
    """Predicted against measured step time, one point per plan and input of
    :data:`PLOT_COLUMNS` (bars: the measured runs' interquartile range), the diagonal and
    a +-15 % band (the MAPE target); Spearman and MAPE of each input in its legend entry.
    Written as a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("measured") is not None and r.get("runs")]
    fig, axes = plt.subplots(1, len({r["cluster"] for r in ok}) or 1, squeeze=False,
                             figsize=(5.5, 5))  # fmt: skip
    for ax, cl in zip(axes[0], dict.fromkeys(r["cluster"] for r in ok)):
        rs = [r for r in ok if r["cluster"] == cl]
        meas = np.array([r["measured"] for r in rs]) * 1e3
        q1 = np.array([np.percentile(r["runs"], 25) for r in rs]) * 1e3
        q3 = np.array([np.percentile(r["runs"], 75) for r in rs]) * 1e3
        for key, marker in zip(PLOT_COLUMNS, ("o", "x")):
            sim = np.array([r[key] for r in rs]) * 1e3
            rho, mape = summarize(rs, key)
            ax.errorbar(meas, sim, xerr=[meas - q1, q3 - meas], fmt=marker, ms=5, capsize=2,
                        elinewidth=0.7, label=f"{key}: Spearman {rho:.3f}, MAPE {mape:.1f} %")  # fmt: skip
        lo = 0.8 * min(meas.min(), min(min(r[k] for k in PLOT_COLUMNS) for r in rs) * 1e3)
        hi = 1.1 * max(meas.max(), max(max(r[k] for k in PLOT_COLUMNS) for r in rs) * 1e3)
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, 0.85 * xs, 1.15 * xs, color="0.85", zorder=0, label="within 15 %")
        ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured step (ms, median of rounds)",
               ylabel="simulated step (ms)", title=f"{cl}: {len(rs)} plans")  # fmt: skip
        ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path, dpi=110, title=title)


def summarize(rows: list[dict], key: str) -> tuple[float, float]:
    """Spearman and MAPE (%) of simulated column ``key`` against the measured step times."""
    ok = [r for r in rows if r["measured"] is not None]
    meas = np.array([r["measured"] for r in ok])
    sim = np.array([r[key] for r in ok])
    rho = float(spearmanr(sim, meas).statistic) if len(ok) > 2 else float("nan")
    mape = float(np.mean(np.abs(sim - meas) / meas) * 100) if ok else float("nan")
    return rho, mape


def compute_line(rows: list[dict]) -> str:
    """What the runtime's own compute timers say about time-sharing (per step, summed over ranks)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        for ranks in r.get("compute", []):
            by.setdefault(r["world"], []).append(sum(ranks))
    if not by:
        return "- runtime compute timers: not recorded in this run"
    parts = [
        f"{k} process{'es' if k > 1 else ''}: median {np.median(v) * 1e3:.0f} ms ({len(v)} runs)"
        for k, v in sorted(by.items())
    ]
    return (
        "- compute time per step summed over the ranks, from the runtime's own timers "
        "(`ExecResult.compute`; the same work in every plan): " + "; ".join(parts)
    )


def runtime_line(cal: dict) -> str:
    """The runtime-calibration fits (``measure_runtime_slowdown``) behind the first two inputs."""
    fits = cal["measured"].get("runtime_slowdown") or {}
    free = cal["measured"].get("runtime_slowdown_free") or {}
    runs = cal["measured"].get("runtime_runs") or []
    if not fits:
        return (
            "- runtime compute factor: not measured in this run (the main input equals `in_order`)"
        )

    def describe(fs: dict) -> str:
        return "; ".join(
            f"{k} processes: factor {v['factor']:.3f}, endpoint cost "
            f"{v['transfer_overhead'] * 1e6:.0f} us (fit MAPE {v['fit_mape']:.1f} % over "
            f"{v['samples']} rank samples)"
            for k, v in sorted(fs.items())
        )

    return (
        "- runtime compute factor (`runtime.profile.measure_runtime_slowdown`: before each round "
        "the runtime executes three calibration plans that are not among the evaluated plans "
        "(one cut; a device change every second group; at every group), and each rank's "
        "compute timer is fitted as factor x its one-process per-node time + endpoint cost x "
        f"its transfers, least squares over all {len(runs)} calibration runs, refitted with "
        f"the final per-node times). Endpoint cost held at the measured mean: {describe(fits)}. "
        f"Both fitted (non-negative least squares; the `calibrated_free` input): {describe(free)}. "
        "These inputs multiply the per-node times of plans with >= 2 processes by the factor."
    )


def write_markdown(path: Path, rows, stats_by, cal, args, seconds, load, rounds) -> None:
    d, ln = cal["device"], cal["link"]
    conc = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(cal.get("concurrency", {}).items()))
    lines = [
        "# Simulator fidelity on this machine's CPU",
        "",
        "Measured step time (`runtime.execute_many`: one gloo process per device the plan "
        "uses, one torch thread each; in each round the plans with the same process count run "
        "one after another in one launch (`runtime.execute`'s default launcher), each with "
        "its own model build, "
        f"{args.steps} timed steps after 2 warm-up steps, median of "
        f"the slowest rank; each plan measured {rounds} times in shuffled, interleaved rounds "
        "and the median taken) versus the simulator's makespan "
        "(`placement_env.oracles.simulator.Simulator`, schedule `in_order` = the op-level "
        "runtime's static order unless the input says gpipe, every plan executed as an "
        f"op-level plan, {args.microbatches} microbatches) on the calibrated `cpu_N` cluster, for "
        f"plans of a small GPT-2 (`graphs.zoo` `gpt2` with {CONFIG}, fp32, coarsened to "
        f"{MODEL['max_groups']} groups, Adam).",
        "",
        f"Produced by `python scripts/bench_fidelity.py --devices {' '.join(map(str, args.devices))} "
        f"--random {args.random} --rounds {args.rounds} --microbatches {args.microbatches} "
        f"--nice {args.nice}{f' --seed {args.seed}' if args.seed else ''}`, {rounds} round(s) "
        "completed; "
        f"({seconds / 60:.1f} min of measurement). Machine: {os.cpu_count()} logical CPUs shared "
        "with other developers' jobs; load average (1/5/15 min) before "
        f"{'/'.join(f'{x:.1f}' for x in load['before'])}, after "
        f"{'/'.join(f'{x:.1f}' for x in load['after'])}.",
        "",
        "## Result",
        "",
        f"- plans executed: {sum(r['measured'] is not None for r in rows)} of {len(rows)}",
        "",
        "| cluster | simulator input | Spearman (target >= 0.9) | MAPE (target <= 15 %) |",
        "| --- | --- | --- | --- |",
    ]
    for cl, st in stats_by.items():
        for key, text in COLUMNS.items():
            rho, mape = st[key]
            lines.append(f"| {cl} | {text} | {rho:.3f} | {mape:.1f} % |")
    lines += [
        "",
        "## Calibration (`runtime.profile`, as `python -m runners.profile` does)",
        "",
        f"- one process: {d['peak_flops'] / 1e9:.1f} GFLOP/s (512^3 matmul), "
        f"{d['mem_bw'] / 1e9:.1f} GB/s (copy), per-op overhead {d['launch_overhead'] * 1e6:.1f} us "
        "(median of the model's cheaper ops)",
        f"- per-process speed with k processes computing at once, relative to one alone "
        f"(`measure_concurrent_speed`): {conc}",
        f"- gloo point-to-point (`measure_p2p`, best of 10 idle ping-pongs, fit): latency "
        f"{cal['measured']['p2p_latency'] * 1e6:.0f} us, bandwidth {ln['bandwidth'] / 1e9:.2f} GB/s",
        f"- hand-off (`measure_handoff`, mean one-way time of a tiny message to a rank that "
        f"computes in between; mean of the measurements before each round "
        f"{', '.join(f'{x * 1e6:.0f}' for x in cal['measured'].get('handoff_during_runs', []))}): "
        f"{ln['latency'] * 1e6:.0f} us, used as the link latency",
        f"- endpoint cost (`measure_transfer_overhead`: compute-stream time one `isend` of a "
        f"{message_bytes(args.microbatches) // 1024} KiB activation adds to a rank that computes "
        f"while its peer computes too; measured before each round "
        f"{', '.join(f'{x * 1e6:.0f}' for x in cal['measured'].get('transfer_overhead_during_runs', []))}): "
        f"{cal['measured']['transfer_overhead_used'] * 1e6:.0f} us, `Device.transfer_overhead`, "
        "charged per transfer on sender and receiver. (The blocking-`recv` figure of the same "
        "measurement is not used: gloo's send completes only when the receiver posts its "
        "`recv`, so that figure is the rendezvous wait the hand-off latency already models.)",
        "- time-sharing factor (`measure_concurrent_speed`) measured before each round: "
        + "; ".join(
            ", ".join(f"{k}: {v:.2f}" for k, v in sorted(c.items()))
            for c in cal["measured"].get("concurrency_during_runs", [])
        )
        + " (their mean is the factor above; used only by the `shared` input)",
        "- per-node times (`measure_graph_times`: one process, each op best of 5, at microbatch "
        "size) measured before each round, one-device step total "
        + ", ".join(f"{x:.0f}" for x in cal["measured"].get("node_times_total_ms", []))
        + " ms; their mean is the simulator's input",
        compute_line(rows),
        runtime_line(cal),
        "",
        "## Plans",
        "",
        "Simulated columns in ms, in the order of the result table; measured = median of the runs.",
        "",
        "| cluster | plan | processes | cuts | "
        + " | ".join(COLUMNS)
        + " | measured ms | runs ms |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in COLUMNS) + " | --- | --- |",
    ]
    for r in rows:
        measured = (
            "failed: " + r.get("error", "")[:80]
            if r["measured"] is None
            else f"{r['measured'] * 1e3:.1f}"
        )
        sims = " | ".join(f"{r[c] * 1e3:.1f}" for c in COLUMNS)
        runs = ", ".join(f"{x * 1e3:.0f}" for x in r["runs"])
        lines.append(
            f"| {r['cluster']} | {r['plan']} | {r['world']} | {r['cuts']} | {sims} | {measured} "
            f"| {runs} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    kept = old[old.index(ANALYSIS) :] if ANALYSIS in old else ""  # hand-written, kept across runs
    path.write_text("\n".join(lines) + "\n\n" + kept)


if __name__ == "__main__":
    main()
