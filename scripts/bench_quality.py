"""Learned (PPO-Placeto, PPO-GDP) vs classic placement on one oracle; writes docs/results.md.

Rows: the default experiment (gpt2-xl <= 256 groups on dgx1_v100_8) and the
rnnlm / nmt / inception-v3 rows of Mirhoseini et al. (ICML 2017, Table 1) on
k40_2 and k40_4. For each row:

- the one-call baselines (single, expert, METIS, m-SCT, PipeDream DP);
- **cold** PPO-placeto and PPO-gdp (episodes start from ``--init`` / one-shot),
  and a cold ``anneal`` (from the DP plan) with as many oracle calls as the
  cold PPO run that used most;
- **warm** PPO-placeto and PPO-gdp: search from the row's best baseline plan
  (Placeto-style refinement), each followed by an ``anneal`` started from the
  same plan with exactly the oracle calls that PPO run used (same start, same
  evaluation budget). A warm cell is the best of the start plan and every plan
  the search evaluated. Warm ``Sweep-v0`` runs are a local search with the policy
  as the proposal (``--warm-accept improve``: moves that slow the plan are
  reverted; ``--warm-restart best``: an episode starts from the env's best plan
  so far; ``--warm-keep-prob``: the pair head's keep logit, the initial
  probability of leaving a unit where it is);
- the simulator's lower bound, and each method's search time and oracle calls.

A zero-shot section trains one GDP policy on synthetic graphs plus zoo models
(gpt2-xl and bert-large held out) and plans the two held-out models with it.
Every budget is a CLI option and is written into the output.

    python scripts/bench_quality.py                       # full run (~20 minutes on 2 cores)
    python scripts/bench_quality.py --rows rnnlm@k40_2 --timesteps 256 --warm-timesteps 256 --no-zero-shot
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import graphs  # noqa: E402
import placement_env  # noqa: E402, F401  (registers the env ids)
from agents import baselines, search  # noqa: E402
from agents.export import export_policy, load_policy  # noqa: E402
from agents.ppo import make_ppo  # noqa: E402
from graphs.cluster import Cluster  # noqa: E402
from graphs.compgraph import CompGraph  # noqa: E402
from placement_env.encoding import instance_bounds  # noqa: E402
from placement_env.envs.base import SimulatorFactory  # noqa: E402
from placement_env.generators import Mixture, SyntheticGenerator, ZooGenerator, fixed  # noqa: E402
from placement_env.oracles.simulator import Simulator  # noqa: E402

DEFAULT_ROWS = (
    "gpt2-xl@dgx1_v100_8",
    "rnnlm@k40_2",
    "rnnlm@k40_4",
    "nmt@k40_2",
    "nmt@k40_4",
    "inception-v3@k40_2",
    "inception-v3@k40_4",
)
BASELINES = (
    "single", "expert", "metis", "m_sct", "pipedream_dp", "ideal_dp", "ilp", "ideal_dp_makespan",
)  # fmt: skip
#: the exact planners, each with its own column in the ratio table
EXACT = ("ideal_dp", "ilp", "ideal_dp_makespan")
#: "anneal" has the oracle calls of the cold PPO run that used more; "anneal-wall" its wall time.
COLD = ("ppo-placeto", "ppo-gdp", "anneal", "anneal-wall")
WARM = ("warm-ppo-placeto", "warm-anneal-placeto", "warm-ppo-gdp", "warm-anneal-gdp")
COLUMNS = (*BASELINES, *COLD, *WARM)
HELD_OUT = ("gpt2-xl", "bert-large")
ZERO_SHOT_TRAIN = ("gpt2", "gpt2-medium", "bert-base", "resnet50", "vit-base", "inception-v3")
ENV_IDS = {
    "sweep": "placement_env/Sweep-v0",
    "reassign": "placement_env/Reassign-v0",
    "oneshot": "placement_env/OneShot-v0",
}


@dataclass
class Cell:
    """One method on one row: step time in seconds (None = infeasible)."""

    step_time: float | None
    search_s: float
    calls: int
    note: str = ""
    improved: bool | None = None  # warm cells: beat the start plan
    #: best-so-far points ``(oracle calls, wall seconds, best step time)`` of a search
    #: (anneal's ``meta["curve"]``, PPO's ``SearchResult.curve``), kept in the JSON
    curve: list | None = None


# --------------------------------------------------------------------------- methods
def run_baseline_plan(
    name: str,
    g: CompGraph,
    c: Cluster,
    a: argparse.Namespace,
    budget: int | None = None,
    **options: Any,
) -> tuple[Cell, np.ndarray | None]:
    """Run one baseline on a fresh simulator: its cell and its per-node placement (None = none)."""
    sim = Simulator(g, c, microbatches=a.microbatches, schedule=a.schedule)
    t0 = time.perf_counter()
    if name in EXACT:
        options = {"time_limit": a.ilp_seconds, **options}
    try:
        plan = baselines.get(name)(g, c, sim, budget, **options)
    except baselines.InfeasiblePlanError as exc:
        return Cell(None, time.perf_counter() - t0, sim.calls, str(exc).split(":")[0]), None
    except ValueError as exc:  # an exact model too large for its limits (ilp): refused
        if name != "ilp":
            raise
        return Cell(None, time.perf_counter() - t0, sim.calls, "refused: " + str(exc)[:80]), None
    curve = plan.meta.get("curve")
    cell = Cell(
        float(plan.meta["step_time"]),
        time.perf_counter() - t0,
        sim.calls,
        curve=None if curve is None else [list(map(float, x)) for x in curve],
    )
    return cell, np.asarray(plan.placement, dtype=np.int64)


def run_baseline(
    name: str, g: CompGraph, c: Cluster, a: argparse.Namespace, budget: int | None = None
) -> Cell:
    return run_baseline_plan(name, g, c, a, budget)[0]


def ppo_env(
    policy: str, a: argparse.Namespace, init: np.ndarray | None = None
) -> tuple[str, dict[str, Any]]:
    """Env id and options the policy trains on.

    Cold (``init`` None): Placeto sweeps from ``--init``, GDP places in one shot.
    Warm: both start every episode from ``init`` in ``--warm-*-env`` (sweep or reassign).
    """
    if init is None:
        kind = a.placeto_env if policy == "placeto" else a.gdp_env
    else:
        kind = a.warm_placeto_env if policy == "placeto" else a.warm_gdp_env
    options: dict[str, Any] = {}
    if kind in ("sweep", "reassign"):
        options["init"] = a.init if init is None else init
    elif init is not None:
        raise ValueError(f"a warm start needs a sweep or reassign env, got {kind!r}")
    if init is not None and kind == "sweep":  # Placeto-style local search around the start
        options["accept"], options["restart"] = a.warm_accept, a.warm_restart
    return ENV_IDS[kind], options


def run_ppo(
    policy: str,
    g: CompGraph,
    c: Cluster,
    a: argparse.Namespace,
    timesteps: int,
    init: np.ndarray | None = None,
) -> tuple[Cell, Any]:
    """Train PPO on one row; the cell holds the best feasible plan seen (and, warm, the start)."""
    env_id, options = ppo_env(policy, a, init)
    factory = SimulatorFactory(microbatches=a.microbatches, schedule=a.schedule)
    net_kwargs: dict[str, Any] = {"hidden": a.hidden}
    ppo_kwargs: dict[str, Any] = {}
    if init is not None:  # warm refinement: local exploration around the start plan
        keep = a.warm_keep_prob if policy == "placeto" else a.warm_gdp_keep_prob
        if keep > 0:
            net_kwargs["keep_prob"] = keep
        if a.warm_ent_coef is not None:
            ppo_kwargs["ent_coef"] = a.warm_ent_coef
    found = search.ppo_search(
        env_id,
        graph=g,
        cluster=c,
        oracle_factory=factory,
        timesteps=timesteps,
        policy=policy,
        seed=a.seed,
        start=init,
        ppo_kwargs={
            "env_kwargs": {"generator": fixed(g, c), "oracle_factory": factory, **options},
            "n_envs": a.n_envs,
            "n_steps": a.n_steps,
            "batch_size": a.batch_size,
            "net_kwargs": net_kwargs,
            **ppo_kwargs,
        },
        microbatches=a.microbatches,
        schedule=a.schedule,
    )
    best = found.step_time if found.best_from == "search" else None
    note = "" if best is not None else "no feasible placement sampled"
    if init is None:
        return Cell(
            best, found.seconds, found.oracle_calls, note, curve=ppo_curve(found)
        ), found.model
    start_t = found.start_step_time
    cell = Cell(
        found.step_time,
        found.seconds,
        found.oracle_calls,
        note or "",
        improved=found.best_from == "search" and (start_t is None or best < start_t),
        curve=ppo_curve(found),
    )
    return cell, found.model


def ppo_curve(found: Any) -> list[list[float]]:
    """PPO's best-so-far points as ``(oracle calls, wall seconds, best step time)``."""
    return [[float(n), float(t), float(v)] for _, n, t, v in getattr(found, "curve", [])]


