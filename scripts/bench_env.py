"""Benchmark env steps per second on the default experiment; writes a table into docs/environments.md."""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import placement_env  # noqa: E402, F401  (registers the ids)

DOC = ROOT / "docs" / "environments.md"
BEGIN, END = "<!-- bench_env:begin -->", "<!-- bench_env:end -->"


def bench(env_id: str, steps: int, seed: int = 0, **kwargs) -> dict[str, float]:
    """Random-action steps per second of ``env_id`` (resets excluded from the step time)."""
    env = gym.make(env_id, **kwargs)
    t0 = time.perf_counter()
    env.reset(seed=seed)  # first reset: instance preparation and JIT compilation
    first_reset = time.perf_counter() - t0
    env.action_space.seed(
        seed + 12345
    )  # not the env seed: its draws would replay the initial placement
    stepping = 0.0
    done = 0
    calls0 = env.unwrapped.total_oracle_calls
    while done < steps:
        t = time.perf_counter()
        _, r, term, trunc, _ = env.step(env.action_space.sample())
        stepping += time.perf_counter() - t
        done += 1
        assert np.isfinite(r)
        if term or trunc:
            env.reset()
    calls = env.unwrapped.total_oracle_calls - calls0
    inst = env.unwrapped.instance
    what = f"{inst.graph.meta.get('name', inst.name)} ({inst.graph.num_nodes} nodes) on {inst.cluster.name}"
    env.close()
    return {
        "steps": done, "steps_per_s": done / stepping, "first_reset_s": first_reset,
        "oracle_calls": calls, "instance": what,
    }  # fmt: skip


def main() -> None:
    from scripts.argtypes import positive_int

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=positive_int, default=1024)
    ap.add_argument("--no-write", action="store_true", help="print only, leave docs/ alone")
    args = ap.parse_args()
    cases = [
        # a step that leaves the placement as it was is answered from the episode's cache
        (
            "placement_env/Sweep-v0",
            {},
            "dense reward (an oracle call per step that changes the placement)",
        ),
        (
            "placement_env/Sweep-v0",
            {"reward_mode": "final"},
            "final reward (two calls per episode: the start and the end)",
        ),
        ("placement_env/OneShot-v0", {}, "one oracle call per step"),
    ]
    rows = []
    load_before = os.getloadavg()
    for env_id, kw, note in cases:
        res = bench(env_id, args.steps, **kw)
        line = (
            f"| `{env_id}` {kw or ''} | {res['steps_per_s']:.0f} | {res['steps']} | "
            f"{res['oracle_calls']} | {res['first_reset_s']:.1f} | {note} |"
        )
        print(line, flush=True)
        rows.append(line)
    table = "\n".join(
        [
            BEGIN,
            f"Measured by `python scripts/bench_env.py --steps {args.steps}` on "
            f"{platform.processor() or platform.machine()} ({time.strftime('%Y-%m-%d')}), "
            f"{os.cpu_count()} logical CPUs, one process, random actions, the envs' default "
            f"instance: {res['instance']}. Load average {load_before[0]:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after the runs (above 1: other jobs shared the cores, "
            "so the rates are lower bounds).",
            "",
            "| env | steps/s | steps | oracle calls | first reset (s) | note |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            END,
        ]
    )
    if not args.no_write:
        text = DOC.read_text()
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), table, text, flags=re.S)
        else:
            text += "\n## Speed\n\n" + table + "\n"
        DOC.write_text(text)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
