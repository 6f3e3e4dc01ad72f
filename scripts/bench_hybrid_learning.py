"""Learned vs classic hybrid planners: PPO on Hybrid-v0 against megatron_grid, alpa and pipedream, at equal oracle calls and equal wall time.

Usage: ``python scripts/bench_hybrid_learning.py [--rows 8,1024,3072] [--seeds 0,1] [--reuse] [--no-write]``.

Each row is one ``python -m runners.train +env=ENV agent=ppo`` run (the runner's own PPO
path on ``placement_env/Hybrid-v0``: ``MaskablePPO`` with SB3's ``MultiInputPolicy``, action
masks, episodes of 64 steps from random layouts, ``env.env_kwargs={init: random}``) whose
baselines are ``megatron_grid`` and ``alpa`` over their whole spaces and ``pipedream``
(PipeDream's DP: replicated stages, no TP; "no plan" where no layer fits a GPU without TP);
their oracle calls ``N`` and search seconds ``T`` are in ``baselines.json``. PPO's budget is
a fixed number of env steps per row, at least the grid's ``N``; its learning curve (``result.json``'s
``meta.curve``: timesteps, oracle calls, seconds since its search began, best feasible step
time) gives the best step time PPO had seen at ``N_grid`` calls and at ``T_grid`` seconds.
Run folders go to ``outputs/bench_hybrid_learning/``. Writes a table into
``docs/results.md`` between ``<!-- hybrid-learning:start -->`` / ``<!-- hybrid-learning:end -->``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "results.md"
OUT = ROOT / "outputs" / "bench_hybrid_learning"
START, END = "<!-- hybrid-learning:start -->", "<!-- hybrid-learning:end -->"

#: the classic planners of every run, in the table's order
CLASSIC = ("megatron_grid", "alpa", "pipedream")

#: GPUs -> (label, env, PPO env steps: at least the grid's layouts, a multiple of n_steps=128)
ROWS = {
    8: ("GPT-2 XL, 8 x V100 (DGX-1), batch 8", "gpt2_8gpu_hybrid", 512),
    1024: ("GPT-3 175B, 1,024 x A100, batch 1,536", "gpt3_175b_a100_1024", 5248),
    3072: ("GPT 1T, 3,072 x A100, batch 3,072", "gpt_1t_a100_3072", 14336),
}


def best_at(
    curve: list[list[float]], *, calls: int | None = None, secs: float | None = None
) -> float:
    """The best feasible step time of the curve's last point within ``calls`` / ``secs``."""
    best = float("inf")
    for _, c, t, b in curve:
        if (calls is not None and c > calls) or (secs is not None and t > secs):
            break
        best = b
    return best


def run_row(gpus: int, seed: int, reuse: bool = False) -> dict:
    label, env, steps = ROWS[gpus]
    run_dir = OUT / f"{env}-s{seed}"
    if not (reuse and (run_dir / "result.json").exists()):
        _train(env, steps, seed, run_dir)
    return _read_row(label, env, run_dir)


def _train(env: str, steps: int, seed: int, run_dir: Path) -> None:
    cmd = [
        sys.executable, "-m", "runners.train", f"+env={env}", "agent=ppo",
        "env.baselines=[megatron_grid,alpa,pipedream]", "+env.env_kwargs={init: random}",
        f"train.timesteps={steps}", "train.seconds=null", "train.checkpoint_every=0",
        "train.progress=false", "logger=none", f"seed={seed}", f"output_dir={run_dir}",
    ]  # fmt: skip
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def _read_row(label: str, env: str, run_dir: Path) -> dict:
    base = json.loads((run_dir / "baselines.json").read_text())
    res = json.loads((run_dir / "result.json").read_text())
    curve = res["meta"]["curve"]
    out: dict = {"label": label, "env": env, "gpus": res["num_gpus"], "seed": res["seed"]}
    for name in CLASSIC:
        b = base.get(name)
        if b is None:  # a run made before the planner was among the baselines
            out[name] = None
            continue
        out[name] = (b["step_time"] or float("inf"), int(b["oracle_calls"]), float(b["seconds"]))
    n_grid, t_grid = out["megatron_grid"][1], out["megatron_grid"][2]
    out["ppo_calls"] = best_at(curve, calls=n_grid)
    out["ppo_time"] = best_at(curve, secs=t_grid)
    end = curve[-1]
    out["ppo_total"] = (res["best_step_time"], int(res["oracle_calls"]), float(end[2]))
    out["short_calls"] = int(res["oracle_calls"]) < n_grid  # PPO ended before the grid's calls
    out["short_time"] = float(end[2]) < t_grid  # ... or before the grid's seconds
    print(out, flush=True)
    return out


def ms(x: float) -> str:
    return "no feasible plan yet" if not np.isfinite(x) else f"{x * 1e3:,.0f} ms"


def classic_cell(outcome: tuple[float, int, float] | None) -> str:
    """A classic planner's cell: step time (calls, seconds); "no plan" when it found none."""
    if outcome is None:
        return "not run"
    t, calls, secs = outcome
    return f"{ms(t) if np.isfinite(t) else 'no plan'} ({calls:,}, {secs:.0f} s)"


def table(rows: list[dict]) -> str:
    lines = [
        "| problem | GPUs | seed | megatron_grid (calls, s) | alpa (calls, s) | pipedream (calls, s) | PPO at the grid's calls | PPO at the grid's wall time | PPO at the end (calls, s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        pt = r["ppo_total"]
        classic = " | ".join(classic_cell(r.get(name)) for name in CLASSIC)
        lines.append(
            f"| {r['label']} | {r['gpus']:,} | {r['seed']} | {classic} | "
            f"{ms(r['ppo_calls'])}{' (ended)' * r['short_calls']} | "
            f"{ms(r['ppo_time'])}{' (ended)' * r['short_time']} | "
            f"{ms(pt[0])} ({pt[1]:,}, {pt[2]:.0f} s) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    from scripts.argtypes import int_list

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int_list, default=[8, 1024, 3072])
    ap.add_argument(
        "--seeds",
        type=int_list,
        default=[0],
        help="comma-separated seeds, one run per row and seed",
    )
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--reuse", action="store_true", help="read the rows' existing run folders")
    args = ap.parse_args()
    bad = [x for x in args.rows if x not in ROWS]
    if bad:  # a KeyError after the earlier rows had trained (found by fuzzing)
        ap.error(f"--rows: {bad} are not rows of this benchmark; valid: {sorted(ROWS)}")
    rows = [run_row(x, seed, args.reuse) for x in args.rows for seed in args.seeds]
    md = table(rows)
    print(md)
    if not args.no_write and DOC.exists():
        text = DOC.read_text()
        if START in text and END in text:
            a, b = text.index(START) + len(START), text.index(END)
            DOC.write_text(text[:a] + "\n" + md + text[b:])
        else:
            DOC.write_text(text.rstrip() + "\n\n" + SECTION + START + "\n" + md + END + "\n")
        print(f"wrote {DOC}")


SECTION = """## Learned vs classic on hybrid plans (issue 18)

`python scripts/bench_hybrid_learning.py` (seed 0): PPO trained by `runners.train
agent=ppo` on each problem alone, against `megatron_grid` and `alpa` over their whole
spaces. "At the grid's calls / wall time": the best memory-feasible step time PPO had seen
after as many oracle calls / seconds as `megatron_grid` used.

"""


if __name__ == "__main__":
    main()