def warm_anneal(
    g: CompGraph, c: Cluster, a: argparse.Namespace, init: np.ndarray, calls: int
) -> Cell:
    """``anneal`` from ``init`` with exactly ``calls`` oracle evaluations (at least 1)."""
    cell, _ = run_baseline_plan("anneal", g, c, a, max(calls, 1), init=init, seed=a.seed)
    start = Simulator(g, c, microbatches=a.microbatches, schedule=a.schedule).evaluate(init)
    if cell.step_time is not None and not start.oom:
        cell.improved = bool(cell.step_time < float(start.step_time))
    return cell


def zero_shot(a: argparse.Namespace, per_model: dict[str, Cell]) -> list[dict[str, Any]]:
    """Train GDP on synthetic + zoo graphs (held-out models excluded), plan the held-out ones."""
    clusters = [graphs.clusters.load(n) for n in a.zs_clusters]
    zoo = ZooGenerator(a.zs_models, clusters, max_groups=a.max_groups)
    zb = zoo.bounds()
    synth = SyntheticGenerator(
        clusters,
        max_nodes=max(zb.max_nodes, a.zs_synthetic_ops),
        max_edges=max(zb.max_edges, 16 * a.zs_synthetic_ops),
        sampler=functools.partial(graphs.synthetic.sample, max_nodes=a.zs_synthetic_ops),
    )
    gen = Mixture([synth, zoo], [a.zs_synthetic_weight, 1.0])
    target = graphs.clusters.load(a.zs_target)
    held = {m: graphs.zoo.build(m, max_groups=a.max_groups) for m in HELD_OUT}
    b = [instance_bounds(h, target) for h in held.values()] + [gen.bounds()]
    bounds = {
        "max_nodes": max(x.max_nodes for x in b),
        "max_edges": max(x.max_edges for x in b),
        "max_devices": max(x.max_devices for x in b),
    }
    factory = SimulatorFactory(microbatches=a.microbatches, schedule=a.schedule)
    t0 = time.perf_counter()
    model = make_ppo(
        ENV_IDS[a.gdp_env],
        "gdp",
        env_kwargs={"generator": gen, "oracle_factory": factory, **bounds},
        n_envs=a.n_envs,
        n_steps=a.n_steps,
        batch_size=a.batch_size,
        net_kwargs={"hidden": a.hidden},
        seed=a.seed,
    )
    model.learn(a.zs_timesteps)
    train_s = time.perf_counter() - t0
    path = export_policy(
        model, a.zs_policy, meta={"train_models": list(a.zs_models), "held_out": list(HELD_OUT)}
    )
    policy = load_policy(path)
    out = []
    for m, g in held.items():
        t0 = time.perf_counter()
        try:
            plan = policy.plan(
                g,
                target,
                microbatches=a.microbatches,
                schedule=a.schedule,
                samples=a.zs_samples,
                seed=a.seed,
            )
            st, calls, note = float(plan.meta["step_time"]), int(plan.meta["oracle_calls"]), ""
        except baselines.InfeasiblePlanError:
            st, calls, note = None, a.zs_samples, "all sampled placements run out of memory"
        ref = per_model.get(m)
        out.append(
            {
                "model": m,
                "cluster": a.zs_target,
                "step_time": st,
                "plan_s": time.perf_counter() - t0,
                "oracle_calls": calls,
                "train_s": train_s,
                "reference": None if ref is None else asdict(ref),
                "note": note,
            }
        )
        print(f"zero-shot {m}: {out[-1]}", flush=True)
    return out


