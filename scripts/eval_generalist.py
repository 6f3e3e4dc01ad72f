"""Zero-shot quality of the generalist against per-model search, for docs/generalisation.md.

    python scripts/eval_generalist.py --policy generalist --samples 8 --anneal-calls 2000 \
        --train-rows 12 --json runs/generalist/eval.json --out runs/generalist/eval.md

Rows: every held-out model x held-out cluster pair of ``agents.generalist.CORPUS``, and the
first ``--train-rows`` training problems (one per graph source first). For each row:

- zero-shot: ``load_policy(POLICY).plan(graph, cluster, samples=K, oracle=simulator, seed=0)``
  (the network's own plans: greedy + K-1 samples, best feasible by the oracle); its wall time;
- per-model search: the best of every one-call baseline, then annealing from it for
  ``--anneal-calls`` oracle calls (the reference the issue asks for);
- ratio = zero-shot step time / per-model search step time.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import generalist as G

#: One-call baselines of per-model search (``random`` and ``anneal`` are searches; ``ilp``
#: needs minutes on these sizes). A new exact planner plugs in by name with --baselines.
ONE_CALL = ("single", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "pipedream_dp")


def per_model_search(pb: G.Problem, names: list[str], anneal_calls: int) -> dict[str, Any]:
    from agents import baselines

    oracle = pb.oracle()
    t0 = time.perf_counter()
    best: tuple[float, np.ndarray, str] | None = None
    for name in names:
        try:
            p = baselines.get(name)(pb.graph, pb.cluster, oracle)
        except Exception:  # infeasible, or a planner refusing the instance
            continue
        t = float(p.meta["step_time"])
        if math.isfinite(t) and (best is None or t < best[0]):
            best = (t, np.asarray(p.placement), name)
    if best is None:
        return {"search": None}
    t, pl, name = best
    out = {"best_baseline": name, "best_baseline_ms": 1e3 * t}
    if anneal_calls > 0:
        p = baselines.get("anneal")(pb.graph, pb.cluster, oracle, anneal_calls, init=pl, seed=0)
        if float(p.meta["step_time"]) < t:
            t, name = float(p.meta["step_time"]), f"anneal from {name}"
    out.update(search_ms=1e3 * t, search_from=name, search_seconds=time.perf_counter() - t0)
    return out


def zero_shot(
    pb: G.Problem,
    policy: Any,
    samples: int,
    *,
    decode: str | None = None,
    penalty: float | list[float] | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    from agents.baselines import InfeasiblePlanError

    oracle = pb.oracle()
    t0 = time.perf_counter()
    try:
        plan = policy.plan(
            pb.graph, pb.cluster, microbatches=pb.microbatches, schedule=pb.schedule,
            samples=samples, oracle=oracle, seed=0, decode=decode, penalty=penalty,
            temperature=temperature,
        )  # fmt: skip
    except InfeasiblePlanError:
        return {"zs_ms": None, "oom": True, "plan_seconds": time.perf_counter() - t0}
    sec = time.perf_counter() - t0
    res = pb.oracle().evaluate(plan.placement)
    return {
        "zs_ms": 1e3 * float(res.step_time),
        "oom": bool(res.oom),
        "plan_seconds": sec,
        "oracle_calls": int(plan.meta["oracle_calls"]),
        "lower_bound_ms": 1e3 * float(res.lower_bound),
    }


def table(rows: list[dict[str, Any]], split: str) -> str:
    head = (
        "| model @ cluster | units | devices | lower bound | zero-shot (ms) | plan time (s) | "
        "per-model search (ms) | from | ratio |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"
    )
    lines = [head]
    for r in rows:
        if r["split"] != split:
            continue
        zs = (
            "OOM / none"
            if r["zs_ms"] is None
            else f"{r['zs_ms']:.2f}" + (" OOM" if r["oom"] else "")
        )
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        lines.append(
            f"| {r['name']} | {r['units']} | {r['devices']} | {r.get('lower_bound_ms', float('nan')):.2f} | "
            f"{zs} | {r['plan_seconds']:.2f} | {r.get('search_ms', float('nan')):.2f} | "
            f"{r.get('search_from', '-')} | {ratio} |"
        )
    rs = [r["ratio"] for r in rows if r["split"] == split and r.get("ratio") is not None]
    ooms = sum(1 for r in rows if r["split"] == split and (r["oom"] or r["zs_ms"] is None))
    pt = [r["plan_seconds"] for r in rows if r["split"] == split]
    if rs:
        lines.append("")
        lines.append(
            f"{split}: {len(rs)} rows, geo-mean ratio {math.exp(np.mean(np.log(rs))):.3f}, "
            f"worst {max(rs):.3f}, best {min(rs):.3f}, OOM/none {ooms}, "
            f"planning time max {max(pt):.2f} s (mean {np.mean(pt):.2f} s)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="generalist")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--anneal-calls", type=int, default=2000)
    ap.add_argument("--train-rows", type=int, default=12)
    ap.add_argument("--baselines", nargs="+", default=list(ONE_CALL))
    ap.add_argument("--json", type=Path, default=Path("runs/generalist/eval.json"))
    ap.add_argument("--out", type=Path, default=Path("runs/generalist/eval.md"))
    ap.add_argument("--splits", nargs="+", default=["heldout", "train"])
    ap.add_argument(
        "--search-cache", type=Path, default=Path("runs/generalist/search.json"),
        help="per-model search results by row (reused: they do not depend on the policy)",
    )  # fmt: skip
    ap.add_argument("--search-only", action="store_true", help="fill the search cache only")
    ap.add_argument("--decode", default=None, choices=[None, "chain", "independent"])
    ap.add_argument(
        "--penalty", default=None, type=lambda s: [float(v) for v in s.split(",")],
        help="chain penalty, or a comma-separated ladder (default: the policy's)",
    )  # fmt: skip
    ap.add_argument(
        "--temperature", type=float, default=None,
        help="chain decoding's sampling temperature (default: the policy's)",
    )  # fmt: skip
    ap.add_argument(
        "--corpus", default="shipped", choices=sorted(G.CORPORA),
        help="whose held-out and training rows (transfer: agents.generalist.TRANSFER_CORPUS)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import agents

    corpus = G.corpus_named(args.corpus)

    policy = None if args.search_only else agents.load_policy(args.policy)
    problems: list[G.Problem] = []
    if "heldout" in args.splits:
        problems += G.corpus_instances(corpus, split="heldout")
    if "train" in args.splits and args.train_rows > 0:
        train = G.corpus_instances(corpus, split="train")
        step = corpus.clusters_per_graph
        firsts = train[: len(corpus.train_graphs) * step : step]  # one per zoo graph
        rest = [p for p in train if p not in firsts]
        problems += (firsts + rest[:: max(1, len(rest) // 8)])[: args.train_rows]
    rows: list[dict[str, Any]] = []
    cache: dict[str, Any] = {}
    if args.search_cache.exists():
        cache = json.loads(args.search_cache.read_text())
    from placement_env.encoding import unit_graph

    for pb in problems:
        key = f"{pb.name} | M={pb.microbatches} {pb.schedule} | anneal={args.anneal_calls}"
        if key not in cache:
            cache[key] = per_model_search(pb, args.baselines, args.anneal_calls)
            args.search_cache.parent.mkdir(parents=True, exist_ok=True)
            args.search_cache.write_text(json.dumps(cache, indent=1))
            print(pb.name, cache[key], flush=True)
        if args.search_only:
            continue

        r: dict[str, Any] = {
            "name": pb.name, "split": pb.split, "units": unit_graph(pb.graph).num_units,
            "devices": pb.cluster.num_devices, "microbatches": pb.microbatches,
            "schedule": pb.schedule,
        }  # fmt: skip
        pen = args.penalty[0] if args.penalty and len(args.penalty) == 1 else args.penalty
        r.update(
            zero_shot(
                pb,
                policy,
                args.samples,
                decode=args.decode,
                penalty=pen,
                temperature=args.temperature,
            )  # fmt: skip
        )
        r.update(cache[key])
        r["ratio"] = (
            r["zs_ms"] / r["search_ms"]
            if r.get("zs_ms") and r.get("search_ms") and not r["oom"]
            else None
        )
        rows.append(r)
        print(json.dumps(r), flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    if args.search_only:
        return
    md = [
        f"policy {args.policy}, corpus {args.corpus}, {args.samples} samples, "
        f"decode {args.decode or 'default'}, "
        f"penalty {args.penalty or 'default'}, temperature {args.temperature or 'default'}, "
        f"anneal {args.anneal_calls} calls",
        "",
    ]
    for split in args.splits:
        md += [f"### {split}", "", table(rows, split), ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
