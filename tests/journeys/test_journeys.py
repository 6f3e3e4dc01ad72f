"""The README's journeys, run as a user would: the real CLIs, tiny budgets, each step reading
what the previous one wrote.

- train a policy on a model of one's own (by import path) -> execute its best plan ->
  plan *another* model on *another* cluster zero-shot with the exported policy -> execute
  that plan -> compare the runs with ``runners.evaluate runs=[...]``;
- train the generalist (synthetic graphs, ``+experiment=generalist``) -> plan a zoo model;
- fine-tune the shipped generalist on one env (``agent=chain_finetune``) -> plan another
  env with the fine-tuned ``policy.pt``;
- a 2-job sweep -> compare;
- train PPO on hybrid layouts (``Hybrid-v0``) -> execute its best plan -> compare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphs.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
TINY_PPO = ["agent.ppo.n_steps=16", "agent.ppo.batch_size=16", "train.progress=false"]


def cli(*args: str, timeout: float = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` from the repository root, as the README runs it (or from ``cwd``,
    the repository on ``PYTHONPATH``); must succeed."""
    env = {**os.environ, "WANDB_MODE": "offline", "MPLBACKEND": "Agg"}
    if cwd != ROOT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    p = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, f"{' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def last_line(p: subprocess.CompletedProcess[str]) -> str:
    return p.stdout.strip().splitlines()[-1]


def test_own_model_train_execute_plan_elsewhere_execute_evaluate(tmp_path: Path) -> None:
    train_dir, plan_dir = tmp_path / "train", tmp_path / "plan"
    work = tmp_path / "cwd"  # a directory of its own: other tests' runs land in ROOT/outputs
    work.mkdir()
    # 1. train on a model of one's own, named by import path (examples/my_model.py)
    p = cli(
        "runners.train", "+env=my_model", "logger=none", f"output_dir={train_dir}",
        "train.timesteps=32", "env.baselines=[single,metis]", *TINY_PPO, cwd=work,
    )  # fmt: skip
    assert last_line(p).startswith("my_model ppo seed=0: best ")
    result = json.loads((train_dir / "result.json").read_text())
    best = Plan.load(train_dir / "best_plan.json")
    assert best.meta["model"]["factory"] == "examples.my_model:build"
    assert best.meta["cluster"] == "cpu_2" and best.microbatches == 2
    assert result["best_step_time"] <= min(result["baselines"].values()) + 1e-12
    assert "my_model ppo seed=0: best" in (train_dir / "train.log").read_text()
    made = sorted(work.rglob("*"))
    assert not made, f"output_dir=PATH must not create a second run folder: {made}"

    # 2. execute the best plan on this machine's CPU processes
    p = cli("runners.execute", f"plan={train_dir / 'best_plan.json'}", f"output_dir={tmp_path / 'ex1'}",
            "steps=1", "warmup=0")  # fmt: skip
    measured = json.loads((tmp_path / "ex1" / "result.json").read_text())
    assert measured["step_time"] > 0 and measured["world_size"] == best.num_devices_used

    # 3. the exported policy plans another model (GPT-2) on another cluster (4 processes)
    p = cli(
        "runners.plan", f"policy={train_dir / 'policy.pt'}", "+env=gpt2_tiny_cpu4",
        f"output_dir={plan_dir}", "samples=2",
    )  # fmt: skip
    assert "zero-shot plan" in last_line(p) and "2 sample(s)" in last_line(p)
    assert "2/2" in p.stderr  # the progress bar over what it scored (progress=false: none)
    zs = json.loads((plan_dir / "result.json").read_text())
    assert zs["env"] == "gpt2_tiny_cpu4" and not zs["oom"] and zs["oracle_calls"] >= 1
    plan = Plan.load(plan_dir / "plan.json")
    assert plan.meta["model"]["name"] == "gpt2" and plan.meta["cluster"] == "cpu_4"

    # 4. execute the zero-shot plan
    cli("runners.execute", f"plan={plan_dir / 'plan.json'}", f"output_dir={tmp_path / 'ex2'}",
        "steps=1", "warmup=0")  # fmt: skip
    measured = json.loads((tmp_path / "ex2" / "result.json").read_text())
    assert measured["step_time"] > 0 and measured["world_size"] == plan.num_devices_used

    # 5. compare the runs
    p = cli("runners.evaluate", f"runs=[{train_dir},{plan_dir}]", f"output_dir={tmp_path / 'cmp'}")
    table = (tmp_path / "cmp" / "results.md").read_text()
    assert "| my_model | ppo |" in table and "| gpt2_tiny_cpu4 | plan:train |" in table
    assert (tmp_path / "cmp" / "results.png").stat().st_size > 0