# --------------------------------------------------------------------------- table
def _ms(t: float | None) -> str:
    return "infeasible" if t is None else f"{t * 1e3:.1f}"


def _cell(c: Cell) -> str:
    """A step-time cell; warm cells that kept their start plan are marked ``=``."""
    return _ms(c.step_time) + (" =" if c.improved is False else "")


def _ratio(x: Cell, y: Cell | None) -> str:
    if y is None or not x.step_time or not y.step_time:
        return "—"
    return f"{x.step_time / y.step_time:.3f}"


def best_baseline(cells: dict[str, Cell]) -> tuple[str, Cell] | None:
    """The fastest one-call baseline of a row as ``(name, cell)``."""
    ok = [(k, cells[k]) for k in BASELINES if k in cells and cells[k].step_time]
    return min(ok, key=lambda kv: kv[1].step_time) if ok else None  # type: ignore[arg-type,return-value]


def _table(
    rows: list[dict[str, Any]], columns: Sequence[str], fmt: Callable[[Cell], str]
) -> list[str]:
    """A markdown table: one line per row, ``fmt`` of each column's cell."""
    out = [
        "| model @ cluster | " + " | ".join(columns) + " |",
        "| --- | " + " | ".join("---:" for _ in columns) + " |",
    ]
    for r in rows:
        cells = " | ".join(fmt(r["cells"][k]) for k in columns)
        out.append(f"| {r['model']} @ {r['cluster']} | {cells} |")
    return out


