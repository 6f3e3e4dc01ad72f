"""Warm PPO vs same-start same-calls anneal on chosen rows, for ablations of the warm search.

Runs only the warm path of ``scripts/bench_quality.py`` (its functions, its options): start
from the ``pipedream_dp`` plan (the best one-call baseline on every row of docs/results.md),
train PPO-placeto and/or PPO-gdp from it, then ``anneal`` from the same plan with exactly the
oracle calls each PPO run used. Prints one markdown table line per (row, policy).

    python scripts/ablate_warm.py nmt@k40_2 inception-v3@k40_2 -- --warm-gdp-timesteps 0 \\
        --warm-keep-prob 0.9 --warm-accept all --warm-restart init
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quality as bq  # noqa: E402

graphs = bq.graphs


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        raise SystemExit("usage: ablate_warm.py MODEL@CLUSTER ... -- [bench_quality options]")
    sep = args.index("--")
    rows, options = args[:sep], args[sep + 1 :]
    a = bq.parse(["--no-zero-shot", *options])
    torch.set_num_threads(a.threads)
    print(f"options: {' '.join(options)}")
    print("| row | policy | start (ms) | PPO (ms) | oracle calls | PPO wall (s) | anneal (ms) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in rows:
        model, _, cluster = spec.partition("@")
        g = graphs.zoo.build(model, max_groups=a.max_groups)
        c = graphs.clusters.load(cluster)
        start, init = bq.run_baseline_plan("pipedream_dp", g, c, a)
        if init is None:
            print(f"| {spec} | — | infeasible start | | | | |")
            continue
        for policy, steps in (("placeto", a.warm_timesteps), ("gdp", a.warm_gdp_timesteps)):
            if steps <= 0:
                continue
            ppo, _ = bq.run_ppo(policy, g, c, a, steps, init=init)
            ann = bq.warm_anneal(g, c, a, init, ppo.calls)
            print(
                f"| {spec} | {policy} | {bq._ms(start.step_time)} | {bq._cell(ppo)} | "
                f"{ppo.calls} | {ppo.search_s:.0f} | {bq._cell(ann)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
