"""Zero-shot quality of the generalist against per-model search, for docs/generalisation.md.

    python scripts/eval_generalist.py --policy generalist --samples 8 --anneal-calls 2000 \
        --train-rows 12 --json runs/generalist/eval.json --out runs/generalist/eval.md

Rows: every held-out model x held-out cluster pair of ``agents.generalist.CORPUS``, and the
first ``--train-rows`` training problems (one per graph source first). For each row:

- zero-shot: ``load_policy(POLICY).plan(graph, cluster, samples=K, oracle=simulator, seed=0)``
  (the network's own plans: greedy + K-1 samples, best feasible by the oracle); its wall time;
- per-model search (``--reference``, the reference the issue asks for: "the best of every
  baseline and annealing from it with thousands of calls"):

  - ``each`` (the default since 27 Nov 2026): every one-call baseline of ``--baselines``
    (:data:`BASELINES`: the heuristics and the exact planners ``chain_dp``, ``ideal_dp``,
    ``ideal_dp_makespan``), then ``--anneal-calls`` annealing calls from *each* distinct
    feasible plan among them; the best of all. Adding a baseline can only lower it.
  - ``best`` (the reference of every figure measured before 27 Nov 2026): annealing from the
    best one-call plan only, over :data:`ONE_CALL` (no exact planner). Not monotone: annealing
    from a better start can end worse (on bert-base @ eth_hosts_8xk40+h100, from
    ``ideal_dp_makespan``'s 11.38 ms it ended at 9.80 ms, from ``metis``'s 9.17 ms at 8.49).
- ratio = zero-shot step time / per-model search step time.
"""

from __future__ import annotations

import argparse
import json
import math
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import generalist as G
from runners.common import save_figure

#: One-call baselines of the ``best`` reference (the figures before 27 Nov 2026): the
#: heuristics only (``random`` and ``anneal`` are searches).
ONE_CALL = ("single", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "pipedream_dp")

#: One-call baselines of the ``each`` reference (the default): :data:`ONE_CALL` and the exact
#: planners of max-load and makespan. ``ilp`` is left out: it needs minutes at these sizes and
#: optimises max-load, not the makespan these rows are scored by.
BASELINES = (*ONE_CALL, "chain_dp", "ideal_dp", "ideal_dp_makespan")

#: ``--reference`` choices: how per-model search anneals from the one-call plans.
REFERENCES = ("each", "best")


def _check_reference(reference: str) -> None:
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")


def default_baselines(reference: str) -> list[str]:
    """The one-call baselines of a ``reference``: :data:`BASELINES` for ``each``,
    :data:`ONE_CALL` for ``best``."""
    _check_reference(reference)
    return list(BASELINES if reference == "each" else ONE_CALL)


def add_reference_argument(ap: argparse.ArgumentParser) -> None:
    """``--reference`` (one of :data:`REFERENCES`, default ``each``) of the three generalist
    scripts: how per-model search anneals from the one-call plans."""
    ap.add_argument(
        "--reference", default="each", choices=REFERENCES,
        help="per-model search: anneal from each one-call plan (default) or from the best "
        "heuristic's plan only (the figures before 27 Nov 2026)",
    )  # fmt: skip


def search_key(pb: G.Problem, anneal_calls: int, reference: str = "each") -> str:
    """The search cache's key of a row. ``best`` keeps the key of the caches written before 27
    Nov 2026 (that reference over :data:`ONE_CALL`), so they are read as what they are."""
    _check_reference(reference)
    key = f"{pb.name} | M={pb.microbatches} {pb.schedule} | anneal={anneal_calls}"
    return key if reference == "best" else f"{key} | reference=each"


def check_cache_keys(problems: list[G.Problem], keys: list[str]) -> None:
    """A ``ValueError`` naming them when two different problems (other graph, cluster,
    microbatches or schedule: :func:`agents.generalist.problem_key`) share a search cache key,
    which would give the second the first's per-model search."""
    seen: dict[str, str] = {}
    for pb, key in zip(problems, keys, strict=True):
        mine = G.problem_key(pb)
        prev = seen.setdefault(key, mine)
        if prev != mine:
            raise ValueError(
                f"two different problems share the search cache key {key!r}: {prev!r} and {mine!r}"
            )