def render(rows: list[dict[str, Any]], zs: list[dict[str, Any]], a: argparse.Namespace) -> str:
    summary = [
        "| model @ cluster | lower bound | best baseline | cold PPO-placeto | cold PPO-gdp "
        "| cold anneal (= PPO calls) | cold anneal (= PPO wall) | warm PPO-placeto | warm anneal (= its calls) | warm PPO-gdp "
        "| warm anneal (= its calls) | best PPO / best baseline "
        "| warm PPO-placeto / its anneal | warm PPO-gdp / its anneal |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in rows:
        cells = r["cells"]
        bb = best_baseline(cells)
        ppo = [cells[k] for k in ("ppo-placeto", "ppo-gdp", "warm-ppo-placeto", "warm-ppo-gdp")]
        bp = best_of({str(i): c for i, c in enumerate(ppo)})
        bb_s = "—" if bb is None else f"{_ms(bb[1].step_time)} ({bb[0]})"
        summary.append(
            f"| {r['model']} @ {r['cluster']} | {r['lower_bound'] * 1e3:.1f} | {bb_s} | "
            + " | ".join(_cell(cells[k]) for k in (*COLD, *WARM))
            + f" | {_ratio(bp, None if bb is None else bb[1]) if bp else '—'}"
            + f" | {_ratio(cells['warm-ppo-placeto'], cells['warm-anneal-placeto'])}"
            + f" | {_ratio(cells['warm-ppo-gdp'], cells['warm-anneal-gdp'])} |"
        )
    ratio_cols = ("best baseline", *EXACT, *COLD, *WARM)
    ratio = [
        "| model @ cluster | best known (ms) | " + " | ".join(ratio_cols) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in ratio_cols) + " |",
    ]
    for r in rows:
        cells = r["cells"]
        ref = best_of(cells)
        bb = best_baseline(cells)
        got = [None if bb is None else bb[1]] + [cells.get(k) for k in ratio_cols[1:]]
        ratio.append(
            f"| {r['model']} @ {r['cluster']} | {_ms(None if ref is None else ref.step_time)} | "
            + " | ".join(
                "—"
                if x is None or ref is None or not x.step_time
                else f"{x.step_time / ref.step_time:.3f}"
                for x in got
            )
            + " |"
        )
    full = _table(rows, BASELINES, lambda c: _ms(c.step_time))
    cost = _table(rows, COLUMNS, lambda c: f"{c.search_s:.1f} s / {c.calls}")
    out = [
        "Step time per training step in ms (simulator, "
        f"{a.microbatches} microbatches, {a.schedule.upper()}); lower is better. "
        f"Cold PPO (placeto / gdp): {a.timesteps} / {a.gdp_timesteps} env steps "
        f"({a.placeto_env} from `{a.init}` / {a.gdp_env}); warm PPO: {a.warm_timesteps} / "
        f"{a.warm_gdp_timesteps} env steps from the best baseline plan "
        f"({a.warm_placeto_env} / {a.warm_gdp_env}; {warm_search(a)}). A warm cell is the best "
        "of the "
        "start plan and every plan evaluated; `=` marks a warm search that found nothing faster "
        "than its start. Each warm anneal starts from the same plan with exactly the oracle calls "
        "of the PPO run on its left. `infeasible` = no memory-feasible plan.",
        "",
        *summary,
        "",
        "Each method / the best plan any method found for the row (1.000 = the best known). "
        "Cold `anneal` has the oracle calls of the cold PPO run that used more, `anneal-wall` "
        "its wall time (`time_limit`, unbounded calls); each warm anneal has the calls of the "
        "warm PPO run before it:",
        "",
        *ratio,
        "",
        "One-call baselines (ms):",
        "",
        *full,
        "",
        "Search cost: wall time / oracle calls.",
        "",
        *cost,
    ]
    if zs:
        out += [
            "",
            f"Zero-shot GDP ({a.gdp_env} env), trained on {', '.join(a.zs_models)} and synthetic "
            f"graphs on {', '.join(a.zs_clusters)} for {a.zs_timesteps} steps; "
            f"planning {', '.join(HELD_OUT)} on {a.zs_target} with {a.zs_samples} sample(s).",
            "",
            "| held-out model | zero-shot step time (ms) | plan time (s) | oracle calls | "
            "per-model search (ms) | gap |",
            "| --- | ---: | ---: | ---: | --- | ---: |",
        ]
        for z in zs:
            ref = z["reference"]
            gap = "—"
            ref_s = "—"
            if ref is not None and ref["step_time"]:
                ref_s = f"{ref['step_time'] * 1e3:.1f} ({ref['note'] or 'best of row'})"
                if z["step_time"]:
                    gap = f"{(z['step_time'] / ref['step_time'] - 1) * 100:+.1f}%"
            out.append(
                f"| {z['model']} | {_ms(z['step_time'])} | {z['plan_s']:.2f} | "
                f"{z['oracle_calls']} | {ref_s} | {gap} |"
            )
    return "\n".join(out) + "\n"


