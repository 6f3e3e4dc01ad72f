"""Journey: profiled training on a calibrated cpu_2, then `runners.execute` runs the plan it wrote.

    python -m runners.train +env=cpu_profiled env.cluster=cpu_2@CAL.json ...  (tiny budget)
    python -m runners.execute plan=RUN/best_plan.json

Every plan scored during training is really executed (gloo processes), so the budget
is one baseline and two PPO steps, each plan timed for one step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphs import clusters, zoo
from graphs.plan import Plan
from placement_env.oracles.simulator import Simulator
from runtime.spec import plan_hash

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


def run(args: list[str], timeout: float) -> str:
    """Run ``python -m ARGS`` from the repository root; its output (fails with it on error)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_profiled_training_then_execute_its_plan(tmp_path):
    t0 = time.perf_counter()
    # a calibration is an explicit input (the file runners.profile writes), recorded in the plan
    cal = tmp_path / "cal.json"
    cal.write_text(
        json.dumps(
            {
                "device": {"peak_flops": 2e10, "mem_bw": 5e9, "memory": 3 * 2**30},
                "link": {"bandwidth": 1e9, "latency": 1e-4},
            }
        )
    )
    cluster_name = f"cpu_2@{cal}"
    train_dir = tmp_path / "train"
    out = run(
        [
            "runners.train",
            "+env=cpu_profiled",
            f"env.cluster={cluster_name}",
            "env.baselines=[single]",
            "env.oracle_options={steps: 1, warmup: 0}",
            "logger=none",
            f"output_dir={train_dir}",
            "train.timesteps=2",
            "train.progress=false",
            "agent.ppo.n_envs=1",
            "agent.ppo.n_steps=2",
            "agent.ppo.batch_size=2",
        ],
        timeout=420,
    )
    last = out.strip().splitlines()[-1]
    assert last.startswith("cpu_profiled ppo seed=0: best "), out[-2000:]
    assert "speed-up vs single x" in last and str(train_dir) in last
    assert last in (train_dir / "train.log").read_text()

    # ---- what train wrote
    for name in (
        "result.json",
        "baselines.json",
        "best_plan.json",
        "best_plan_timeline.txt",
        "best_plan_measured.json",
        "policy.pt",
        "config.yaml",
    ):
        assert (train_dir / name).is_file(), name
    result = json.loads((train_dir / "result.json").read_text())
    baselines = json.loads((train_dir / "baselines.json").read_text())
    assert baselines["single"]["error"] is None and baselines["single"]["step_time"] > 0
    best = result["best_step_time"]
    assert result["oom"] is False and 0 < best < 10 and math.isfinite(best)
    assert result["speedup_vs"]["single"] == pytest.approx(baselines["single"]["step_time"] / best)

    # the lower bound is the calibrated simulator's on the same cluster (nothing executed)
    cluster = clusters.load(cluster_name)
    graph = zoo.build(
        "gpt2", max_groups=16, n_layer=2, d_model=64, n_head=2, vocab=512, seq=32, batch=4
    )
    sim = Simulator(graph, cluster, microbatches=2, schedule="1f1b")
    assert result["lower_bound"] == pytest.approx(sim.lower_bound()) and sim.lower_bound() > 0

    # the plan names its model and its calibrated cluster; the hash is that cluster's
    plan = Plan.load(train_dir / "best_plan.json")
    assert plan.meta["cluster"] == cluster_name and plan.meta["model"]["name"] == "gpt2"
    assert plan.cluster_hash == cluster.content_hash() != clusters.load("cpu_2").content_hash()
    assert (plan.microbatches, plan.schedule) == (2, "1f1b")
    measured = json.loads((train_dir / "best_plan_measured.json").read_text())
    assert measured["plan_hash"] == plan_hash(plan) and measured["step_time"] == pytest.approx(best)
    assert len(measured["peak_memory"]) == measured["world_size"]
    assert all(0 < m < 3 * 2**30 for m in measured["peak_memory"])  # under the per-process cap
    note = (train_dir / "best_plan_timeline.txt").read_text()
    assert note.count("\n") == 1 and "no timeline" in note

    # ---- execute the plan train wrote, as the README shows
    exec_dir = tmp_path / "execute"
    out = run(
        [
            "runners.execute",
            f"plan={train_dir / 'best_plan.json'}",
            "steps=1",
            "warmup=0",
            f"output_dir={exec_dir}",
        ],
        timeout=300,
    )
    last = out.strip().splitlines()[-1]
    devices = sorted({int(d) for d in plan.placement})
    assert f"plan on {len(devices)} processes: step " in last and "result.json" in last
    ex = json.loads((exec_dir / "result.json").read_text())
    assert ex["plan_hash"] == plan_hash(plan) and ex["devices"] == devices
    assert ex["step_time"] > 0 and math.isfinite(ex["loss"])
    print(f"journey: {time.perf_counter() - t0:.1f} s")
