"""Compare `ideal_dp_makespan` with `ideal_dp`, `pipedream_dp` and `anneal` on makespan envs.

Prints the markdown table of docs/baselines.md ("Makespan variant"): each env's own
oracle (``conf/env/NAME.yaml``), the simulator's step time of each planner's plan and
its wall time, and what `ideal_dp_makespan` proved.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from agents import baselines  # noqa: E402
from runners import common, schema  # noqa: E402

#: (column, baseline, options): the makespan DP's default, its T-optimal split alone, the rest.
PLANNERS = (
    ("ideal_dp_makespan", "ideal_dp_makespan", {}),
    ("score_splits=False", "ideal_dp_makespan", {"score_splits": False}),
    ("ideal_dp", "ideal_dp", {}),
    ("pipedream_dp", "pipedream_dp", {}),
    ("anneal", "anneal", {}),
)


def env_problem(name: str) -> common.Problem:
    """The problem of ``conf/env/NAME.yaml`` as ``runners.train`` builds it."""
    from hydra import compose, initialize_config_dir

    schema.register()
    with initialize_config_dir(config_dir=str(common.CONF_DIR), version_base=None):
        cfg = compose(config_name="train", overrides=[f"+env={name}"])
    return common.build_problem(common.env_spec(cfg.env))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("envs", nargs="*", default=["gpt2_8gpu", "bert_8gpu"])
    ap.add_argument("--anneal-budget", type=int, default=200)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    print(
        f"<!-- python scripts/bench_ideal_makespan.py {' '.join(sys.argv[1:])} | "
        f"{platform.node()} | {time.strftime('%Y-%m-%d %H:%M')} | {os.cpu_count()} CPUs, "
        f"load average {load0:.2f} -->"
    )
    print(
        "| env | M, schedule | "
        + " | ".join(f"{p[0]} ms (s)" for p in PLANNERS)
        + " | makespan DP |"
    )
    print("| --- | --- | " + " | ".join("---:" for _ in PLANNERS) + " | --- |")
    for env in a.envs:
        prob = env_problem(env)
        cells, note = [], ""
        for label, name, options in PLANNERS:
            oracle = prob.oracle()
            budget = a.anneal_budget if name == "anneal" else None
            t0 = time.perf_counter()
            try:
                plan = baselines.get(name)(prob.graph, prob.cluster, oracle, budget, **options)
            except baselines.InfeasiblePlanError as exc:
                cells.append(f"infeasible ({time.perf_counter() - t0:.2f})")
                note = note or str(exc)[:60]
                continue
            dt = time.perf_counter() - t0
            cells.append(f"{plan.meta['step_time'] * 1e3:.2f} ({dt:.2f})")
            if label == "ideal_dp_makespan":
                m = plan.meta
                note = (
                    f"{m['status']}, exact {m['exact']}, T* {m['surrogate_objective'] * 1e3:.2f} ms "
                    f"(max-load split {m['maxload_surrogate_objective'] * 1e3:.2f}), "
                    f"{m['walk_runs']} walk runs, {m['splits_scored']} splits scored"
                )
        s = prob.spec
        print(f"| {env} | {s.microbatches}, {s.schedule} | " + " | ".join(cells) + f" | {note} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
