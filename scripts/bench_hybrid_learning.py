"""Learned vs classic hybrid planners: PPO on Hybrid-v0 against megatron_grid and alpa, at equal oracle calls and equal wall time.

Usage: ``python scripts/bench_hybrid_learning.py [--rows 8,1024,3072] [--seed 0] [--no-write]``.

For each row (a model, a cluster, a global batch) it runs ``megatron_grid`` and ``alpa``
(whole spaces; their oracle calls ``N`` and seconds ``T``), then trains ``MaskablePPO``
(SB3 ``MultiInputPolicy`` on the env's padded ``Dict`` observation, action masks) on
``placement_env/Hybrid-v0`` for that one problem, starting episodes from random layouts,
until it has spent ``max(N_grid, ...)`` oracle calls and ``T_grid`` seconds. The best
memory-feasible step time PPO has *seen* is read at ``N_grid`` calls and at ``T_grid``
seconds. This is direct SB3 training, not ``runners.train`` (which has no PPO path for
Hybrid-v0 yet). Writes a table into ``docs/results.md`` between
``<!-- hybrid-learning:start -->`` / ``<!-- hybrid-learning:end -->``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import placement_env  # noqa: E402,F401
from agents import baselines  # noqa: E402
from graphs import clusters, zoo  # noqa: E402
from placement_env import generators  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402

DOC = ROOT / "docs" / "results.md"
START, END = "<!-- hybrid-learning:start -->", "<!-- hybrid-learning:end -->"

ROWS = {
    8: ("GPT-2 XL, 8 x V100 (DGX-1), batch 8", dict(name="gpt2-xl", max_groups=256), "dgx1_v100_8", 8),
    1024: (
        "GPT-3 175B, 1,024 x A100, batch 1,536",
        dict(name="gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048),
        "dgx_a100_80g_x128", 1536,
    ),
    3072: (
        "GPT 1T, 3,072 x A100, batch 3,072",
        dict(name="gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048),
        "dgx_a100_80g_x384", 3072,
    ),
}  # fmt: skip


class Recorder(gym.Wrapper):
    """Keeps (oracle calls, seconds, best feasible step time) after every oracle call."""

    def __init__(self, env: gym.Env, t0: float) -> None:
        super().__init__(env)
        self.t0 = t0
        self.best = float("inf")
        self.history: list[tuple[int, float, float]] = []

    def _note(self, info: dict) -> None:
        if not info["oom"]:
            self.best = min(self.best, info["step_time"])
        calls = self.env.unwrapped.total_oracle_calls
        self.history.append((calls, time.perf_counter() - self.t0, self.best))

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self._note(info)
        return obs, info

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        if not info["invalid_action"]:
            self._note(info)
        return obs, r, term, trunc, info


def best_at(
    history: list[tuple[int, float, float]], *, calls: int | None = None, secs: float | None = None
) -> float:
    best = float("inf")
    for c, t, b in history:
        if (calls is not None and c > calls) or (secs is not None and t > secs):
            break
        best = b
    return best


def run_row(gpus: int, seed: int) -> dict:
    from sb3_contrib import MaskablePPO

    label, mkw, cname, gb = ROWS[gpus]
    mkw = dict(mkw)
    g = zoo.build(mkw.pop("name"), **mkw)
    cl = clusters.load(cname)
    out: dict = {"label": label, "gpus": cl.num_devices}
    for name in ("megatron_grid", "alpa"):
        sim = Simulator(g, cl)
        t = time.perf_counter()
        p = baselines.get(name)(g, cl, sim, None, global_batch=gb)
        out[name] = (p.meta["step_time"], int(p.meta["oracle_calls"]), time.perf_counter() - t)
    n_grid, t_grid = out["megatron_grid"][1], out["megatron_grid"][2]
    gen = generators.fixed(g, cl)
    t0 = time.perf_counter()
    env = Recorder(
        gym.make("placement_env/Hybrid-v0", generator=gen, global_batch=gb, init="random"), t0
    )
    model = MaskablePPO(
        "MultiInputPolicy", env, seed=seed, n_steps=128, batch_size=64, learning_rate=3e-4,
        ent_coef=0.01, gamma=0.95, verbose=0,
    )  # fmt: skip
    steps = 0
    while True:
        model.learn(total_timesteps=128, reset_num_timesteps=False)
        steps += 128
        c, s, _ = env.history[-1]
        if c >= n_grid and s >= t_grid:
            break
        if s > max(4 * t_grid, 120.0) and c >= n_grid:
            break
    out["ppo_calls"] = best_at(env.history, calls=n_grid)
    out["ppo_time"] = best_at(env.history, secs=t_grid)
    out["ppo_total"] = (env.history[-1][2], env.history[-1][0], env.history[-1][1])
    print(out, flush=True)
    return out


def ms(x: float) -> str:
    return "no feasible plan" if not np.isfinite(x) else f"{x * 1e3:,.0f} ms"


def table(rows: list[dict]) -> str:
    lines = [
        "| problem | GPUs | megatron_grid (calls, s) | alpa (calls, s) | PPO at the grid's calls | PPO at the grid's wall time | PPO at the end (calls, s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mg, al, pt = r["megatron_grid"], r["alpa"], r["ppo_total"]
        lines.append(
            f"| {r['label']} | {r['gpus']:,} | {ms(mg[0])} ({mg[1]:,}, {mg[2]:.0f} s) | "
            f"{ms(al[0])} ({al[1]:,}, {al[2]:.0f} s) | {ms(r['ppo_calls'])} | {ms(r['ppo_time'])} | "
            f"{ms(pt[0])} ({pt[1]:,}, {pt[2]:.0f} s) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8,1024,3072")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = [run_row(int(x), args.seed) for x in args.rows.split(",")]
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

`python scripts/bench_hybrid_learning.py` (seed 0): PPO (`MaskablePPO`, SB3's
`MultiInputPolicy` on Hybrid-v0's padded observation, action masks, episodes of 64 steps
from random layouts) trained on each problem alone, against `megatron_grid` and `alpa`
over their whole spaces. "At the grid's calls / wall time": the best memory-feasible step
time PPO had seen after as many oracle calls / seconds as `megatron_grid` used. Trained
directly with SB3, not through `runners.train`; one seed; shared 2-core machine.

"""


if __name__ == "__main__":
    main()
