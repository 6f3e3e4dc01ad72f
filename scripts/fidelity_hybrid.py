"""Hybrid simulator fidelity (``python scripts/bench_fidelity.py --hybrid``): measured vs predicted
step time and per-rank peak memory of dp x tp x pp / ZeRO / recomputation plans of a small GPT on
4-8 gloo CPU processes.

Usage: python scripts/bench_fidelity.py --hybrid [--rounds 6] [--steps 5] [--nice -10]
       [--json RAW.json] [--resimulate RAW.json] [--out docs/fidelity.md] [--limit N]

Once: ``runtime.hybrid_profile.calibrate_hybrid`` measures every segment's forward /
backward CPU seconds (tp 1, 2, 4; microbatch 1, 2, 4, 8; recompute none / full), the
optimizer's cost, and runs the runtime on its probe plans (``runtime.hybrid_profile.PROBES``
at 1, 4 and 8 processes, none of them a benchmark plan) to solve the runtime's overheads per
process count and measure the worker's memory base. Then, in each round: the gloo
collectives are re-measured, the plans are shuffled, and for each process count (in
shuffled order) the per-process speed with k processes is measured, the plans of that
count run one after another in one launch (``runtime.execute.run_specs``: each
its own model build, 2 warm-up and ``--steps`` timed steps, Adam), and the speed is
measured again. Each round's plans are predicted by ``Simulator(graph,
cpu_cluster(k, calibration={"hybrid": that round's calibration})).evaluate(plan)``
(:class:`placement_env.oracles.hybrid_cpu.CpuHybridModel`). Step time: median over rounds
of the measured (slowest rank, median of the timed steps) and of the predicted; Spearman
and MAPE over the plans. Memory per rank: this run's own peak resident set
(``ExecResult.run_peak``) vs the model's ``base + step``, and the steps' own memory
(``ExecResult.step_memory``) vs the model's step terms. The markdown section between the
HYBRID markers of ``--out`` is rewritten after every round (the rest of the file is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = dict(batch=8, seq=64, n_layer=4, d_model=256, n_head=4, vocab=512, n_ctx=64)
MODEL = {"name": "gpt2", "config": CONFIG}
GLOBAL_BATCH = 8
START = "<!-- hybrid fidelity: written by scripts/bench_fidelity.py --hybrid -->"
END = "<!-- end of hybrid fidelity -->"


@dataclass(frozen=True)
class HybridCase:
    """One plan of the benchmark: ``Plan.hybrid`` arguments."""

    dp: int
    tp: int
    pp: int
    microbatch_size: int
    zero: int = 0
    recompute: str = "none"
    stage_meshes: tuple[tuple[int, int], ...] = ()  # one (dp, tp) per stage, or empty

    def __post_init__(self) -> None:  # JSON gives lists
        object.__setattr__(self, "stage_meshes", tuple(tuple(m) for m in self.stage_meshes))

    @property
    def world(self) -> int:
        if self.stage_meshes:
            return sum(d * t for d, t in self.stage_meshes)
        return self.dp * self.tp * self.pp

    @property
    def microbatches(self) -> int:
        return GLOBAL_BATCH // (self.dp * self.microbatch_size)

    @property
    def name(self) -> str:
        rc = {"none": "", "full": " rc"}[self.recompute]
        z = f" z{self.zero}" if self.dp > 1 or self.stage_meshes else ""
        if self.stage_meshes:
            meshes = "/".join(f"d{d}t{t}" for d, t in self.stage_meshes)
            return f"{meshes} b{self.microbatch_size}{z}{rc}"
        return f"d{self.dp} t{self.tp} p{self.pp} b{self.microbatch_size}{z}{rc}"

    def plan(self, graph: Any, cluster: Any) -> Any:
        from graphs.plan import Plan

        return Plan.hybrid(
            graph, cluster, dp=self.dp, tp=self.tp, pp=self.pp,
            microbatch_size=self.microbatch_size, global_batch=GLOBAL_BATCH, zero=self.zero,
            recompute=self.recompute, meta={"model": MODEL},
            **({"stage_meshes": [list(m) for m in self.stage_meshes]} if self.stage_meshes else {}),
        )  # fmt: skip


#: The benchmark's plans: 4 and 8 processes, every (d, t, p) split of them the model allows
#: (4 blocks, 4 heads, batch 8) at least once, ZeRO 0 / 3 and recomputation none / full.
CASES = (
    HybridCase(4, 1, 1, 2, 0),
    HybridCase(4, 1, 1, 2, 3),
    HybridCase(4, 1, 1, 2, 3, "full"),
    HybridCase(1, 4, 1, 8),
    HybridCase(1, 4, 1, 8, 0, "full"),
    HybridCase(1, 1, 4, 2),
    HybridCase(1, 1, 4, 2, 0, "full"),
    HybridCase(2, 2, 1, 4, 0),
    HybridCase(2, 2, 1, 4, 3, "full"),
    HybridCase(2, 1, 2, 2, 0),
    HybridCase(2, 1, 2, 2, 3),
    HybridCase(1, 2, 2, 2),
    HybridCase(2, 2, 2, 2, 0),
    HybridCase(2, 2, 2, 2, 3, "full"),
    HybridCase(4, 2, 1, 2, 0),
    HybridCase(4, 1, 2, 1, 3),
    HybridCase(2, 1, 4, 1, 0),
    HybridCase(1, 4, 2, 2),
    HybridCase(1, 2, 4, 2, 0, "full"),
    HybridCase(8, 1, 1, 1, 3),
    HybridCase(2, 4, 1, 4, 0),
)


#: ``--cases submesh``: plans whose two stages have their own submeshes (``stage_meshes``, run
#: by ``runtime.submesh``), beside the uniform plans of the same first stage.
SUBMESH_CASES = (
    HybridCase(2, 1, 2, 2, 0, stage_meshes=((2, 1), (1, 2))),
    HybridCase(2, 1, 2, 2, 3, stage_meshes=((2, 1), (1, 2))),
    HybridCase(1, 2, 2, 2, 0, stage_meshes=((1, 2), (2, 1))),
    HybridCase(2, 2, 2, 2, 0, stage_meshes=((2, 2), (4, 1))),
    HybridCase(4, 1, 2, 1, 0, stage_meshes=((4, 1), (2, 2))),
    HybridCase(2, 1, 2, 2, 0),
    HybridCase(2, 1, 2, 2, 3),
    HybridCase(1, 2, 2, 2),
    HybridCase(2, 2, 2, 2, 0),
    HybridCase(4, 1, 2, 1, 0),
)
SUITES = {"all": CASES, "submesh": SUBMESH_CASES}


def markers(suite: str) -> tuple[str, str]:
    """The markers of the section ``suite`` writes in ``--out``."""
    if suite == "all":
        return START, END
    return (
        f"<!-- hybrid {suite} fidelity: written by scripts/bench_fidelity.py --hybrid "
        f"--cases {suite} -->",
        f"<!-- end of hybrid {suite} fidelity -->",
    )


def calibrated_shapes(cases: tuple[HybridCase, ...]) -> tuple[list[int], list[int]]:
    """The tensor-parallel degrees and microbatch sizes whose segment times the benchmark
    needs: every stage's of every case (a stage on its own submesh takes ``dp_0 b / dp_p``
    rows) and every runtime probe's at the cases' process counts and at 1."""
    from runtime.hybrid_profile import PROBES

    tps, sizes = {1, 2}, {1, 2, 4}
    for c in cases:
        for dp, tp in c.stage_meshes or ((c.dp, c.tp),):
            tps.add(tp)
            sizes.add(c.dp * c.microbatch_size // dp)
    for k in {1} | {c.world for c in cases}:
        for _, (_, tp, _, b, _) in PROBES.get(k, ()):
            tps.add(tp)
            sizes.add(b)
    return sorted(tps), sorted(sizes)


def make_plans(graph: Any, cases: tuple[HybridCase, ...] = CASES) -> list[tuple[HybridCase, Any]]:
    """``(case, Plan.hybrid)`` of each case on ``cpu_{world}`` (raises on an invalid case)."""
    from graphs.cpu_cluster import cpu_cluster

    return [(c, c.plan(graph, cpu_cluster(c.world))) for c in cases]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from scripts.argtypes import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hybrid", action="store_true", help="(selects this benchmark)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "fidelity.md"))
    ap.add_argument("--rounds", type=positive_int, default=6)
    ap.add_argument("--steps", type=positive_int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="only the first N plans")
    ap.add_argument(
        "--cases", choices=tuple(SUITES), default="all",
        help="the plans: every (d, t, p) split (default) or the per-stage submesh plans with "
        "their uniform counterparts (own markdown section)",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffled orders")
    ap.add_argument(
        "--nice", type=int, default=0,
        help="os.nice increment for this process and its children (negative needs root)",
    )  # fmt: skip
    ap.add_argument("--json", default=None, help="also write raw measurements here")
    ap.add_argument(
        "--resimulate", default=None,
        help="JSON of an earlier run: reuse its measurements and calibrations, re-predict",
    )  # fmt: skip
    ap.add_argument(
        "--calibration", default=None,
        help="JSON of calibrate_hybrid's once-measured parts to reuse (else measured at the start)",
    )  # fmt: skip
    ap.add_argument(
        "--speed", choices=("round", "median", "probes", "joint"), default="round",
        help="with --resimulate: each round's measured speed (default); the median over "
        "rounds, the runtime overheads re-solved under it; the speed fitted to the runtime "
        "probes of each k (no k-process overheads); or 'joint': the per-microbatch overhead "
        "and every k's speed fitted together to all the probes",
    )  # fmt: skip
    ap.add_argument(
        "--overheads", choices=("all", "single"), default="all",
        help="with --resimulate: use every solved runtime overhead (default) or only the "
        "1-process one (microbatch), dropping those solved from the k-process probes",
    )  # fmt: skip
    ap.add_argument(
        "--deadline", type=float, default=None, help="stop starting rounds after this many minutes"
    )
    return ap.parse_args(argv)


# ------------------------------------------------------------------ prediction
def round_calibration(base: dict[str, Any], rnd: dict[str, Any]) -> dict[str, Any]:
    """The hybrid calibration of one round: the once-measured parts + that round's speed and
    collectives (speed: mean of the figures measured around each launch)."""
    cal = dict(base)
    cal["collectives"] = rnd["collectives"]
    speed: dict[str, float] = {"1": 1.0}
    for k, vals in rnd["speed"].items():
        speed[k] = float(np.mean(vals))
    cal["speed"] = speed
    return cal


def median_speed(graph: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every round's per-process speed replaced by the median over all rounds of
    the figures measured around the launches (per k), and the runtime overheads re-solved
    from the same probe step times under those speeds (``--speed median``: a robust
    alternative to one round's two 1-second speed samples on a machine whose other jobs
    come and go)."""
    from runtime.hybrid_profile import solve_runtime_overhead

    vals: dict[str, list[float]] = {}
    for rnd in raw["rounds"]:
        for k, v in rnd["speed"].items():
            vals.setdefault(k, []).extend(v)
    med = {k: float(np.median(v)) for k, v in vals.items()}
    base = dict(raw["calibration"])
    speed = {"1": 1.0, **med}
    probes = base.get("runtime_probes") or {}
    if raw.get("overheads_mode") == "single":
        probes = {key: p for key, p in probes.items() if key.startswith("1/")}
    if probes:
        colls = base.get("runtime_collectives") or raw["rounds"][0]["collectives"]
        now = dict(base, speed=speed, collectives=colls)
        base["runtime"] = solve_runtime_overhead(
            graph, now, {key: p["measured"] for key, p in probes.items()}
        )
    out = dict(raw, calibration=base, speed_mode="median")
    out["rounds"] = [dict(rnd, speed={k: [med[k]] for k in rnd["speed"]}) for rnd in raw["rounds"]]
    return out


