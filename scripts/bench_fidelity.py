"""Simulator fidelity: measured (runtime.execute) vs simulated step time of many plans of a small GPT-2 on cpu_N.

Usage: python scripts/bench_fidelity.py [--out docs/fidelity.md] [--devices 2 3 4] [--random 3]

Calibrates cpu_N with runtime.profile (unless --calibration names an existing file),
makes baseline plans (agents.baselines, scored by the simulator) and random
group-respecting placements for each N, executes every plan with torchrun (one
process per device, gloo), simulates it with placement_env.oracles.simulator on the
calibrated cluster, and writes Spearman rank correlation and MAPE to a markdown file.
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
from runtime.execute import execute  # noqa: E402

CONFIG = dict(batch=8, seq=64, n_layer=4, d_model=256, n_head=4, vocab=512, n_ctx=64)
MODEL = {"name": "gpt2", "config": CONFIG, "max_groups": 12}
BASELINES = ("round_robin", "expert", "metis", "m_etf", "m_sct", "pipedream_dp")


def calibrate(path: Path, counts: list[int]) -> dict:
    from runtime.profile import (
        measure_concurrent_speed,
        measure_device,
        measure_ops,
        measure_p2p,
        write_calibration,
    )

    dev = measure_device(threads=1)
    ops = measure_ops({"name": "gpt2", "config": CONFIG})
    small = np.sort(np.fromiter(ops.values(), float))[: max(1, len(ops) // 2)]
    dev["launch_overhead"] = float(np.median(small)) * 1e-6
    conc = measure_concurrent_speed(sorted(set(counts) | {1}), seconds=3.0)
    return write_calibration(dev, measure_p2p(), path, memory=4 * 2**30, concurrency=conc)


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


def make_plans(
    graph, cluster, n_random: int, rng: np.random.Generator, M: int
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
    for i in range(n_random):
        per_group = rng.integers(0, cluster.num_devices, size=ngroups)
        plans.append((f"random{i}", Plan.for_graph(per_group[inv], graph, cluster)))
    # the simulator scores placements, not stages: every plan runs as an op-level plan
    return [
        (
            name,
            Plan.for_graph(
                p.placement, graph, cluster, microbatches=M, schedule="gpipe", meta={"model": MODEL}
            ),
        )
        for name, p in plans
    ]


COLUMNS = {
    "roofline": "roofline (one launch overhead per coarse node), independent processes",
    "roofline_ops": "roofline, one launch overhead per original op, time-sharing scaled",
    "times_free": "measured per-node times, independent processes",
    "times": "measured per-node times, time-sharing scaled",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "fidelity.md"))
    ap.add_argument("--devices", type=int, nargs="+", default=[2])
    ap.add_argument("--random", type=int, default=14)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--rounds", type=int, default=2, help="measure every plan this many times, interleaved"
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=0,
        help="os.nice increment for this process and its children (negative needs root)",
    )
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--json", default=None, help="also write raw rows here")
    args = ap.parse_args()
    if args.nice:
        os.nice(args.nice)

    load_before = os.getloadavg()
    cal_path = Path(args.calibration or ROOT / "outputs" / "fidelity" / "cpu_calibration.json")
    cal = json.loads(cal_path.read_text()) if cal_path.exists() else None
    if cal is None or "concurrency" not in cal:
        print("calibrating ...", flush=True)
        cal = calibrate(cal_path, args.devices)
    graph = zoo.build("gpt2", max_groups=MODEL["max_groups"], precision="fp32", **CONFIG)
    from runtime.profile import measure_graph_times

    M = args.microbatches
    timed = measure_graph_times(graph, MODEL, microbatches=M)
    rng = np.random.default_rng(0)
    jobs = []
    for N in args.devices:
        cluster = cpu_cluster(N, calibration=cal)
        for name, plan in make_plans(graph, cluster, args.random, rng, M):
            k = used(plan.placement)
            scaled = cpu_cluster(N, calibration=cal, processes=k)
            f = concurrency_factor(cal, k)
            roof_ops = graph.replace(times=dict(graph.times, cpu=per_op_times(graph, scaled, M)))
            t_scaled = timed.replace(times={"cpu": timed.times["cpu"] / f})

            def sim(g, c, p=plan.placement):
                return float(
                    Simulator(g, c, microbatches=M, schedule="gpipe").evaluate(p).step_time
                )

            row = dict(
                cluster=f"cpu_{N}",
                plan=name,
                world=k,
                roofline=sim(graph, cluster),
                roofline_ops=sim(roof_ops, scaled),
                times_free=sim(timed, cluster),
                times=sim(t_scaled, scaled),
                runs=[],
            )
            jobs.append((row, plan, cluster))
    t_start = time.time()
    for r in range(args.rounds):  # interleaved: a load drift hits every plan alike
        for i in rng.permutation(len(jobs)):
            row, plan, cluster = jobs[i]
            try:
                res = execute(
                    plan,
                    graph,
                    cluster,
                    steps=args.steps,
                    warmup=2,
                    optimizer="adam",
                    timeout_s=300,
                )
                row["runs"].append(res.step_time)
            except Exception as exc:  # noqa: BLE001 - record the failure in the table
                row["error"] = str(exc)[:200]
            print(r, row["cluster"], row["plan"], row["runs"], row.get("error", ""), flush=True)
    rows = [row for row, _, _ in jobs]
    for row in rows:
        row["measured"] = float(np.median(row["runs"])) if row["runs"] else None
    load = {"before": load_before, "after": os.getloadavg()}
    stats = {c: summarize(rows, c) for c in COLUMNS}
    stats_by = {
        cl: {c: summarize([r for r in rows if r["cluster"] == cl], c) for c in COLUMNS}
        for cl in dict.fromkeys(r["cluster"] for r in rows)
    }
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": rows,
                    "stats": stats,
                    "by_cluster": stats_by,
                    "calibration": cal,
                    "load": load,
                },
                indent=1,
            )
        )
    write_markdown(Path(args.out), rows, stats_by, cal, args, time.time() - t_start, load)
    for cl, st in stats_by.items():
        for key, (rho, mape) in st.items():
            print(f"{cl} {key}: Spearman {rho:.3f}, MAPE {mape:.1f} %")


def summarize(rows: list[dict], key: str) -> tuple[float, float]:
    """Spearman and MAPE (%) of simulated column ``key`` against the measured step times."""
    ok = [r for r in rows if r["measured"] is not None]
    meas = np.array([r["measured"] for r in ok])
    sim = np.array([r[key] for r in ok])
    rho = float(spearmanr(sim, meas).statistic) if len(ok) > 2 else float("nan")
    mape = float(np.mean(np.abs(sim - meas) / meas) * 100) if ok else float("nan")
    return rho, mape


def write_markdown(path: Path, rows, stats_by, cal, args, seconds, load) -> None:
    d, ln = cal["device"], cal["link"]
    conc = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(cal.get("concurrency", {}).items()))
    lines = [
        "# Simulator fidelity on this machine's CPU",
        "",
        "Measured step time (`runtime.execute`, torchrun, one gloo process per device the plan "
        f"uses, one torch thread each, {args.steps} timed steps after 2 warm-up steps, median of "
        f"the slowest rank; each plan measured {args.rounds} times in shuffled, interleaved rounds "
        "and the median taken) versus the simulator's makespan "
        "(`placement_env.oracles.simulator.Simulator`, GPipe order, every plan executed as an "
        f"op-level plan, {args.microbatches} microbatches) on the calibrated `cpu_N` cluster, for "
        f"plans of a small GPT-2 (`graphs.zoo` `gpt2` with {CONFIG}, fp32, coarsened to "
        f"{MODEL['max_groups']} groups, Adam).",
        "",
        f"Produced by `python scripts/bench_fidelity.py --devices {' '.join(map(str, args.devices))} "
        f"--random {args.random} --rounds {args.rounds} --nice {args.nice}` "
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
        f"- gloo point-to-point: latency {ln['latency'] * 1e6:.0f} us, bandwidth "
        f"{ln['bandwidth'] / 1e9:.2f} GB/s",
        "",
        "## Plans",
        "",
        "Simulated columns in ms, in the order of the result table; measured = median of the runs.",
        "",
        "| cluster | plan | processes | " + " | ".join(COLUMNS) + " | measured ms | runs ms |",
        "| --- | --- | --- | " + " | ".join("---" for _ in COLUMNS) + " | --- | --- |",
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
            f"| {r['cluster']} | {r['plan']} | {r['world']} | {sims} | {measured} | {runs} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