@pytest.mark.slow
def test_hybrid_ppo_train_execute_evaluate(tmp_path: Path) -> None:
    """PPO on Hybrid-v0 (the hybrid default experiment's env, a 2-block GPT-2 on 4 CPU
    processes) writes a layout plan that ``runners.execute`` runs and ``evaluate`` tables."""
    train_dir = tmp_path / "train"
    p = cli(
        "runners.train", "+env=gpt2_8gpu_hybrid", "env.model=gpt2",
        "+env.model_config={n_layer: 2, d_model: 64, n_head: 2, vocab: 512, seq: 32, batch: 4}",
        "env.max_groups=24", "env.cluster=cpu_4", "env.baselines=[megatron_grid]", "agent=ppo",
        "logger=none", f"output_dir={train_dir}", "train.timesteps=16", *TINY_PPO,
    )  # fmt: skip
    assert last_line(p).startswith("gpt2_8gpu_hybrid ppo seed=0: best ")
    result = json.loads((train_dir / "result.json").read_text())
    best = Plan.load(train_dir / "best_plan.json")
    assert best.layout is not None and best.layout.to_dict() == result["layout"]
    assert best.meta["algorithm"] == "ppo" and best.meta["cluster"] == "cpu_4"

    cli("runners.execute", f"plan={train_dir / 'best_plan.json'}", f"output_dir={tmp_path / 'ex'}",
        "steps=1", "warmup=0")  # fmt: skip
    measured = json.loads((tmp_path / "ex" / "result.json").read_text())
    assert measured["mode"] == "hybrid" and measured["world_size"] == 4
    assert measured["step_time"] > 0

    cli("runners.evaluate", f"runs=[{train_dir}]", f"output_dir={tmp_path / 'cmp'}")
    assert "| gpt2_8gpu_hybrid | ppo |" in (tmp_path / "cmp" / "results.md").read_text()


def test_generalist_training_then_planning_a_zoo_model(tmp_path: Path) -> None:
    gen_dir = tmp_path / "generalist"
    p = cli(
        "runners.train", "+experiment=generalist", "logger=none", f"output_dir={gen_dir}",
        "train.timesteps=32", "env.baselines=[metis]", "env.generator_options.max_ops=40",
        *TINY_PPO,
    )  # fmt: skip
    assert last_line(p).startswith("synthetic gdp seed=0: best ")
    result = json.loads((gen_dir / "result.json").read_text())
    assert result["meta"]["best_from"] == "zero_shot" and not result["oom"]
    p = cli("runners.plan", f"policy={gen_dir / 'policy.pt'}", "+env=gpt2_tiny_cpu4",
            f"output_dir={tmp_path / 'plan'}")  # fmt: skip
    assert "zero-shot plan" in last_line(p)
    assert Plan.load(tmp_path / "plan" / "plan.json").placement.shape[0] > 0