def probe_speed(graph: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the per-process speed of each k fitted to the runtime's own probe plans of
    k processes (``--speed probes``): the one factor that minimises the squared log error of
    the model's step time over those probes (golden-section search in [0.05, 1]), with the
    1-process ``microbatch`` overhead kept and no k-process overheads. The matmul speed
    measured per round says how many cores the processes get for dense arithmetic; this
    says it for the runtime's own mix of dispatch, autograd and gloo."""
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.hybrid_cpu import CpuHybridModel
    from runtime.hybrid_profile import PROBES, probe_plan

    base = dict(raw["calibration"])
    probes = base.get("runtime_probes") or {}
    colls = base.get("runtime_collectives") or raw["rounds"][0]["collectives"]
    base["runtime"] = {"1": dict((base.get("runtime") or {}).get("1") or {})}
    speed: dict[str, float] = {"1": 1.0}
    for k in sorted({int(key.split("/")[0]) for key in probes} - {1}):
        lays = []
        for name, _ in PROBES[k]:
            lay = probe_plan(graph, k, name, global_batch=GLOBAL_BATCH).layout
            lays.append((lay, probes[f"{k}/{name}"]["measured"]))

        def loss(x: float, k: int = k, lays: Any = lays) -> float:
            cal = dict(base, speed={**speed, str(k): x}, collectives=colls)
            model = CpuHybridModel(graph, cpu_cluster(k), cal)
            return sum(np.log(model.evaluate(lay).step_time / t) ** 2 for lay, t in lays)

        lo, hi = 0.05, 1.0
        g = (np.sqrt(5) - 1) / 2
        for _ in range(40):
            a, b2 = hi - g * (hi - lo), lo + g * (hi - lo)
            if loss(a) < loss(b2):
                hi = b2
            else:
                lo = a
        speed[str(k)] = 0.5 * (lo + hi)
    base["probe_speed"] = speed
    out = dict(raw, calibration=base, speed_mode="probes")
    out["rounds"] = [
        dict(rnd, speed={k: [speed[k]] for k in rnd["speed"]}) for rnd in raw["rounds"]
    ]
    return out


def joint_speed(graph: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the per-microbatch overhead and every k's per-process speed fitted jointly
    to all the runtime's probe plans (``--speed joint``,
    :func:`runtime.hybrid_profile.fit_to_probes`): as ``--speed probes``, but the
    1-process overhead is fitted with the speeds instead of taken from the 1-process probe's
    residual."""
    from runtime.hybrid_profile import fit_to_probes

    base = fit_to_probes(graph, dict(raw["calibration"]), global_batch=GLOBAL_BATCH)
    speed = base["speed"]
    out = dict(raw, calibration=base, speed_mode="joint")
    out["rounds"] = [
        dict(rnd, speed={k: [speed[k]] for k in rnd["speed"]}) for rnd in raw["rounds"]
    ]
    return out


def predict(graph: Any, case: HybridCase, cal: dict[str, Any]) -> dict[str, Any]:
    """Predicted step time and per-rank memory of ``case`` under hybrid calibration ``cal``
    (through ``Simulator.evaluate``, as every other caller gets it)."""
    from graphs.cpu_cluster import cpu_cluster
    from placement_env.oracles.simulator import Simulator

    cl = cpu_cluster(case.world, calibration={"hybrid": cal})
    plan = case.plan(graph, cl)
    r = Simulator(graph, cl).evaluate(plan)
    bd = r.breakdown
    stage_of = [plan.layout.coords(i)[0] for i in range(case.world)]
    return {
        "step_time": float(r.step_time),
        "peak": [float(bd["memory_per_rank"][p]) for p in stage_of],
        "step_memory": [float(bd["memory_step"][p]) for p in stage_of],
        "share_time": float(bd["share_time"]),
        "critical_path": float(bd["critical_path"]),
        "cores": float(bd["cores"]),
    }


def spearman(a: Any, b: Any) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def summarize(graph: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Per-plan medians, prediction per round (median) and the fidelity figures."""
    rows = []
    rounds = raw["rounds"]
    for name, meas in raw["measured"].items():
        case = HybridCase(**raw["cases"][name])
        done = [(i, m) for i, m in enumerate(meas) if m is not None]
        if not done:
            continue
        preds = [
            predict(graph, case, round_calibration(raw["calibration"], rounds[i])) for i, _ in done
        ]
        runs = [m["step_time"] for _, m in done]
        peak_meas = np.median([m["run_peak"] for _, m in done], axis=0)
        step_meas = np.median([m["step_memory"] for _, m in done], axis=0)
        peak_pred = np.median([p["peak"] for p in preds], axis=0)
        step_pred = np.median([p["step_memory"] for p in preds], axis=0)
        rows.append(
            {
                "plan": name,
                "case": raw["cases"][name],
                "runs": runs,
                "measured": float(np.median(runs)),
                "predicted": float(np.median([p["step_time"] for p in preds])),
                "share_time": float(np.median([p["share_time"] for p in preds])),
                "critical_path": float(np.median([p["critical_path"] for p in preds])),
                "peak_measured": peak_meas.tolist(),
                "peak_predicted": peak_pred.tolist(),
                "step_mem_measured": step_meas.tolist(),
                "step_mem_predicted": step_pred.tolist(),
            }
        )
    out: dict[str, Any] = {"rows": rows}
    if len(rows) >= 2:
        meas = np.array([r["measured"] for r in rows])
        pred = np.array([r["predicted"] for r in rows])
        out["spearman"] = spearman(meas, pred)
        out["mape"] = float(np.mean(np.abs(pred - meas) / meas) * 100)
        out["bias"] = float(np.median(pred / meas))
        pm = np.concatenate([r["peak_measured"] for r in rows])
        pp = np.concatenate([r["peak_predicted"] for r in rows])
        err = np.abs(pp - pm) / pm
        out["mem_mean_err"] = float(err.mean() * 100)
        out["mem_within"] = int((err <= 0.15).sum())
        out["mem_ranks"] = int(len(err))
        out["mem_max_err"] = float(err.max() * 100)
        sm = np.concatenate([r["step_mem_measured"] for r in rows])
        sp = np.concatenate([r["step_mem_predicted"] for r in rows])
        serr = np.abs(sp - sm) / np.maximum(sm, 1.0)
        out["step_mem_mean_err"] = float(serr.mean() * 100)
        out["step_mem_within"] = int((serr <= 0.15).sum())
        out["step_mem_spearman"] = spearman(sm, sp)
    return out


# ------------------------------------------------------------------ markdown
def _load(x: Any) -> str:
    return "/".join(f"{v:.1f}" for v in x)


def markdown(raw: dict[str, Any], summary: dict[str, Any], command: str) -> str:
    rows = summary["rows"]
    n_rounds = raw.get("rounds_done", 0)
    loads = raw.get("load", {})
    suite = raw.get("suite", "all")
    start, end = markers(suite)
    title = (
        "## Hybrid plans (dp x tp x pp, ZeRO, recomputation): `bench_fidelity.py --hybrid`"
        if suite == "all"
        else f"### Stages on their own submeshes: `bench_fidelity.py --hybrid --cases {suite}`"
    )
    lines = [
        start,
        title,
        "",
        f"Produced by `{command}`: {n_rounds} round(s) completed, "
        f"{raw.get('seconds', float('nan')) / 60:.1f} min. Machine: "
        f"{os.cpu_count()} logical CPUs; load average (1/5/15 min; the benchmark's own 4-8 "
        "processes count) before "
        f"{_load(loads.get('before', []))}, after {_load(loads.get('after', []))}"
        + (
            f"; per round: {', '.join(_load(x[:1]) for x in loads.get('rounds', []))}"
            if loads.get("rounds")
            else ""
        )
        + ".",
        "",
        f"Model: `graphs.zoo` `gpt2` {CONFIG} (fp32, Adam), global batch {GLOBAL_BATCH}. "
        f"{len(rows)} plans on 4 and 8 gloo processes (one torch thread each), executed by "
        "`runtime.execute.run_specs` in shuffled interleaved rounds (each process count one "
        "launch per round; each plan its own build, "
        f"{raw.get('warmup', 2)} warm-up and {raw.get('steps', 5)} timed steps); measured = "
        "median over rounds of the slowest rank's median step. Predicted = "
        "`Simulator(graph, cpu_cluster(k, calibration={'hybrid': cal})).evaluate(plan)` "
        "(`placement_env.oracles.hybrid_cpu.CpuHybridModel`), median over rounds of the "
        "prediction with that round's calibration: segment CPU times, optimizer, runtime "
        "overheads and memory base measured once at the start "
        "(`runtime.hybrid_profile.calibrate_hybrid`; the overheads and the memory base from "
        "running the runtime on the probe plans of `runtime.hybrid_profile.PROBES` at 1, 4 and "
        "8 processes, none of them a benchmark plan); gloo collectives and per-process speed "
        "with k processes re-measured every round, the speed right before and after each "
        "launch.",
        "",
    ]
    if raw.get("overheads_mode") == "single":
        lines += [
            "Predicted here with `--overheads single` (a revision made after seeing the "
            "figures): only the 1-process runtime overhead (per microbatch) is used; the "
            "overheads solved from the k-process probes are dropped.",
            "",
        ]
    if raw.get("speed_mode") == "median":
        lines += [
            "Predicted here with `--speed median`: every round's per-process speed replaced by "
            "the median over all rounds (per k) and the runtime overheads re-solved from the "
            "same probe step times under it.",
            "",
        ]

    def speeds(sp: dict[str, float]) -> str:
        return ", ".join(
            f"k={k}: {v:.2f}" for k, v in sorted(sp.items(), key=lambda kv: int(kv[0]))
        )

    if raw.get("speed_mode") == "probes":
        lines += [
            "Predicted here with `--speed probes` (a revision made after seeing the figures "
            "above): the per-process speed of each k fitted to the runtime's own probe plans of "
            "k processes (none a benchmark plan) instead of the matmul speed measured per round, "
            "no k-process overheads: " + speeds(raw["calibration"].get("probe_speed", {})) + ".",
            "",
        ]
    if raw.get("speed_mode") == "joint":
        fit = raw["calibration"].get("probe_fit", {})
        lines += [
            "Predicted here with `--speed joint`: the per-microbatch overhead and the "
            "per-process speed of each k fitted jointly to all the runtime's probe plans (none "
            "a benchmark plan; `runtime.hybrid_profile.fit_to_probes`): microbatch "
            f"{1e3 * fit.get('microbatch', float('nan')):.2f} ms, speed "
            + speeds(fit.get("speed", {}))
            + ".",
            "",
        ]
    if "spearman" in summary:
        s = summary
        lines += [
            "| figure | target | measured |",
            "| --- | --- | --- |",
            f"| Spearman (step time) | >= 0.9 | {s['spearman']:.3f} |",
            f"| MAPE (step time) | <= 15 % | {s['mape']:.1f} % |",
            f"| median predicted / measured | | {s['bias']:.2f} |",
            f"| peak memory per rank (run's own peak RSS vs base + step): mean error | "
            f"within 15 % | {s['mem_mean_err']:.1f} % (max {s['mem_max_err']:.1f} %) |",
            f"| ranks within 15 % | | {s['mem_within']} of {s['mem_ranks']} |",
            f"| step memory (peak minus after-build RSS) vs model's step terms: mean error | | "
            f"{s['step_mem_mean_err']:.1f} % ({s['step_mem_within']} of {s['mem_ranks']} "
            f"within 15 %, Spearman {s['step_mem_spearman']:.2f}) |",
            "",
        ]
    lines += [
        "| plan (d t p b ZeRO rc) | k | measured ms | predicted ms | error | work/cores ms "
        "| critical path ms | peak MiB meas / pred (max rank) | step MiB meas / pred "
        "(max rank) | runs ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    mib = 2.0**20
    for r in sorted(rows, key=lambda r: r["measured"]):
        c = r["case"]
        k = c["dp"] * c["tp"] * c["pp"]
        err = (r["predicted"] - r["measured"]) / r["measured"] * 100
        i = int(np.argmax(r["peak_measured"]))
        j = int(np.argmax(r["step_mem_measured"]))
        lines.append(
            f"| {r['plan']} | {k} | {r['measured'] * 1e3:.0f} | {r['predicted'] * 1e3:.0f} | "
            f"{err:+.0f} % | {r['share_time'] * 1e3:.0f} | {r['critical_path'] * 1e3:.0f} | "
            f"{r['peak_measured'][i] / mib:.0f} / {r['peak_predicted'][i] / mib:.0f} | "
            f"{r['step_mem_measured'][j] / mib:.1f} / {r['step_mem_predicted'][j] / mib:.1f} | "
            f"{', '.join(f'{x * 1e3:.0f}' for x in r['runs'])} |"
        )
    base = raw["calibration"]
    mem = base.get("memory", {})
    rt = base.get("runtime") or {}
    probes = base.get("runtime_probes") or {}
    lines += [
        "",
        "Calibration (once, at the start): worker memory base "
        f"{mem.get('worker_base', 0) / mib:.0f} MiB (the 1-process probe's resident set after "
        f"its build), step residue {mem.get('step_residue', 0) / mib:.0f} MiB (its measured "
        "step memory minus the model's gradient + Adam + activation terms), Adam "
        f"{base.get('optimizer', {}).get('adam_cpu_per_param', 0) * 1e9:.2f} ns CPU per "
        "parameter. Runtime overheads solved from the probes (ms): "
        + "; ".join(
            f"k={k}: " + ", ".join(f"{n} {x * 1e3:.2f}" for n, x in v.items())
            for k, v in sorted(rt.items(), key=lambda kv: int(kv[0]))
        )
        + ". Probe step times (ms, median of "
        + f"{len(next(iter(probes.values()))['runs']) if probes else 0} launches): "
        + ", ".join(
            f"{key} d{p['layout'][0]} t{p['layout'][1]} p{p['layout'][2]} b{p['layout'][3]}"
            f" z{p['layout'][4]} {p['measured'] * 1e3:.0f}"
            for key, p in probes.items()
        )
        + ".",
        "",
        "Per-process speed with k processes, per round (mean of the figures before and after "
        "each launch): "
        + "; ".join(
            ", ".join(f"k={k}: {np.mean(v):.2f}" for k, v in sorted(rd["speed"].items()))
            for rd in raw["rounds"]
            if rd.get("speed")
        )
        + ".",
        "",
        end,
    ]
    return "\n".join(lines)


def write_section(path: Path, text: str) -> None:
    """Replace the section between the markers ``text`` starts and ends with in ``path``
    (append it if absent)."""
    old = path.read_text() if path.exists() else ""
    start, end = text.split("\n", 1)[0], text.rstrip("\n").rsplit("\n", 1)[-1]
    if start in old and end in old:
        a, b = old.index(start), old.index(end) + len(end)
        new = old[:a] + text + old[b:]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


# ------------------------------------------------------------------ measuring
def run(args: argparse.Namespace, argv: list[str]) -> None:
    from runtime.execute import run_specs
    from runtime.hybrid_profile import calibrate_hybrid, measure_collectives
    from runtime.model import graph_for_model
    from runtime.profile import measure_concurrent_speed
    from runtime.spec import make_run_spec

    if args.nice:
        os.nice(args.nice)
    command = "python scripts/bench_fidelity.py " + " ".join(argv)
    graph = graph_for_model(MODEL)
    out = Path(args.out)
    if args.resimulate:
        raw = json.loads(Path(args.resimulate).read_text())
        if args.overheads == "single":  # keep the 1-process overhead only
            cal = dict(raw["calibration"])
            cal["runtime"] = {"1": dict((cal.get("runtime") or {}).get("1") or {})}
            raw = dict(raw, calibration=cal, overheads_mode="single")
        if args.speed == "median":
            raw = median_speed(graph, raw)
        elif args.speed == "probes":
            raw = probe_speed(graph, raw)
        elif args.speed == "joint":
            raw = joint_speed(graph, raw)
        summary = summarize(graph, raw)
        write_section(out, markdown(raw, summary, raw.get("command", command)))
        _print(summary)
        return
    suite = SUITES[args.cases]
    cases = suite[: args.limit] if args.limit else suite
    plans = make_plans(graph, cases)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    raw: dict[str, Any] = {
        "command": command,
        "model": MODEL,
        "steps": args.steps,
        "warmup": args.warmup,
        "suite": args.cases,
        "cases": {c.name: c.__dict__ for c, _ in plans},
        "measured": {c.name: [] for c, _ in plans},
        "rounds": [],
        "load": {"before": list(os.getloadavg()), "rounds": []},
    }
    if args.calibration:
        raw["calibration"] = json.loads(Path(args.calibration).read_text())
    else:
        print("calibrating segments, optimizer ...", flush=True)
        tps, sizes = calibrated_shapes(cases)
        raw["calibration"] = calibrate_hybrid(
            MODEL, tps=tps, micro_sizes=sizes,
            recomputes=sorted({"none"} | {c.recompute for c in cases}),
            parts=("segments", "optimizer"),
        )  # fmt: skip
        _save_calibration(args, raw["calibration"])
    if "runtime" not in raw["calibration"]:
        print("runtime probes ...", flush=True)
        raw["calibration"] = calibrate_hybrid(
            MODEL, probe_worlds=sorted({c.world for c in cases}), parts=("runtime",),
            base=raw["calibration"],
        )  # fmt: skip
        _save_calibration(args, raw["calibration"])
    by_world: dict[int, list[int]] = {}
    for i, (c, _) in enumerate(plans):
        by_world.setdefault(c.world, []).append(i)
    for r in range(args.rounds):
        if args.deadline is not None and (time.time() - t0) / 60 > args.deadline:
            print(f"deadline: stopping before round {r}", flush=True)
            break
        rnd: dict[str, Any] = {"speed": {}, "load": list(os.getloadavg())}
        raw["load"]["rounds"].append(rnd["load"])
        rnd["collectives"] = measure_collectives(sorted({2} | {c.dp for c in cases if c.dp > 1}))
        for name in raw["measured"]:
            raw["measured"][name].append(None)
        for k in rng.permutation(sorted(by_world)):
            k = int(k)
            idx = [int(i) for i in rng.permutation(by_world[k])]
            speeds = [measure_concurrent_speed((1, k), seconds=1.0)[str(k)]]
            specs = [
                make_run_spec(
                    plans[i][1],
                    graph,
                    _cluster(k),
                    MODEL,
                    steps=args.steps,
                    warmup=args.warmup,
                    optimizer="adam",
                )  # fmt: skip
                for i in idx
            ]
            try:
                results = run_specs(specs, timeout_s=1800)
            except Exception as exc:  # noqa: BLE001 - recorded, the round goes on
                print(f"round {r}: k={k} failed: {exc}", flush=True)
                results = []
            speeds.append(measure_concurrent_speed((1, k), seconds=1.0)[str(k)])
            rnd["speed"][str(k)] = speeds
            for i, res in zip(idx, results):
                name = plans[i][0].name
                raw["measured"][name][-1] = {
                    "step_time": res.step_time,
                    "step_times": res.step_times,
                    "run_peak": res.run_peak,
                    "step_memory": res.step_memory,
                    "base_memory": res.base_memory,
                    "compute": res.compute,
                    "comm": res.comm,
                    "cpu": res.cpu,
                }
                print(f"round {r} k={k} {name}: {res.step_time * 1e3:.0f} ms", flush=True)
        raw["rounds"].append(rnd)
        raw["rounds_done"] = r + 1
        raw["seconds"] = time.time() - t0
        raw["load"]["after"] = list(os.getloadavg())
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(raw))
        summary = summarize(graph, raw)
        write_section(out, markdown(raw, summary, command))
        _print(summary)


def _save_calibration(args: argparse.Namespace, cal: dict[str, Any]) -> None:
    """Keep what was measured (``--calibration`` reads it back) next to ``--json``."""
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).with_suffix(".calibration.json").write_text(json.dumps(cal))


def _cluster(k: int) -> Any:
    from graphs.cpu_cluster import cpu_cluster

    return cpu_cluster(k)


def _print(summary: dict[str, Any]) -> None:
    if "spearman" in summary:
        print(
            f"Spearman {summary['spearman']:.3f}  MAPE {summary['mape']:.1f} %  bias "
            f"{summary['bias']:.2f}  memory mean err {summary['mem_mean_err']:.1f} % "
            f"({summary['mem_within']}/{summary['mem_ranks']} within 15 %)  step memory mean err "
            f"{summary['step_mem_mean_err']:.1f} %",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    run(parse_args(argv), argv)


if __name__ == "__main__":
    main()
