"""``python -m runners.plan [policy=PATH] +env=NAME [logger=NAME]``: zero-shot planning with an exported policy.

Without ``policy=`` the shipped pretrained generalist plans (``agents/pretrained/``).

Writes ``plan.json`` (with its Gantt PNG and Chrome trace) and ``result.json`` (simulated
step time, lower bound, OOM flag, planning seconds) into the hydra run directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from runners import common, schema

schema.register()


#: result.json's figures that go to the logger's summary
SUMMARY_KEYS = (
    "step_time", "lower_bound", "oom", "planning_seconds", "oracle_calls", "samples",
    "devices_used",
)  # fmt: skip


def plan(cfg: DictConfig, run_dir: Path, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Plan ``cfg.env``'s problem with the policy file ``cfg.policy``; return result.json's dict."""
    import agents
    from agents.export import resolve_policy

    policy_path = resolve_policy(cfg.policy)
    if not policy_path.exists():
        from runners.earlier_run import hint

        raise ValueError(
            f"policy={policy_path}: no such file"
            + (
                hint(policy_path)
                or " (expected a file from export_policy, or 'generalist' for the shipped policy)"
            )
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    common.seed_everything(int(cfg.seed))
    spec = common.env_spec(cfg.env)
    if spec.env_id == common.HYBRID_ENV_ID:  # refuse before building a 1,000-GPU problem
        raise ValueError(
            f"env {spec.name!r} poses hybrid-parallel problems (data x tensor x pipeline "
            "layouts); runners.plan places operators with a graph policy. Plan it with "
            f"python -m runners.train +env={spec.name} agent=megatron_grid (or alpa, "
            "hybrid_anneal, pipedream, ppo)"
        )
    # env options runners.plan does not use were ignored without a word (found by fuzzing)
    if spec.env_kwargs:
        raise ValueError(
            f"runners.plan plans with the policy's own env options, so it does not use "
            f"env.env_kwargs {dict(spec.env_kwargs)}; leave them out (they are for "
            "runners.train)"
        )
    from runners.train import check_env_kwargs

    check_env_kwargs(spec.env_id, {})  # an env.env_id that is no devplace env
    problem = common.build_problem(spec)
    if spec.generator != "fixed":  # the generator was ignored without a word (fuzzing)
        echo(
            f"{spec.name}: env.generator={spec.generator!r} samples training problems for "
            f"runners.train; runners.plan plans the env's own problem, {problem.graph.meta.get('name', '?')} "
            f"on {problem.cluster.name}"
        )
    policy = agents.load_policy(policy_path)
    oracle = problem.oracle()
    samples = int(cfg.samples) if cfg.samples is not None else policy.default_samples()
    if spec.oracle != "simulator":  # every distinct sample is a measured run, not a simulation
        echo(
            f"{spec.name}: the {spec.oracle} oracle executes each distinct placement it scores: up "
            f"to {samples} measured run(s); samples=K scores fewer"
        )
    t0 = time.perf_counter()
    the_plan = policy.plan(
        problem.graph,
        problem.cluster,
        microbatches=spec.microbatches,
        schedule=spec.schedule,
        greedy=bool(cfg.greedy),
        samples=samples,
        oracle=oracle,
        seed=int(cfg.seed),
        temperature=cfg.temperature,
        link_exponent=cfg.link_exponent,
        progress=bool(cfg.progress),
    )
    seconds = time.perf_counter() - t0
    # the plan file carries what runners.execute needs (model, cluster, env)
    the_plan = problem.plan(the_plan.placement, **the_plan.meta, policy=str(policy_path))
    res = common.write_plan_artifacts(problem, the_plan, run_dir, stem="plan")
    result = {
        "env": spec.name,
        "policy": str(policy_path),
        **common.policy_digest(policy_path),
        "step_time": float(res.step_time),
        "lower_bound": float(res.lower_bound),
        "oom": bool(res.oom),
        "planning_seconds": seconds,
        "oracle_calls": int(oracle.calls),
        "samples": samples,
        "seed": int(cfg.seed),  # runners.evaluate averages plan seeds like training seeds
        "greedy": bool(cfg.greedy),
        "decode": the_plan.meta.get("decode"),
        "penalty": the_plan.meta.get("penalty"),
        "temperature": the_plan.meta.get("temperature"),
        "link_exponent": the_plan.meta.get("link_exponent"),
        "devices_used": the_plan.num_devices_used,
        "problem": common.problem_identity(problem),
    }
    common.write_json(run_dir / "result.json", result)
    _log(cfg, run_dir, result, name=f"{spec.name}-plan-s{int(cfg.seed)}")
    echo(
        f"{spec.name}: zero-shot plan {common.ms(result['step_time'])}"
        f"{' (OOM)' if result['oom'] else ''} | lower bound {common.ms(result['lower_bound'])} | "
        f"{result['devices_used']} devices used | planned in {seconds:.2f} s "
        f"({result['samples']} sample(s), {result['oracle_calls']} oracle calls) | {run_dir}"
    )
    return result


def _log(cfg: DictConfig, run_dir: Path, result: dict[str, Any], *, name: str) -> None:
    """Send the result, the Gantt chart and the plan file to ``cfg.logger`` (``none``:
    nothing; result.json and the plots are written regardless)."""
    from runners.tracking import make_tracker

    plain = common.to_plain(cfg)
    tracker = make_tracker(cfg.logger.kind, run_dir, plain, name=name, options=plain["logger"])
    try:
        tracker.summary({k: result[k] for k in SUMMARY_KEYS})
        gantt = run_dir / "plan_gantt.png"
        if gantt.exists():
            tracker.log_image("plots/gantt", gantt)
        tracker.log_artifact(run_dir / "plan.json", f"plan-{result['env']}", "plan")
    finally:
        tracker.finish()


@hydra.main(version_base=None, config_path="../conf", config_name="plan")
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = common.run_dir_from_hydra(cfg.get("output_dir"))
    common.require_env(cfg, "plan", run_dir)
    with common.reported_errors(run_dir, "plan"):
        plan(cfg, run_dir, echo=common.RunLog(run_dir, "plan"))


def main() -> None:
    """Entry point: check the command-line keys against the schema, then run hydra."""
    schema.run_checked(schema.PlanConfig, _hydra_main)


if __name__ == "__main__":
    main()