def check_cached_problems(
    problems: list[G.Problem], keys: list[str], cache: dict[str, Any], path: Path
) -> None:
    """A ``ValueError`` when a cached search was made for another problem than the row now
    has (its graph, cluster, microbatches or schedule: :func:`agents.generalist.problem_key`,
    recorded with each entry since 29 Nov 2026): the cache is keyed by the row's name, so a
    search cached before a change of the simulator's graph or cluster would be reused as the
    reference. Entries written before that carry no key and are printed as unchecked."""
    old = []
    for pb, key in zip(problems, keys, strict=True):
        entry = cache.get(key)
        if not isinstance(entry, dict):
            continue
        made = entry.get("problem")
        if made is None:
            old.append(pb.name)
        elif made != G.problem_key(pb):
            raise ValueError(
                f"{path}: the search cached for {key!r} was made for {made!r}, not for this "
                f"row's {G.problem_key(pb)!r}; delete the entry (or use another --search-cache)"
            )
    if old:
        print(f"note: {len(old)} cached searches in {path} predate problem keys (29 Nov 2026) "
              f"and are not checked against the rows, e.g. {old[:2]}", flush=True)  # fmt: skip


def per_model_search(
    pb: G.Problem, names: list[str], anneal_calls: int, *, reference: str = "each"
) -> dict[str, Any]:
    """Per-model search on one row: the one-call baselines ``names`` (a planner that refuses
    the row or finds no feasible plan is skipped), then ``anneal_calls`` annealing calls (seed
    0) from the best of them (``reference="best"``) or from each distinct feasible plan of them
    (``"each"``); the best plan of all. Returns ``search_ms``, ``search_from`` (the planner,
    or ``"anneal from NAME"``), ``best_baseline`` and its ms, ``starts`` (plans annealed from),
    ``search_calls`` (oracle calls of the annealing runs) and ``search_seconds``;
    ``{"search": None}`` when no baseline gives a feasible plan."""
    from agents import baselines

    _check_reference(reference)
    oracle = pb.oracle()
    t0 = time.perf_counter()
    plans: list[tuple[float, np.ndarray, str]] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            p = baselines.get(name)(pb.graph, pb.cluster, oracle)
        except ValueError as exc:  # infeasible (InfeasiblePlanError), or a planner refusing
            # the instance; any other exception is a bug and stops the run (it was dropped
            # without a word, which weakened the reference: found by an audit, 29 Nov 2026)
            skipped[name] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            continue
        t = float(p.meta["step_time"])
        if math.isfinite(t):
            plans.append((t, np.asarray(p.placement), name))
    if not plans:
        return {"search": None, "skipped": skipped}
    plans.sort(key=lambda x: x[0])  # stable: ties keep the order of ``names``
    t, _, name = plans[0]
    out: dict[str, Any] = {"best_baseline": name, "best_baseline_ms": 1e3 * t, "skipped": skipped}
    starts: list[tuple[float, np.ndarray, str]] = []
    seen: set[bytes] = set()
    for plan in plans[: 1 if reference == "best" else len(plans)]:
        k = np.ascontiguousarray(plan[1], dtype=np.int64).tobytes()
        if k not in seen:
            seen.add(k)
            starts.append(plan)
    calls = 0
    if anneal_calls > 0:
        for _, pl, start in starts:
            p = baselines.get("anneal")(pb.graph, pb.cluster, oracle, anneal_calls, init=pl, seed=0)
            calls += int(p.meta.get("evaluations", anneal_calls))
            if float(p.meta["step_time"]) < t:
                t, name = float(p.meta["step_time"]), f"anneal from {start}"
    out.update(
        search_ms=1e3 * t, search_from=name, starts=len(starts), search_calls=calls,
        search_seconds=time.perf_counter() - t0, reference=reference,
    )  # fmt: skip
    return out