def warm_search(a: argparse.Namespace) -> str:
    """How the warm PPO runs search, in words (for the table caption)."""
    parts = [
        f"Sweep-v0 accept={getattr(a, 'warm_accept', 'all')}, "
        f"restart={getattr(a, 'warm_restart', 'init')}"
    ]
    for name, key in (("placeto", "warm_keep_prob"), ("gdp", "warm_gdp_keep_prob")):
        keep = getattr(a, key, 0.0) or 0.0
        parts.append(f"{name} keep_prob={keep:g}" if keep > 0 else f"{name} no keep logit")
    if getattr(a, "warm_ent_coef", None) is not None:
        parts.append(f"ent_coef={a.warm_ent_coef:g}")
    return ", ".join(parts)


def best_of(cells: dict[str, Cell]) -> Cell | None:
    ok = [(k, v) for k, v in cells.items() if v.step_time]
    if not ok:
        return None
    k, v = min(ok, key=lambda kv: kv[1].step_time)  # type: ignore[arg-type,return-value]
    return Cell(v.step_time, v.search_s, v.calls, k)


# --------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", default=list(DEFAULT_ROWS), help="MODEL@CLUSTER ...")
    ap.add_argument("--max-groups", type=int, default=256)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--timesteps", type=int, default=512, help="cold PPO-placeto env steps")
    ap.add_argument(
        "--gdp-timesteps",
        type=int,
        default=256,
        help="cold PPO-gdp env steps (its Transformer costs ~5x a Placeto step here)",
    )
    ap.add_argument(
        "--warm-timesteps", type=int, default=2048, help="warm PPO-placeto env steps (0 = skip)"
    )
    ap.add_argument(
        "--warm-gdp-timesteps",
        type=int,
        default=512,
        help="warm PPO-gdp env steps (0 = skip)",
    )
    ap.add_argument(
        "--ilp-seconds",
        type=float,
        default=20.0,
        help="time limit of ideal_dp, ilp and ideal_dp_makespan",
    )
    ap.add_argument("--n-envs", type=int, default=2)
    ap.add_argument("--n-steps", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--placeto-env", choices=sorted(ENV_IDS), default="sweep")
    ap.add_argument("--gdp-env", choices=sorted(ENV_IDS), default="oneshot")
    ap.add_argument("--init", default="balanced", help="initial placement of cold sweep/reassign")
    ap.add_argument("--warm-placeto-env", choices=("sweep", "reassign"), default="sweep")
    ap.add_argument("--warm-gdp-env", choices=("sweep", "reassign"), default="reassign")
    ap.add_argument(
        "--warm-keep-prob",
        type=float,
        default=0.5,
        help="warm PPO-placeto: initial probability of keeping a unit's device (0 = no keep logit)",
    )
    ap.add_argument(
        "--warm-gdp-keep-prob",
        type=float,
        default=0.0,
        help="warm PPO-gdp: initial probability of a no-op move (0 = no keep logit)",
    )
    ap.add_argument(
        "--warm-accept",
        choices=("all", "improve"),
        default="improve",
        help="warm Sweep-v0 runs: revert moves that make the plan slower (improve) or not (all)",
    )
    ap.add_argument(
        "--warm-restart",
        choices=("init", "best"),
        default="best",
        help="warm Sweep-v0 runs: episodes start from the start plan (init) or the env's best",
    )
    ap.add_argument(
        "--warm-ent-coef", type=float, default=None, help="warm PPO entropy coefficient"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    ap.add_argument("--no-zero-shot", dest="zero_shot", action="store_false")
    ap.add_argument("--zs-models", nargs="+", default=list(ZERO_SHOT_TRAIN))
    ap.add_argument("--zs-clusters", nargs="+", default=["dgx1_v100_8", "k40_4"])
    ap.add_argument("--zs-target", default="dgx1_v100_8")
    ap.add_argument("--zs-synthetic-weight", type=float, default=1.0)
    ap.add_argument("--zs-synthetic-ops", type=int, default=128, help="max forward ops")
    ap.add_argument("--zs-timesteps", type=int, default=1024)
    ap.add_argument("--zs-samples", type=int, default=4)
    ap.add_argument("--zs-policy", default="outputs/bench_quality/gdp_zero_shot.pt")
    ap.add_argument("--out", default="docs/results_table.md")
    ap.add_argument("--json", default="outputs/bench_quality/results.json")
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="run nothing: render --out from the rows and zero-shot results of these JSON files "
        "(e.g. parts of the rows run in parallel with the same budgets)",
    )
    return ap.parse_args(argv)


#: Arguments that must agree between JSON files merged into one table.
BUDGET_ARGS = (
    "max_groups",
    "microbatches",
    "schedule",
    "timesteps",
    "gdp_timesteps",
    "warm_timesteps",
    "warm_gdp_timesteps",
    "n_envs",
    "n_steps",
    "batch_size",
    "hidden",
    "placeto_env",
    "gdp_env",
    "warm_placeto_env",
    "warm_gdp_env",
    "init",
    "warm_keep_prob",
    "warm_gdp_keep_prob",
    "warm_ent_coef",
    "warm_accept",
    "warm_restart",
    "seed",
)


def merge(paths: Sequence[str], out: str) -> str:
    """Render one table from several result JSON files with the same budgets; write ``out``."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]["args"]
    for p, d in zip(paths, parts):
        diff = [k for k in BUDGET_ARGS if d["args"].get(k) != first.get(k)]
        if diff:
            raise SystemExit(f"--merge: {p} was run with other {diff} than {paths[0]}")
    a = argparse.Namespace(**{**first, "out": out})
    rows = [
        {**r, "cells": {k: Cell(**v) for k, v in r["cells"].items()}}
        for d in parts
        for r in d["rows"]
    ]
    zs = [z for d in parts for z in d["zero_shot"]]
    zs_args = next((d["args"] for d in parts if d["zero_shot"]), None)
    if zs_args is not None:  # the zero-shot caption describes the run that did it
        for k in [k for k in zs_args if k.startswith("zs_")]:
            setattr(a, k, zs_args[k])
    runs = "; ".join(
        f"{Path(p).name}: wall {d['run']['wall_s']:.0f} s, CPU {d['run']['cpu_s']:.0f} s, load "
        f"{d['run']['loadavg_start'][0]:.2f} -> {d['run']['loadavg_end'][0]:.2f}"
        for p, d in zip(paths, parts)
    )
    table = f"<!-- merged {' '.join(paths)} | {runs} -->\n" + render(rows, zs, a)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(table)
    return table


def main(argv: Sequence[str] | None = None) -> None:
    a = parse(argv)
    if a.merge:
        print(merge(a.merge, a.out))
        return
    torch.set_num_threads(a.threads)
    wall0, cpu0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()
    rows: list[dict[str, Any]] = []
    per_model: dict[str, Cell] = {}
    for spec in a.rows:
        model_name, _, cluster_name = spec.partition("@")
        if not cluster_name:
            raise SystemExit(f"--rows entries are MODEL@CLUSTER, got {spec!r}")
        g = graphs.zoo.build(model_name, max_groups=a.max_groups)
        c = graphs.clusters.load(cluster_name)
        lb = Simulator(g, c, microbatches=a.microbatches, schedule=a.schedule).lower_bound()
        cells: dict[str, Cell] = {}
        plans: dict[str, np.ndarray] = {}
        for n in BASELINES:
            cells[n], p = run_baseline_plan(n, g, c, a)
            if p is not None:
                plans[n] = p
        cells["ppo-placeto"], _ = run_ppo("placeto", g, c, a, a.timesteps)
        cells["ppo-gdp"], _ = run_ppo("gdp", g, c, a, a.gdp_timesteps)
        budget = max(cells["ppo-placeto"].calls, cells["ppo-gdp"].calls, 1)
        cells["anneal"], _ = run_baseline_plan("anneal", g, c, a, budget, seed=a.seed)
        wall = max(cells["ppo-placeto"].search_s, cells["ppo-gdp"].search_s, 1e-3)
        cells["anneal-wall"], _ = run_baseline_plan(
            "anneal", g, c, a, 10**9, time_limit=wall, seed=a.seed
        )
        bb = best_baseline(cells)
        for pol, steps in (("placeto", a.warm_timesteps), ("gdp", a.warm_gdp_timesteps)):
            if bb is None or steps <= 0:
                why = "skipped" if steps <= 0 else "no baseline plan to start from"
                cells[f"warm-ppo-{pol}"] = Cell(None, 0.0, 0, why)
                cells[f"warm-anneal-{pol}"] = Cell(None, 0.0, 0, why)
                continue
            init = plans[bb[0]]
            cells[f"warm-ppo-{pol}"], _ = run_ppo(pol, g, c, a, steps, init=init)
            cells[f"warm-anneal-{pol}"] = warm_anneal(g, c, a, init, cells[f"warm-ppo-{pol}"].calls)
        rows.append(
            {
                "model": model_name,
                "cluster": cluster_name,
                "lower_bound": lb,
                "warm_start": None if bb is None else bb[0],
                "cells": cells,
            }
        )
        if cluster_name == a.zs_target:
            ref = best_of(cells)
            if ref is not None:
                per_model[model_name] = ref
        print(
            f"{spec}: " + ", ".join(f"{k}={_ms(v.step_time)}" for k, v in cells.items()), flush=True
        )
        write_outputs(rows, [], a, argv, wall0, cpu0, load0)
    zs: list[dict[str, Any]] = []
    if a.zero_shot:
        for m in HELD_OUT:
            if m not in per_model:  # per-model search: one-call baselines + warm PPO-placeto
                g = graphs.zoo.build(m, max_groups=a.max_groups)
                c = graphs.clusters.load(a.zs_target)
                cells, plans = {}, {}
                for n in BASELINES:
                    cells[n], p = run_baseline_plan(n, g, c, a)
                    if p is not None:
                        plans[n] = p
                bb = best_baseline(cells)
                if bb is not None and a.warm_timesteps > 0:
                    cells["warm-ppo-placeto"], _ = run_ppo(
                        "placeto", g, c, a, a.warm_timesteps, init=plans[bb[0]]
                    )
                ref = best_of(cells)
                if ref is not None:
                    per_model[m] = ref
        zs = zero_shot(a, per_model)
    print(write_outputs(rows, zs, a, argv, wall0, cpu0, load0))


def write_outputs(
    rows: list[dict[str, Any]],
    zs: list[dict[str, Any]],
    a: argparse.Namespace,
    argv: Sequence[str] | None,
    wall0: float,
    cpu0: float,
    load0: tuple[float, float, float],
) -> str:
    """Write the markdown table and the JSON so far (called after every row); return the table."""
    table = render(rows, zs, a)
    args_used = " ".join(sys.argv[1:] if argv is None else argv)
    run = {
        "wall_s": time.perf_counter() - wall0,
        "cpu_s": time.process_time() - cpu0,
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    header = (
        f"<!-- python scripts/bench_quality.py {args_used} | "
        f"{platform.node()} | {time.strftime('%Y-%m-%d %H:%M')} | "
        f"wall {run['wall_s']:.0f} s, CPU {run['cpu_s']:.0f} s, {run['cpus']} CPUs, "
        f"load average {run['loadavg_start'][0]:.2f} -> {run['loadavg_end'][0]:.2f} -->\n"
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(header + table)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(
        json.dumps(
            {
                "args": vars(a),
                "run": run,
                "rows": [
                    {**r, "cells": {k: asdict(v) for k, v in r["cells"].items()}} for r in rows
                ],
                "zero_shot": zs,
            },
            indent=1,
        )
    )
    return table


if __name__ == "__main__":
    main()
