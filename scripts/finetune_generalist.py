"""Fine-tuning from the generalist vs annealing from its plan vs PPO from scratch (held-out rows).

    python scripts/finetune_generalist.py --rows 2 5 8 --ppo-steps 512 --ppo-seconds 240 \
        --anneal-calls 2000 --json runs/finetune/finetune.json --out runs/finetune/finetune.md

For each held-out row of ``agents.generalist.CORPUS`` (model x held-out cluster, 8
microbatches, 1F1B): the target is **within 1 % of per-model search's best**
(``--reference each``, the default: the one-call baselines, exact planners included, then
``--search-anneal-calls`` annealing from each of their plans; ``best``: from the best
heuristic's plan only, the figures before 27 Nov 2026; as in ``scripts/eval_generalist.py``,
read from its ``--search-cache`` when there). Then, each
counting oracle calls and wall time until its best plan is at or under the target:

- ``zero-shot``: ``load_policy("generalist").plan(..., samples=K)`` alone;
- ``anneal from zero-shot``: that plan, then ``anneal(init=plan)`` for ``--anneal-calls``
  calls (its calls and time include the zero-shot plan's);
- ``anneal``: ``anneal`` alone from its own start (the pipeline DP's plan), the same
  ``--anneal-calls`` budget;
- ``chain fine-tuning``: :func:`agents.finetune.chain_finetune` from the generalist (its
  round 0 is the zero-shot plan, so its calls and time include it, as for ``anneal from
  zero-shot``), stopping at the target or when its budget is spent: ``--ft-budget same``
  (the default since 2 Dec 2026) gives it the zero-shot plan's calls plus
  ``--anneal-calls``, the same total as ``anneal from zero-shot``; ``--ft-budget
  inclusive`` (the protocol until then) gives it ``--anneal-calls`` in all, round 0
  included, about a thousand calls fewer than annealing from the same plan;
- ``PPO from generalist``: ``python -m runners.train`` on the row (``OneShot-v0``,
  ``agent.init_policy=generalist``, no warm start, no baselines), ``--ppo-steps`` episodes
  (one oracle call each) or ``--ppo-seconds``; read from ``result.json``'s ``meta.curve``;
- ``PPO from scratch``: the same run with a freshly initialised GDP network of the
  generalist's sizes.

A method that does not reach the target within its budget is reported with its best ratio.
The wall time of a PPO run counts from the start of its training (the run's setup, graph
loading and the zero-shot plan of the initial policy excluded). ``--methods`` picks the
columns (the two PPO runs take most of the time).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from agents import generalist as G
from scripts.eval_generalist import add_reference_argument

#: The table's columns, in order: key -> header.
METHODS = {
    "zero_shot": "zero-shot",
    "anneal_from_zero_shot": "anneal from zero-shot",
    "anneal": "anneal (DP start)",
    "chain": "chain fine-tuning from generalist",
    "ppo_generalist": "PPO from generalist",
    "ppo_scratch": "PPO from scratch",
}


class RecordingOracle:
    """An oracle proxy that records every evaluation: ``(seconds since start, step time | inf)``."""

    def __init__(self, oracle: Any) -> None:
        self._oracle = oracle
        self.t0 = time.perf_counter()
        self.log: list[tuple[float, float]] = []

    def evaluate(self, placement: Any) -> Any:
        res = self._oracle.evaluate(placement)
        ok = not bool(res.oom) and math.isfinite(float(res.step_time))
        self.log.append((time.perf_counter() - self.t0, float(res.step_time) if ok else math.inf))
        return res

    def summary(self, target: float) -> dict[str, Any]:
        """Best step time (ms), calls and seconds so far, and when ``target`` was first hit."""
        c, s = first_hit(self.log, target)
        return {
            "ms": 1e3 * min(t for _, t in self.log), "calls": len(self.log),
            "seconds": self.log[-1][0], "hit_calls": c, "hit_seconds": s,
        }  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        return getattr(self._oracle, name)


def first_hit(log: list[tuple[float, float]], target: float) -> tuple[int | None, float | None]:
    """``(calls, seconds)`` at the first evaluation at or under ``target`` (``None`` if none)."""
    for i, (sec, t) in enumerate(log):
        if t <= target:
            return i + 1, sec
    return None, None


def ppo_run(
    pb: G.Problem,
    work: Path,
    *,
    init: bool,
    steps: int,
    seconds: float,
    seed: int,
    n_steps: int,
) -> dict[str, Any]:
    """``python -m runners.train`` on this row; returns result.json's dict (plus wall time)."""
    from graphs import io as gio

    work.mkdir(parents=True, exist_ok=True)
    gio.save(pb.graph, work / "graph.json")
    gio.save_cluster(pb.cluster, work / "cluster.json")
    net = G.NET_CONFIG
    out = work / ("ppo_generalist" if init else "ppo_scratch")
    cmd = [
        sys.executable, "-m", "runners.train", "+env=bert_8gpu", "env.name=heldout_row",
        "env.model=null", f"env.graph_file={work / 'graph.json'}", "env.max_groups=null",
        f"env.cluster={work / 'cluster.json'}", "env.env_id=placement_env/OneShot-v0",
        "env.policy=gdp", "env.baselines=[]", "run_baselines=false",
        f"env.microbatches={pb.microbatches}", f"env.schedule={pb.schedule}",
        "agent=ppo", "agent.warm_start=false", "logger=none", f"seed={seed}",
        f"train.timesteps={steps}", f"train.seconds={seconds}", "train.progress=false",
        "train.checkpoint_every=0", f"agent.ppo.n_steps={n_steps}",
        f"agent.ppo.batch_size={n_steps}", f"output_dir={out}",
    ]  # fmt: skip
    if init:
        cmd.append("agent.init_policy=generalist")
    else:
        cmd += ["agent.policy=gdp"] + [
            f"+agent.ppo.extra.net_kwargs.{k}={v}" for k, v in net.items()
        ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"runners.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    res["process_seconds"] = wall
    res["command"] = " ".join(cmd[1:])
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 5, 8], help="row indices")
    ap.add_argument(
        "--split", choices=("heldout", "validation"), default="heldout",
        help="held-out pairs, or the validation draw of scripts/validate_generalist.py "
        "(corpus seed 1, every k-th training-like problem: for choosing options)",
    )  # fmt: skip
    ap.add_argument("--val-rows", type=int, default=24, help="size of the validation list")
    ap.add_argument("--ft-samples", type=int, default=64, help="chain fine-tuning: per round")
    ap.add_argument("--ft-elite", type=int, default=4)
    ap.add_argument("--ft-updates", type=int, default=8)
    ap.add_argument("--ft-lr", type=float, default=1e-3)
    ap.add_argument(
        "--ft-local", type=float, default=1.0,
        help="chain fine-tuning: share of each round's samples drawn as window redraws",
    )  # fmt: skip
    ap.add_argument("--ft-window", type=int, default=None, help="longest window (units)")
    ap.add_argument("--ft-temperature", type=float, default=6.0)
    ap.add_argument(
        "--ft-sequential", action="store_true",
        help="chain fine-tuning: score each local redraw before drawing the next",
    )  # fmt: skip
    ap.add_argument(
        "--ft-focus", type=float, default=0.0,
        help="chain fine-tuning: share of window redraws on the bottleneck device's edges",
    )  # fmt: skip
    ap.add_argument(
        "--ft-screen", type=int, default=1,
        help="chain fine-tuning: each annealing move is the best of this many by the network",
    )  # fmt: skip
    ap.add_argument(
        "--ft-moves", type=float, default=0.0,
        help="chain fine-tuning: share of local draws that are annealing moves of elite plans",
    )  # fmt: skip
    ap.add_argument(
        "--samples", type=int, default=None,
        help="zero-shot placements scored (default: the policy's, as runners.plan)",
    )  # fmt: skip
    ap.add_argument("--anneal-calls", type=int, default=2000)
    ap.add_argument("--search-anneal-calls", type=int, default=2000)
    ap.add_argument(
        "--ft-budget", default="same", choices=["same", "inclusive"],
        help="chain fine-tuning's oracle calls: 'same' total as annealing from the zero-shot "
        "plan (its calls + --anneal-calls), or --anneal-calls in all ('inclusive', until 2 Dec 2026)",
    )  # fmt: skip
    ap.add_argument("--ppo-steps", type=int, default=512)
    ap.add_argument("--ppo-seconds", type=float, default=240.0)
    ap.add_argument("--n-steps", type=int, default=64, help="PPO rollout length (= batch size)")
    ap.add_argument("--tolerance", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("runs/finetune"))
    ap.add_argument("--search-cache", type=Path, default=Path("runs/generalist/search.json"))
    add_reference_argument(ap)
    ap.add_argument(
        "--methods", nargs="+", default=list(METHODS), choices=list(METHODS),
        help="columns to measure (zero_shot always runs: the others start from it)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=Path("runs/finetune/finetune.json"))
    ap.add_argument("--out", type=Path, default=Path("runs/finetune/finetune.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import agents
    from agents import baselines
    from agents.finetune import chain_finetune
    from placement_env.encoding import unit_graph
    from scripts.eval_generalist import (
        check_cache_keys,
        default_baselines,
        per_model_search,
        search_key,
    )

    policy = agents.load_policy("generalist")
    if args.samples is None:
        args.samples = policy.default_samples()
    if args.split == "heldout":
        heldout = G.corpus_instances(G.CORPUS, split="heldout")
    else:
        heldout = G.validation_instances(args.val_rows)
    cache = json.loads(args.search_cache.read_text()) if args.search_cache.exists() else {}
    rows: list[dict[str, Any]] = []
    keys = [search_key(heldout[i], args.search_anneal_calls, args.reference) for i in args.rows]
    check_cache_keys([heldout[i] for i in args.rows], keys)
    for idx, key in zip(args.rows, keys, strict=True):
        pb = heldout[idx]
        if key not in cache:
            cache[key] = per_model_search(
                pb, default_baselines(args.reference), args.search_anneal_calls,
                reference=args.reference,
            )  # fmt: skip
            args.search_cache.parent.mkdir(parents=True, exist_ok=True)
            args.search_cache.write_text(json.dumps(cache, indent=1))
        search_s = cache[key]["search_ms"] / 1e3
        target = search_s * (1 + args.tolerance)
        r: dict[str, Any] = {
            "row": idx, "name": pb.name, "units": unit_graph(pb.graph).num_units,
            "devices": pb.cluster.num_devices, "search_ms": 1e3 * search_s,
            "target_ms": 1e3 * target, "search_from": cache[key]["search_from"],
        }  # fmt: skip
        # zero-shot, then annealing from its plan (one recording oracle: calls add up)
        rec = RecordingOracle(pb.oracle())
        plan = policy.plan(
            pb.graph, pb.cluster, microbatches=pb.microbatches, schedule=pb.schedule,
            samples=args.samples, oracle=rec, seed=args.seed,
        )  # fmt: skip
        zs_calls, zs_sec = len(rec.log), rec.log[-1][0]
        c, s = first_hit(rec.log, target)
        r["zero_shot"] = {
            "ms": 1e3 * plan.meta["step_time"], "calls": zs_calls, "seconds": zs_sec,
            "hit_calls": c, "hit_seconds": s,
        }  # fmt: skip
        if "anneal_from_zero_shot" in args.methods:
            baselines.get("anneal")(
                pb.graph, pb.cluster, rec, args.anneal_calls, init=plan.placement, seed=args.seed
            )
            r["anneal_from_zero_shot"] = rec.summary(target)
        if "anneal" in args.methods:
            # annealing alone, from its own start (the pipeline DP's plan), same call budget
            rec = RecordingOracle(pb.oracle())
            baselines.get("anneal")(pb.graph, pb.cluster, rec, args.anneal_calls, seed=args.seed)
            r["anneal"] = rec.summary(target)
        if "chain" in args.methods:
            rec = RecordingOracle(pb.oracle())
            ft_calls = args.anneal_calls + (zs_calls if args.ft_budget == "same" else 0)
            ft = chain_finetune(
                policy, pb.graph, pb.cluster, oracle=rec, first_samples=args.samples,
                calls=ft_calls, target=target, seed=args.seed,
                samples=args.ft_samples, elite=args.ft_elite, updates=args.ft_updates,
                lr=args.ft_lr, local=args.ft_local, window=args.ft_window,
                temperature=args.ft_temperature, sequential=args.ft_sequential,
                moves=args.ft_moves, focus=args.ft_focus, screen=args.ft_screen,
            )  # fmt: skip
            r["chain"] = {
                **rec.summary(target), "rounds": ft.rounds, "stop": ft.stop, "budget": ft_calls,
                "zero_shot_calls": ft.zero_shot_calls,
            }  # fmt: skip
        print(pb.name, {m: r[m] for m in METHODS if m in r}, flush=True)
        for init in [i for i, m in ((True, "ppo_generalist"), (False, "ppo_scratch"))
                     if m in args.methods]:  # fmt: skip
            res = ppo_run(
                pb, args.work / f"row{idx}", init=init, steps=args.ppo_steps,
                seconds=args.ppo_seconds, seed=args.seed, n_steps=args.n_steps,
            )  # fmt: skip
            hit = next((p for p in res["meta"]["curve"] if p[3] <= target), None)
            best = res["best_step_time"]
            r["ppo_generalist" if init else "ppo_scratch"] = {
                "ms": None if best is None else 1e3 * best,
                "calls": res["oracle_calls"], "timesteps": res["timesteps"],
                "seconds": res["wall_seconds"], "process_seconds": res["process_seconds"],
                "hit_calls": None if hit is None else hit[1],
                "hit_seconds": None if hit is None else hit[2],
                "command": res["command"],
            }  # fmt: skip
            print(
                pb.name,
                "init" if init else "scratch",
                r["ppo_generalist" if init else "ppo_scratch"],
                flush=True,
            )
        rows.append(r)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table(rows, args))
    print(table(rows, args))


def _cell(m: dict[str, Any], search_ms: float) -> str:
    if m["hit_calls"] is not None:
        return f"{m['hit_calls']} calls, {m['hit_seconds']:.1f} s"
    ratio = "-" if m["ms"] is None else f"{m['ms'] / search_ms:.3f}"
    return f"not reached ({m['calls']} calls, {m['seconds']:.0f} s; best {ratio})"


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    cols = [m for m in METHODS if any(m in r for r in rows)]
    lines = [
        f"target: within {100 * args.tolerance:g} % of per-model search; zero-shot {args.samples} "
        f"samples; anneal {args.anneal_calls} calls, chain fine-tuning "
        + ("the same total" if args.ft_budget == "same" else f"{args.anneal_calls} in all")
        + " (fine-tuning: "
        f"{args.ft_samples} samples a round, elite {args.ft_elite}, {args.ft_updates} updates, "
        f"lr {args.ft_lr:g}, local {args.ft_local:g}, window "
        f"{args.ft_window or 'units/8'}, temperature {args.ft_temperature:g}"
        f"{', sequential' if args.ft_sequential else ''}); PPO "
        f"{args.ppo_steps} episodes or {args.ppo_seconds:g} s, n_steps {args.n_steps}",
        "",
        "| row | per-model search (ms) | " + " | ".join(METHODS[m] for m in cols) + " |",
        "| --- | ---: |" + " --- |" * len(cols),
    ]
    for r in rows:
        s = r["search_ms"]
        cells = [_cell(r[m], s) if m in r else "" for m in cols]
        lines.append(f"| {r['name']} | {s:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