def zero_shot(
    pb: G.Problem,
    policy: Any,
    samples: int,
    *,
    decode: str | None = None,
    penalty: float | list[float] | None = None,
    temperature: float | None = None,
    link_exponent: float | None = None,
) -> dict[str, Any]:
    from agents.baselines import InfeasiblePlanError

    oracle = pb.oracle()
    t0 = time.perf_counter()
    try:
        plan = policy.plan(
            pb.graph, pb.cluster, microbatches=pb.microbatches, schedule=pb.schedule,
            samples=samples, oracle=oracle, seed=0, decode=decode, penalty=penalty,
            temperature=temperature, link_exponent=link_exponent,
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


#: The issue's held-out targets, drawn on the plot: geo-mean and worst pair.
TARGET_GEOMEAN, TARGET_WORST = 1.10, 1.25


def plot_rows(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Zero-shot / per-model search per row (bars from 1, one colour per split; a hatched bar
    to the worst-pair target where the plan is out of memory or missing) beside its planning
    time, with the geo-mean and worst-pair targets as lines. Written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = list(reversed(rows))  # the first row on top
    y = np.arange(len(rs))
    fig, (ax, at) = plt.subplots(1, 2, figsize=(13, 0.28 * len(rs) + 1.6), sharey=True,
                                 gridspec_kw={"width_ratios": [3, 1]})  # fmt: skip
    colours = {"heldout": "tab:red", "train": "tab:blue"}
    for split in dict.fromkeys(r["split"] for r in rs):
        idx = [i for i, r in enumerate(rs) if r["split"] == split]
        ratios = [rs[i].get("ratio") for i in idx]
        ok = [r for r in ratios if r is not None]
        geo = math.exp(np.mean(np.log(ok))) if ok else float("nan")
        worst = max(ok, default=float("nan"))
        ax.barh([y[i] for i in idx], [(r if r is not None else 1.0) - 1.0 for r in ratios],
                left=1.0, color=colours.get(split, "tab:grey"),
                label=f"{split}: geo-mean {geo:.3f}, worst {worst:.3f}")  # fmt: skip
        for i, r in zip(idx, ratios):
            if r is None:  # out of memory or no plan
                ax.barh(y[i], TARGET_WORST - 1.0, left=1.0, color="white", edgecolor="k",
                        hatch="//")  # fmt: skip
        at.barh([y[i] for i in idx], [rs[i]["plan_seconds"] for i in idx],
                color=colours.get(split, "tab:grey"))  # fmt: skip
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvline(
        TARGET_GEOMEAN, color="k", ls="--", lw=0.8, label=f"target geo-mean {TARGET_GEOMEAN}"
    )
    ax.axvline(TARGET_WORST, color="k", ls=":", lw=0.8, label=f"target worst pair {TARGET_WORST}")
    ok = [r["ratio"] for r in rs if r.get("ratio") is not None] or [1.0]
    ax.set_xlim(min(0.95, min(ok) - 0.02), max(TARGET_WORST, max(ok)) + 0.05)
    ax.set_yticks(y, [r["name"] for r in rs], fontsize=7)
    ax.set_xlabel("zero-shot step time / per-model search")
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    at.axvline(2.0, color="k", ls=":", lw=0.8)
    at.set_xlabel("planning (s), target 2")
    return save_figure(fig, path, title=textwrap.fill(title, 160))


def check_decoding_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse the generalist scripts' bad numbers before the per-model searches (minutes):
    ``--samples 0`` failed only after them, ``--penalty nan`` and ``--anneal-calls -5`` were
    taken, a negative temperature raised a traceback. Reads whichever of ``samples``,
    ``anneal_calls``, ``penalty`` / ``penalties``, ``temperature`` / ``temperatures`` and
    ``link_exponent`` / ``link_exponents`` ``args`` has."""

    def listed(name: str) -> list:
        v = getattr(args, name, None)
        return (
            [] if v is None else [x for x in (v if isinstance(v, list) else [v]) if x is not None]
        )

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    if getattr(args, "samples", 1) < 1:
        ap.error(f"--samples must be an integer >= 1, got {args.samples}")
    if getattr(args, "anneal_calls", 0) < 0:
        ap.error(f"--anneal-calls must be an integer >= 0, got {args.anneal_calls}")
    for name in ("penalty", "penalties"):
        for ladder in listed(name):
            for x in ladder if isinstance(ladder, list) else [ladder]:
                if not (math.isfinite(x) and x >= 0):
                    ap.error(f"{flag(name)}: a penalty must be a finite number >= 0, got {x}")
    for name in ("temperature", "temperatures"):
        for x in listed(name):
            if not (math.isfinite(x) and x > 0):
                ap.error(f"{flag(name)} must be finite numbers > 0, got {x}")
    for name in ("link_exponent", "link_exponents"):
        for x in listed(name):
            if not (math.isfinite(x) and x >= 0):
                ap.error(f"{flag(name)} must be finite numbers >= 0, got {x}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="generalist")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--anneal-calls", type=int, default=2000)
    ap.add_argument("--train-rows", type=int, default=12)
    ap.add_argument(
        "--baselines", nargs="+", default=None,
        help="one-call baselines of per-model search (default: BASELINES for --reference "
        "each, ONE_CALL for best)",
    )  # fmt: skip
    add_reference_argument(ap)
    ap.add_argument("--json", type=Path, default=Path("runs/generalist/eval.json"))
    ap.add_argument("--out", type=Path, default=Path("runs/generalist/eval.md"))
    ap.add_argument(
        "--plot", type=Path, default=None,
        help="bar chart of the ratios and planning times (PNG; default: --out with .png)",
    )  # fmt: skip
    ap.add_argument(
        "--splits", nargs="+", default=["heldout", "train"], choices=["heldout", "train"]
    )
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
        "--link-exponent", type=float, default=None,
        help="link-aware chain decoding's exponent (default: the policy's)",
    )  # fmt: skip
    ap.add_argument(
        "--corpus", default="shipped", choices=sorted(G.CORPORA),
        help="whose held-out and training rows (transfer: agents.generalist.TRANSFER_CORPUS)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    check_decoding_arguments(ap, args)
    if args.train_rows < 0:
        ap.error(f"--train-rows must be an integer >= 0, got {args.train_rows}")
    if args.baselines is None:
        args.baselines = default_baselines(args.reference)
    from agents import baselines as B

    ops = [b for b in B.names() if b not in B.HYBRID_PLANNERS]
    unknown = [b for b in args.baselines if b not in ops]
    if unknown:  # every row's search used to come out nan
        ap.error(f"--baselines: {unknown} are not op-placement baselines ({', '.join(ops)})")
    torch.set_num_threads(1)
    import agents

    corpus = G.corpus_named(args.corpus)

    try:
        policy = None if args.search_only else agents.load_policy(args.policy)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        ap.error(f"--policy: {exc}")
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

    keys = [search_key(pb, args.anneal_calls, args.reference) for pb in problems]
    if args.baselines != default_baselines(args.reference):
        keys = [key + " | baselines=" + ",".join(args.baselines) for key in keys]
    check_cache_keys(problems, keys)
    try:
        check_cached_problems(problems, keys, cache, args.search_cache)
    except ValueError as exc:
        ap.error(str(exc))
    for pb, key in zip(problems, keys, strict=True):
        if key not in cache:
            cache[key] = per_model_search(
                pb, args.baselines, args.anneal_calls, reference=args.reference
            )
            cache[key]["problem"] = G.problem_key(pb)
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
                link_exponent=args.link_exponent,
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
        f"link exponent {args.link_exponent if args.link_exponent is not None else 'default'}, "
        f"anneal {args.anneal_calls} calls from {args.reference} of {len(args.baselines)} "
        "one-call baselines",
        "",
    ]
    for split in args.splits:
        md += [f"### {split}", "", table(rows, split), ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(md))
    print("\n".join(md))
    plot = plot_rows(rows, args.plot or args.out.with_suffix(".png"), md[0])
    print(f"wrote {plot}")


if __name__ == "__main__":
    main()