def test_chain_finetune_the_generalist_then_plan_with_it(tmp_path: Path) -> None:
    ft = tmp_path / "ft"
    p = cli(
        "runners.train", "+env=gpt2_tiny_cpu4", "agent=chain_finetune", "agent.budget=48",
        "+agent.options.first_samples=16", "+agent.options.samples=8", "logger=none",
        "env.baselines=[metis]", "train.progress=false", f"output_dir={ft}",
    )  # fmt: skip
    assert last_line(p).startswith("gpt2_tiny_cpu4 chain_finetune seed=0: best ")
    result = json.loads((ft / "result.json").read_text())
    assert result["meta"]["init_policy"] == "generalist" and result["oracle_calls"] <= 48
    assert result["best_step_time"] <= result["meta"]["zero_shot_step_time"]
    p = cli("runners.plan", f"policy={ft / 'policy.pt'}", "+env=rnnlm_k40_4",
            f"output_dir={tmp_path / 'plan'}", "samples=8")  # fmt: skip
    assert "zero-shot plan" in last_line(p)
    assert Plan.load(tmp_path / "plan" / "plan.json").placement.shape[0] > 0


def test_sweep_then_compare(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cli("runners.train", "-m", "+env=my_model", "agent=metis,expert", "logger=none",
        f"hydra.sweep.dir={sweep}")  # fmt: skip
    p = cli("runners.evaluate", f"runs=[{sweep}]", f"output_dir={tmp_path / 'cmp'}")
    assert "2 runs" in last_line(p)
    table = (tmp_path / "cmp" / "results.md").read_text()
    assert "| my_model | metis |" in table and "| my_model | expert |" in table


def test_a_sweep_over_a_setting_and_seeds_then_compare(tmp_path: Path) -> None:
    """A hyperparameter sweep with seeds, then its comparison: one row per value, averaged
    over the seeds (it was refused as "two runs of one seed", 4 Dec 2026)."""
    sweep = tmp_path / "sweep"
    cli("runners.train", "-m", "+env=my_model", "agent=anneal", "agent.budget=4,16",
        "seed=0,1", "env.baselines=[]", "logger=none", f"hydra.sweep.dir={sweep}")  # fmt: skip
    p = cli("runners.evaluate", f"runs=[{sweep}]", f"output_dir={tmp_path / 'cmp'}")
    assert "4 runs" in last_line(p)
    table = (tmp_path / "cmp" / "results.md").read_text()
    for budget in (4, 16):
        row = next(ln for ln in table.splitlines() if f"anneal[agent.budget={budget}]" in ln)
        assert row.startswith(f"| my_model | anneal[agent.budget={budget}] | ") and "| 2/2 |" in row


@pytest.mark.parametrize(
    "args,message",
    [
        (["runners.execute", "plan=does/not/exist.json"], "plan=does/not/exist.json: no such file"),
        (
            ["runners.train", "+env=rnnlm_k40_2", "agent=anneal", "+agent.options.t_0=0.5",
             "logger=none"],
            "baseline 'anneal' has no option(s) ['t_0']",
        ),
    ],
)  # fmt: skip
def test_a_failing_command_says_why_in_one_line(tmp_path: Path, args: list[str], message: str):
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline"}
    p = subprocess.run(
        [sys.executable, "-m", *args, f"output_dir={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == f"error: {message}" or message in p.stderr
    assert "Traceback" not in p.stderr
    assert message in (out / "error.txt").read_text()


@pytest.mark.parametrize(
    "option, message",
    [
        ("+agent.options.elite=0", "chain_finetune: elite must be an integer >= 1, got 0"),
        ("+agent.options.elites=4", "unknown option(s) ['elites'] for chain fine-tuning"),
        ("agent.init_policy=no/such.pt", "no/such.pt: not a loadable policy file (no such file)"),
    ],
)
def test_a_bad_finetune_option_is_refused_before_the_baselines_run(
    tmp_path: Path, option: str, message: str
) -> None:
    # it was refused after the env's baselines had run (minutes on a large env)
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "runners.train", "+env=bert_8gpu", "agent=chain_finetune", option,
         "logger=none", f"output_dir={out}"],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1] == f"error: agent 'chain_finetune': {message}" or (
        message in p.stderr.strip().splitlines()[-1]
    )
    assert "baseline " not in p.stdout and not (out / "baselines.json").exists()


def test_exact_planner_reports_its_proof_then_its_plan_executes(tmp_path: Path) -> None:
    # an exact planner from the CLI: what it proved (ideal_dp's status, exactness, table limit)
    # is in result.json and in best_plan.json, and that plan runs on this machine
    train_dir = tmp_path / "dp"
    p = cli(
        "runners.train", "+env=my_model", "agent=ideal_dp", "+agent.options.max_ideals=1000",
        "env.baselines=[single]", "logger=none", f"output_dir={train_dir}",
    )  # fmt: skip
    assert last_line(p).startswith("my_model ideal_dp seed=0: best ")
    # ... and says so before its summary line, after announcing its time limit
    assert "ideal_dp: planning (time limit 60 s) ..." in p.stdout
    assert "ideal_dp: max_load " in p.stdout and "; exact among contiguous splits" in p.stdout
    result = json.loads((train_dir / "result.json").read_text())
    report = result["meta"]["planner"]
    assert report["algorithm"] == "ideal_dp" and report["objective"] == "max_load"
    assert report["status"] == "done" and report["exact"] is True
    assert report["optimal_among"] == "contiguous splits"
    assert report["ideal_limit"] <= 1000 and report["transfer_cut"] is True
    assert "env" not in report and "model" not in report  # provenance stays in the plan's meta
    best = Plan.load(train_dir / "best_plan.json")
    assert best.meta["planner"] == report
    assert best.meta["model"]["factory"] == "examples.my_model:build"
    assert result["best_step_time"] <= result["baselines"]["single"] + 1e-12
    # a command into the same folder refused by the planner's own check of an option value
    # removed this run's result and plan first (fuzzing, 2 Dec 2026); now it leaves them
    files = {f.name: f.read_bytes() for f in train_dir.iterdir() if f.suffix in (".json", ".yaml")}
    refused = subprocess.run(
        [sys.executable, "-m", "runners.train", "+env=my_model", "agent=ideal_dp",
         "+agent.options.time_limit=-1", "logger=none", f"output_dir={train_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].startswith("error: ideal_dp: time_limit must")
    now = {f.name: f.read_bytes() for f in train_dir.iterdir() if f.suffix in (".json", ".yaml")}
    assert now == files and "best_plan.json" in now
    cli("runners.execute", f"plan={train_dir / 'best_plan.json'}", f"output_dir={tmp_path / 'ex'}",
        "steps=1", "warmup=0")  # fmt: skip
    measured = json.loads((tmp_path / "ex" / "result.json").read_text())
    assert measured["step_time"] > 0 and measured["world_size"] == best.num_devices_used


def test_planning_for_the_op_level_runtimes_order_then_executing(tmp_path: Path) -> None:
    # env.schedule=in_order scores plans in the order the op-level runtime runs them (the
    # schedule docs/fidelity.md validates); the plan carries it and runs op by op
    p = cli(
        "runners.train", "+env=gpt2_tiny_cpu4", "env.schedule=in_order", "agent=ideal_dp",
        "env.baselines=[single]", "logger=none", f"output_dir={tmp_path / 'tr'}",
    )  # fmt: skip
    assert "in_order" in p.stdout.splitlines()[0]
    best = Plan.load(tmp_path / "tr" / "best_plan.json")
    assert best.schedule == "in_order" and best.num_devices_used >= 2
    cli("runners.execute", f"plan={tmp_path / 'tr' / 'best_plan.json'}",
        f"output_dir={tmp_path / 'ex'}", "steps=1", "warmup=0")  # fmt: skip
    measured = json.loads((tmp_path / "ex" / "result.json").read_text())
    assert measured["mode"] == "oplevel" and measured["world_size"] == best.num_devices_used
