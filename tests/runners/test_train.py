"""runners.train end to end: the real entry point, sweeps, wandb offline, resume of a killed run."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runners import checkpoint, common
from runners.train import CrashForTest, summary_line, train
from tests.runners.conftest import compose, run_cli_module, small_env

ROOT = Path(__file__).resolve().parents[2]


def _run(
    args: list[str], tmp: Path, timeout: int = 240, umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "MPLBACKEND": "Agg",
        "HYDRA_FULL_ERROR": "1",
        "PYTHONPATH": str(ROOT),
    }
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )


def _finite_numbers(x: object) -> bool:
    if isinstance(x, dict):
        return all(_finite_numbers(v) for v in x.values())
    if isinstance(x, float):
        return math.isfinite(x)
    return True


@pytest.mark.timeout(300)
def test_entry_point_smoke(graph_file: Path, tmp_path: Path) -> None:
    """`python -m runners.train` with PPO, a tiny budget and offline wandb writes every file."""
    run_dir = tmp_path / "run"
    args = [a for a in small_env(graph_file) if a != "logger=none"]
    p = _run(
        [
            "runners.train",
            *args,
            "logger=wandb",
            "train.timesteps=200",  # PPO trains whole rollouts: 256 steps
            "agent.ppo.n_steps=64",
            f"hydra.run.dir={run_dir}",
        ],
        tmp_path,
        umask=0o022,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    for name in (
        "result.json",
        "best_plan.json",
        "best_plan_gantt.png",
        "best_plan_trace.json",
        "policy.pt",
        "config.yaml",
        ".hydra/config.yaml",
    ):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run"
    # every file the run wrote has the mode open() gives under the umask (atomic writes
    # through mkstemp made result.json, config.yaml and the checkpoint files 0600)
    modes = {
        str(f.relative_to(run_dir)): oct(f.stat().st_mode & 0o777)
        for f in run_dir.rglob("*")
        if f.is_file() and "wandb" not in f.parts
    }
    assert set(modes.values()) == {"0o644"}, modes
    res = json.loads((run_dir / "result.json").read_text())
    for key in ("best_step_time", "lower_bound", "oracle_calls", "wall_seconds"):
        assert isinstance(res[key], (int, float)) and math.isfinite(res[key]), key
    assert res["oom"] is False and res["oracle_calls"] > 0
    # it trained 256 steps without a word (fuzzing, 2 Dec 2026)
    assert (
        res["timesteps"] == 256
        and "trained 256 timesteps: train.timesteps=200 rounded up" in p.stdout
    )
    assert 0 < res["lower_bound"] <= res["best_step_time"]
    assert set(res["baselines"]) == {"single", "expert"}
    assert res["baselines"]["single"] is None  # 24 GB of state does not fit one 12 GB K40
    assert res["speedup_vs"]["expert"] == pytest.approx(
        res["baselines"]["expert"] / res["best_step_time"]
    )
    assert _finite_numbers(res["speedup_vs"])
    trace = json.loads((run_dir / "best_plan_trace.json").read_text())
    assert trace["traceEvents"]
    last = p.stdout.strip().splitlines()[-1]
    assert last == summary_line(res, run_dir)
    # the policy file records the steps trained, as result.json does (it held the budget)
    from agents import load_policy

    assert load_policy(run_dir / "policy.pt").meta["timesteps"] == res["timesteps"] > 200


def test_no_env_lists_envs(tmp_path: Path) -> None:
    p = _run(["runners.train", f"hydra.run.dir={tmp_path}"], tmp_path, timeout=120)
    assert p.returncode == 2
    assert "+env=" in p.stderr and "gpt2_8gpu" in p.stderr and "rnnlm_k40_2" in p.stderr


def test_env_no_placement_fits_stops_in_one_line(tmp_path: Path) -> None:
    """Mixtral-8x7B at its full 32 layers on 8 A100-80GB: before any baseline runs, one
    error line with the sizes, exit 2, error.txt in the run folder."""
    run = tmp_path / "run"
    p = _run(
        ["runners.train", "+env=moe_a100_8", "env.model_config.n_layer=32", "logger=none",
         f"output_dir={run}"],
        tmp_path, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.startswith("error: env 'moe_a100_8': no placement can fit: 'mixtral' needs")
    assert "baseline" not in p.stdout
    assert "no placement can fit" in (run / "error.txt").read_text()


def test_bad_key_names_valid_keys(tmp_path: Path) -> None:
    p = _run(["runners.train", "+env=gpt2_8gpu", "train.step=3"], tmp_path, timeout=120)
    assert p.returncode == 2
    assert "'step'" in p.stderr and "'timesteps'" in p.stderr


@pytest.mark.timeout(300)
def test_multirun_sweep_one_dir_per_combination(graph_file: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    p = _run(
        [
            "runners.train",
            "-m",
            *small_env(graph_file),
            "env.baselines=[]",
            "agent=expert,round_robin",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    results = sorted(sweep.glob("*/result.json"))
    assert len(results) == 4
    combos = {(r["agent"], r["seed"]) for r in (json.loads(f.read_text()) for f in results)}
    assert combos == {("expert", 0), ("expert", 1), ("round_robin", 0), ("round_robin", 1)}


def _final_state(run_dir: Path) -> tuple[dict, dict]:
    res = json.loads((run_dir / "result.json").read_text())
    res.pop("wall_seconds")
    # the curve's third column is wall time: it may differ, everything else must not
    curve = res.get("meta", {}).get("curve", [])
    assert all(p[2] >= 0 for p in curve)
    for p in curve:
        p[2] = None
    weights = torch.load(run_dir / "policy.pt", weights_only=True)
    return res, weights


@pytest.mark.timeout(300)
def test_resume_killed_run_matches_uninterrupted(graph_file: Path, tmp_path: Path) -> None:
    """Kill a PPO run after 2 updates, resume it: same result and policy as one run straight."""
    ov = [
        *small_env(graph_file),
        "env.baselines=[expert]",
        "train.timesteps=512",
        "train.checkpoint_every=1",
        "agent.ppo.n_steps=64",
        "seed=3",
    ]
    quiet = lambda s: None  # noqa: E731
    train(compose(ov), tmp_path / "straight", echo=quiet)
    killed = tmp_path / "killed"
    with pytest.raises(CrashForTest):
        train(compose([*ov, "train.crash_after_updates=2"]), killed, echo=quiet)
    assert checkpoint.exists(killed) and not (killed / "result.json").exists()
    assert checkpoint.load(killed)["model"]  # a complete file, not a partial write
    assert not list(killed.glob(".checkpoint.pkl.*")), "temporary checkpoint left behind"
    train(compose(["+env=rnnlm_k40_2", f"resume={killed}"]), tmp_path / "ignored", echo=quiet)

    # wall_seconds counts both sessions of the killed run, as wall_clock.json recorded them
    sessions = json.loads((killed / checkpoint.WALL_CLOCK).read_text())["sessions"]
    wall = json.loads((killed / "result.json").read_text())["wall_seconds"]
    assert len(sessions) == 2 and wall >= sum(b - a for a, b in sessions) - 0.5
    assert not (tmp_path / "ignored").exists()
    a_res, a_w = _final_state(tmp_path / "straight")
    b_res, b_w = _final_state(killed)
    assert a_res == b_res
    assert a_res["timesteps"] == 512 and a_res["history"]
    sa, sb = a_w["state_dict"], b_w["state_dict"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_an_env_option_the_env_does_not_take_is_refused(graph_file: Path, tmp_path: Path) -> None:
    """``+env.env_kwargs={max_steps: 0}`` on Sweep-v0: one error naming the key and the valid
    options (it was a TypeError traceback from inside the vectorised env)."""
    cfg = compose([*small_env(graph_file), "train.timesteps=8", "+env.env_kwargs={max_steps: 0}"])
    with pytest.raises(ValueError, match=r"Sweep-v0 takes no option\(s\) \['max_steps'\]; valid"):
        train(cfg, tmp_path / "run", echo=lambda s: None)


def test_an_env_id_that_is_no_devplace_env_is_refused(graph_file: Path, tmp_path: Path) -> None:
    """Found by fuzzing: gymnasium's NameNotFound came with a traceback."""
    cfg = compose([*small_env(graph_file), "train.timesteps=8", "env.env_id=placement_env/Nope-v0"])
    with pytest.raises(
        ValueError,
        match=r"env.env_id 'placement_env/Nope-v0' is not a devplace env; valid: \[.*Sweep-v0",
    ):
        train(cfg, tmp_path / "run", echo=lambda s: None)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["env.oracle=profiled", "+env.oracle_options.bogus=1"],
         r"env.oracle_options \['bogus'\] are not options of the profiled oracle; valid: .*'steps'"),
        (["env.generator=synthetic", "+env.generator_options.bogus=1"],
         r"generator 'synthetic' takes no option\(s\) \['bogus'\]; valid: .*'min_ops'"),
        # the sampler's names overrode graph_kind / min_ops without a word (fuzzing)
        (["env.generator=synthetic", "+env.generator_options.kind=nasnet"],
         r"env.generator_options.kind = 'nasnet': the generator is env.generator .* graph_kind"),
        (["env.generator=synthetic", "+env.generator_options.min_nodes=25"],
         r"generator 'synthetic' takes no option\(s\) \['min_nodes'\]; valid: .*'min_ops'"),
        # the runtime sets these from the plan: the value collided with it at the first run
        (["env.oracle=profiled", "+env.oracle_options.mode=tp"],
         r"env.oracle_options \['mode'\] are not options of the profiled oracle"),
        # bad values: named as RunSpec's fields at the first plan scored, after the baselines
        (["env.oracle=profiled", "+env.oracle_options.steps=0"],
         r"env.oracle_options \{'steps': 0\}: RunSpec: steps must be an integer >= 1"),
        # PPO ignored both without a word
        (["agent=ppo", "+agent.options.x=1"], r"agent 'ppo' \(PPO\) takes no agent.options"),
        (["agent=placeto", "agent.budget=5"],
         r"takes no agent.options \(\{\}\) or agent.budget \(5\): its budget is train"),
        (["env.oracle=profiled", "+env.oracle_options.steps=2.5"],
         r"env.oracle_options.steps = 2.5; expected an integer"),
        (["env.oracle=profiled", "+env.oracle_options.predict_oom=maybe"],
         r"env.oracle_options.predict_oom = 'maybe'; expected true or false"),
        (["env.oracle=profiled", "+env.oracle_options.cache_dir=123"],
         r"env.oracle_options.cache_dir = 123; expected a folder path or null"),
        (["env.oracle=profiled", "+env.oracle_options.threads=0"],
         r"env.oracle_options \{'threads': 0\}: RunSpec.threads 0: expected an integer >= 1"),
        # an unknown cluster: blamed on env.env_kwargs at PPO's first episode
        (["env.generator=synthetic", "+env.generator_options.clusters=[cpu_2,nope]"],
         r"env.generator='synthetic' / env.generator_options: generator 'synthetic': "
         r"clusters\[1\] \('nope'\): unknown cluster 'nope'; available: "),
        (["env.generator=zoo", "+env.generator_options.models=[gpt2]",
          "+env.generator_options.clusters=[nope]"],
         r"generator 'zoo': clusters\[0\] \('nope'\): unknown cluster"),
        (["env.generator=bogus", "+env.generator_options.clusters=[cpu_2]"],
         r"env.generator='bogus' / env.generator_options: unknown generator kind 'bogus'"),
        # round 3 of fuzzing: each failed after the baselines, named env.env_kwargs or the
        # sampler's min_nodes, or split a cluster name into letters
        (["env.generator=zoo", "+env.generator_options.models=[nosuch]",
          "+env.generator_options.clusters=[k40_2]"],
         r"env.generator='zoo' / env.generator_options: graphs.zoo: unknown model 'nosuch'"),
        (["env.generator=synthetic", "+env.generator_options.min_ops=1"],
         r"generator 'synthetic': min_ops must be an integer >= 2, got 1"),
        (["env.generator=synthetic", "+env.generator_options.max_nodes=0"],
         r"generator 'synthetic': max_nodes must be an integer >= 1, got 0"),
        (["env.generator=synthetic", "+env.generator_options.clusters=k40_2"],
         r"generator 'synthetic': clusters must be a list of cluster names or objects, got 'k40_2'"),
    ],
)  # fmt: skip
def test_unknown_oracle_and_generator_options_are_refused(
    tmp_path, overrides, says, monkeypatch
) -> None:
    """Found by fuzzing: TypeErrors with a traceback (RunSpec, sample()), or errors naming
    the wrong key after every baseline had run; now refused before any baseline."""
    from runners import common

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    cfg = compose(["+env=gpt2_tiny_cpu4", "train.timesteps=8", "logger=none", *overrides])
    with pytest.raises(ValueError, match=says):
        train(cfg, tmp_path / "run", echo=lambda s: None)


def test_env_options_are_checked_before_the_baselines_and_for_every_agent(
    graph_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """A misspelt env.env_kwargs key was refused only after every baseline had run (minutes on
    a profiled env), and never with a baseline agent; a bad value (oom_penalty=abc) was a
    TypeError from inside gymnasium."""
    from runners import common

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    for agent in ("agent=metis", "agent=ppo"):
        cfg = compose([*small_env(graph_file), agent, "env.baselines=[expert]",
                       "+env.env_kwargs={max_steps: 3}"])  # fmt: skip
        with pytest.raises(ValueError, match=r"takes no option\(s\) \['max_steps'\]"):
            train(cfg, tmp_path / agent, echo=lambda s: None)
    monkeypatch.undo()
    cfg = compose([*small_env(graph_file), "env.baselines=[]", "train.timesteps=8",
                   "+env.env_kwargs={oom_penalty: abc}"])  # fmt: skip
    with pytest.raises(ValueError, match=r"env.env_kwargs: .*Sweep-v0 refused the options "
                       r"\{'oom_penalty': 'abc'\}: oom_penalty must be finite and >= 0, "
                       r"got 'abc'") as exc:  # fmt: skip
        train(cfg, tmp_path / "value", echo=lambda s: None)
    assert "raised from the environment creator" not in str(exc.value)


def test_a_new_run_in_a_used_folder_does_not_count_the_old_runs_time(
    graph_file: Path, tmp_path: Path
) -> None:
    """wall_seconds of a run that is not a resume counts that run only, even where an earlier
    run's wall_clock.json lies (scripts rerun into the same folders: their times used to add
    up run after run)."""
    ov = [*small_env(graph_file), "env.baselines=[]", "agent=random", "agent.budget=20"]
    run = tmp_path / "run"
    run.mkdir()
    (run / checkpoint.WALL_CLOCK).write_text(json.dumps({"sessions": [[0.0, 1000.0]]}))
    res = train(compose(ov), run, echo=lambda s: None)
    assert res["wall_seconds"] < 100
    sessions = json.loads((run / checkpoint.WALL_CLOCK).read_text())["sessions"]
    assert len(sessions) == 1


# ----------------------------------------------------- what an exact planner proved
def test_planner_report_lines_by_hand() -> None:
    from runners.common import planner_report, planner_time_limit

    ilp = {"objective": "max_load", "ilp_objective": 0.03435, "ilp_bound": 0.02662,
           "mip_gap": 0.2249, "ilp_status": "Time limit reached", "ilp_seconds": 60.04}  # fmt: skip
    assert planner_report("ilp", ilp, objective="makespan", step_time=0.06262) == (
        "ilp: max_load 34.35 ms, HiGHS bound 26.62 ms, MIP gap 22.5 % (Time limit reached, "
        "60 s); the env scores makespan: 62.62 ms"
    )
    proven = {**ilp, "ilp_bound": 0.03435, "mip_gap": 0.0, "ilp_status": "Optimal"}
    assert planner_report("ilp", proven, objective="max_load", step_time=0.03435) == (
        "ilp: max_load 34.35 ms, HiGHS bound 34.35 ms, proven optimal (Optimal, 60 s)"
    )
    dp = {"objective": "max_load", "dp_objective": 0.00216, "exact": True,
          "optimal_among": "contiguous splits", "status": "done"}  # fmt: skip
    assert planner_report("ideal_dp", dp, objective="max_load", step_time=0.00216) == (
        "ideal_dp: max_load 2.16 ms; exact among contiguous splits"
    )
    stopped = {**dp, "exact": False, "status": "max_ideals", "dp_lower_bound": 0.00181}
    assert planner_report("ideal_dp", stopped, objective="makespan", step_time=0.003) == (
        "ideal_dp: max_load 2.16 ms; not proven optimal (status max_ideals, lower bound "
        "1.81 ms); the env scores makespan: 3.00 ms"
    )
    # how far the DP got among how many ideals (ideal_dp's meta "ideals", "ideals_total")
    big = {**stopped, "ideals": 2840586, "ideals_total": 1.0135521180778418e36}
    assert planner_report("ideal_dp", big, objective="max_load", step_time=0.0041) == (
        "ideal_dp: max_load 2.16 ms; not proven optimal (status max_ideals, lower bound "
        "1.81 ms, 2,840,586 ideals reached of 1.01e+36)"
    )
    walk = {"objective": "makespan_estimate", "surrogate": "sum_k t_k + (M - 1) * max_k t_k",
            "surrogate_objective": 0.00287, "exact": False, "status": "time_limit",
            "surrogate_lower_bound": 0.0025}  # fmt: skip
    assert planner_report("ideal_dp_makespan", walk, objective="makespan", step_time=0.0031) == (
        "ideal_dp_makespan: pipeline estimate sum_k t_k + (M - 1) * max_k t_k 2.87 ms; not "
        "proven optimal (status time_limit, lower bound 2.50 ms); the env scores makespan: "
        "3.10 ms"
    )
    assert (
        planner_report("metis", {"algorithm": "metis"}, objective="makespan", step_time=1.0) is None
    )
    # the time limit announced before a silent search: the option, else the signature's default
    assert planner_time_limit("ilp") == 60.0 and planner_time_limit("ideal_dp") == 60.0
    assert planner_time_limit("ilp", {"time_limit": 5}) == 5.0
    # a bad value is left to the planner's own refusal (it used to end in float()'s error)
    assert planner_time_limit("ilp", {"time_limit": "abc"}) is None
    assert planner_time_limit("ilp", {"time_limit": [1]}) is None
    assert planner_time_limit("anneal") is None and planner_time_limit("metis") is None


def test_resume_overrides_stay_beside_resume_when_a_flag_follows(tmp_path: Path) -> None:
    # hydra takes the overrides as one run of positional arguments: run_checked's own
    # hydra.run.dir=... used to be appended after any flag and refused as unrecognized
    from runners.schema import with_overrides_beside_resume

    extra = ["hydra.run.dir='/r'", "hydra.output_subdir=null"]
    assert with_overrides_beside_resume(["train", "resume=/r", "--cfg", "job"], extra) == [
        "train", "resume=/r", *extra, "--cfg", "job",
    ]  # fmt: skip
    assert with_overrides_beside_resume(["train", "resume=/r"], extra) == [
        "train", "resume=/r", *extra,
    ]  # fmt: skip
    assert with_overrides_beside_resume(["train", "++resume=/r", "--cfg", "job"], extra) == [
        "train", "++resume=/r", *extra, "--cfg", "job",
    ]  # fmt: skip
    p = subprocess.run(
        [sys.executable, "-m", "runners.train", f"resume={tmp_path}", "--cfg", "job"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "WANDB_MODE": "offline"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "unrecognized arguments" not in p.stderr and "agent:" in p.stdout


def test_resume_refuses_overrides_it_would_ignore_and_keeps_a_finished_run(
    graph_file: Path, tmp_path: Path, monkeypatch
) -> None:
    """resume=DIR used to ignore every other override silently (train.timesteps=3000 ran to
    the saved budget) and to train a finished run again; now the overrides that differ from
    the saved run are refused by name, and a finished run's result is returned as it is."""
    import runners.train as rt
    from runners import common

    run = tmp_path / "run"
    ov = [*small_env(graph_file), "agent=expert", "env.baselines=[]"]
    first = train(compose(ov), run, echo=lambda s: None)
    saved = rt.OmegaConf.load(run / "config.yaml")
    assert rt.ignored_on_resume([f"resume={run}", "train.progress=false"], saved) == []
    # the same values as saved (the env by name, the logger by kind) are no change
    same = ["+env=rnnlm_k40_2", "agent=expert", "logger=none", f"seed={saved.seed}"]
    assert rt.ignored_on_resume(same, saved) == []
    assert rt.ignored_on_resume(["train.timesteps=3000", "agent=metis", "seed=9"], saved) == [
        "train.timesteps=3000", "agent=metis", "seed=9",
    ]  # fmt: skip
    (run / "result.json").rename(run / "kept.json")  # an unfinished run: the check applies
    with pytest.raises(ValueError, match=r"would be ignored: \['train.timesteps=3000'\]"):
        train(
            compose([*ov, f"resume={run}"]), run, echo=lambda s: None,
            overrides=[f"resume={run}", "train.timesteps=3000"],
        )  # fmt: skip
    (run / "kept.json").rename(run / "result.json")
    monkeypatch.setattr(common, "build_problem", lambda *a, **k: pytest.fail("trained again"))
    lines: list[str] = []
    again = train(compose([*ov, f"resume={run}"]), run, echo=lines.append)
    assert (
        again == json.loads((run / "result.json").read_text()) and again["agent"] == first["agent"]
    )
    assert "finished already" in lines[0] and lines[-1] == summary_line(first, run)


@pytest.mark.parametrize(
    "module,args,message",
    [
        ("runners.train", ["+env=gpt2_8gpu", "train.timesteps=-1"], "expected an integer >= 1"),
        ("runners.evaluate", ["seeds=[-1]"], "seeds"),
    ],
)
def test_a_bad_setting_is_refused_before_torch_is_imported(module, args, message, tmp_path):
    """``runners.checkpoint`` imported torch at the top (for the RNG states): every train or
    evaluate run, a refused one included, paid about two seconds for it first."""
    code, torch_imported, err = run_cli_module(module, [*args, f"output_dir={tmp_path}"])
    assert (code, torch_imported) == (2, False), err[-2000:]
    assert message in err


def test_an_interleaved_schedule_on_an_op_env_is_refused_naming_the_key() -> None:
    """Found by fuzzing: the simulator refused it later ("Simulator: unknown schedule
    'interleaved'"), naming no config key; hybrid envs take their layout's schedule."""
    with pytest.raises(ValueError, match="env.schedule 'interleaved' is a hybrid layout's"):
        common.env_spec(compose(["+env=gpt2_tiny_cpu4", "env.schedule=interleaved"]).env)
    hybrid = compose(["+env=gpt2_8gpu_hybrid", "env.schedule=interleaved"]).env
    assert common.env_spec(hybrid).schedule == "interleaved"


def test_a_generator_runs_history_is_of_the_reported_problem(tmp_path: Path) -> None:
    """Training on sampled synthetic graphs recorded their best step times (0.87 ms on a
    small graph) as the history of the reported problem (147 ms), below its own best (found
    by fuzzing, 29 Nov 2026): the history is now the one plan of that problem."""
    ov = ["+env=synthetic", "env.max_groups=16", "env.baselines=[expert]", "train.timesteps=64",
          "agent.ppo.n_steps=32", "agent.ppo.batch_size=32", "env.generator_options.max_ops=30",
          "logger=none"]  # fmt: skip
    res = train(compose(ov), tmp_path / "gen", echo=lambda s: None)
    best = res["best_step_time"]
    assert res["history"] and all(h[-1] >= best * (1 - 1e-9) for h in res["history"])
    assert res["history"][-1][-1] == pytest.approx(best)


def test_warm_starts_only_go_to_envs_that_start_from_a_placement() -> None:
    """OneShot-v0 takes no ``init`` and Stage-v0 a name only: agent.warm_start (on by
    default) failed there after every baseline, blamed on env.env_kwargs (fuzzing)."""
    import gymnasium as gym

    import placement_env  # noqa: F401
    from runners.train import WARM_START_ENVS

    for env_id in placement_env.ENV_IDS:
        spec = gym.spec(env_id)
        mod, cls = spec.entry_point.split(":")
        import importlib
        import inspect

        init = inspect.signature(getattr(importlib.import_module(mod), cls)).parameters.get("init")
        takes_array = init is not None and "ndarray" in str(init.annotation)
        assert takes_array == (env_id in WARM_START_ENVS), env_id


def test_a_baseline_agent_with_a_bad_option_value_fails_before_the_env_baselines(
    graph_file: Path, tmp_path: Path
) -> None:
    """`agent=anneal +agent.options.t0=-1` was refused only after the env's baselines had run
    (minutes on a real env: ideal_dp and ilp take up to 60 s each); the agent plans first."""
    ov = [*small_env(graph_file), "agent=anneal", "agent.budget=20"]
    lines: list[str] = []
    with pytest.raises(ValueError, match="t0"):
        train(compose([*ov, "+agent.options.t0=-1"]), tmp_path / "bad", echo=lines.append)
    assert not (tmp_path / "bad" / "baselines.json").exists()
    assert not any(line.startswith(("single", "expert")) for line in lines), lines
    res = train(compose(ov), tmp_path / "good", echo=lambda s: None)
    assert res["agent"] == "anneal" and res["best_step_time"] > 0 and not res["oom"]
    assert sorted(res["baselines"]) == ["expert", "single"]
    saved = json.loads((tmp_path / "good" / "baselines.json").read_text())
    assert sorted(saved) == ["expert", "single"]


@pytest.mark.timeout(300)
def test_a_new_run_in_a_used_folder_removes_the_earlier_runs_files(
    graph_file: Path, tmp_path: Path
) -> None:
    """A killed PPO run's folder reused by a new run: its baselines.json was taken by the new
    run's resume as its own (speed-up against another problem's baseline), a baseline
    agent's run kept its policy.pt, and its checkpoint was resumed by a new run killed before
    its first checkpoint (fuzzing, 2 Dec 2026)."""
    run = tmp_path / "run"
    ppo = [*small_env(graph_file), "env.baselines=[expert]", "train.timesteps=256",
           "train.checkpoint_every=1", "agent.ppo.n_steps=64"]  # fmt: skip
    quiet = lambda s: None  # noqa: E731
    with pytest.raises(CrashForTest):
        train(compose([*ppo, "train.crash_after_updates=1"]), run, echo=quiet)
    assert checkpoint.exists(run) and (run / "baselines.json").exists()
    (run / "policy.pt").write_bytes(b"an earlier run's policy")
    lines: list[str] = []
    res = train(compose([*small_env(graph_file), "env.baselines=[single]", "agent=metis"]), run,
                echo=lines.append)  # fmt: skip
    assert any("held an earlier run: replacing its baselines.json" in ln for ln in lines), lines
    assert not (run / "policy.pt").exists() and not checkpoint.exists(run)
    assert not (run / ".earlier_run").exists()
    assert sorted(res["baselines"]) == ["single"]
    assert sorted(json.loads((run / "baselines.json").read_text())) == ["single"]


@pytest.mark.timeout(300)
def test_resume_refuses_a_checkpoint_whose_config_was_edited(
    graph_file: Path, tmp_path: Path
) -> None:
    """`cluster: k40_2` edited to k40_4 in a killed run's config.yaml resumed without a word:
    result.json named k40_4, the envs in the checkpoint trained on 2 devices (fuzzing)."""
    run = tmp_path / "run"
    ov = [*small_env(graph_file), "env.baselines=[]", "train.timesteps=256",
          "train.checkpoint_every=1", "agent.ppo.n_steps=64", "train.crash_after_updates=1"]  # fmt: skip
    with pytest.raises(CrashForTest):
        train(compose(ov), run, echo=lambda s: None)
    saved = checkpoint.load(run)["extra"][checkpoint.CONFIG_DIGEST]
    assert saved == checkpoint.config_digest(run)
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("cluster: k40_2", "cluster: k40_4"))
    with pytest.raises(ValueError, match="written by a run of another config than"):
        train(compose(["+env=rnnlm_k40_2", f"resume={run}"]), tmp_path / "x", echo=lambda s: None)


def test_a_new_run_refused_by_its_checks_leaves_the_earlier_runs_files(
    graph_file: Path, tmp_path: Path
) -> None:
    """The earlier run's files are removed only once the new run's config passed its checks."""
    run = tmp_path / "run"
    train(compose([*small_env(graph_file), "env.baselines=[]", "agent=single"]), run,
          echo=lambda s: None)  # fmt: skip
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ValueError):
        train(compose([*small_env(graph_file), "agent=ideal_dp", "env.env_id=placement_env/Hybrid-v0"]),
              run, echo=lambda s: None)  # fmt: skip
    assert before == ["config.yaml", "result.json", "run_info.json", "wall_clock.json"]
    assert (run / "result.json").exists() and (run / "run_info.json").exists()


def test_a_new_run_keeps_its_inputs_and_the_files_of_a_folder_that_holds_no_run(
    graph_file: Path, tmp_path: Path
) -> None:
    """Found by fuzzing the first version of the clearing: `agent.init_policy=DIR/policy.pt
    output_dir=DIR` removed the policy it was told to start from, and a plain folder
    (no config.yaml) lost its result.json."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "result.json").write_text("{}")
    (plain / "policy.pt").write_bytes(b"x")
    train(compose([*small_env(graph_file), "env.baselines=[]", "agent=single"]), plain,
          echo=lambda s: None)  # fmt: skip
    assert (plain / "policy.pt").read_bytes() == b"x"  # not a run's folder: kept
    from runners.train import _input_files, earlier_run_set_aside

    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "policy.pt", "baselines.json"):
        (run / name).write_text("x")
    keep = _input_files({"agent": {"init_policy": str(run / "policy.pt")}, "x": [1, None]})
    assert keep == {(run / "policy.pt").resolve()}
    with earlier_run_set_aside(run, keep) as moved:
        assert moved == ["config.yaml", "baselines.json"]
        assert (run / "policy.pt").exists() and not (run / "baselines.json").exists()
    assert sorted(p.name for p in run.iterdir()) == ["policy.pt"]


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file()}


@pytest.mark.timeout(300)
def test_a_command_refused_after_its_checks_puts_the_earlier_run_back(
    graph_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agent=ideal_dp +agent.options.time_limit=-1 output_dir=USED` removed the earlier
    run's result.json, plan and baselines, then was refused by the planner (it checks its
    options when it starts), and left its own config.yaml beside what was left (fuzzing,
    2 Dec 2026). Now every file is as it was, byte for byte; so after a refusal from inside
    a search whose baselines had run (baselines.json is the new run's: removed), and after
    Ctrl-C before the first checkpoint. A failure after it leaves the folder the new run's."""
    run = tmp_path / "run"
    train(compose([*small_env(graph_file), "env.baselines=[]", "agent=single"]), run,
          echo=lambda s: None)  # fmt: skip
    earlier = _files(run)
    assert "result.json" in earlier and "baselines.json" not in earlier
    quiet = lambda s: None  # noqa: E731
    with pytest.raises(ValueError, match="time_limit"):
        train(compose([*small_env(graph_file), "agent=ideal_dp", "+agent.options.time_limit=-1"]),
              run, echo=quiet)  # fmt: skip
    assert _files(run) == earlier and not (run / ".earlier_run").exists()

    import runners.train as rt

    def refuse(*a: object, **k: object) -> None:
        raise ValueError("refused inside the search")

    monkeypatch.setattr(rt, "search_ppo", refuse)
    with pytest.raises(ValueError, match="inside the search"):
        train(compose([*small_env(graph_file), "env.baselines=[single]"]), run, echo=quiet)
    assert _files(run) == earlier

    def interrupt(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rt, "search_ppo", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train(compose(small_env(graph_file)), run, echo=quiet)
    assert _files(run) == earlier
    monkeypatch.undo()

    ppo = [*small_env(graph_file), "env.baselines=[]", "train.timesteps=256",
           "train.checkpoint_every=1", "agent.ppo.n_steps=64", "train.crash_after_updates=1"]  # fmt: skip
    with pytest.raises(CrashForTest):
        train(compose(ppo), run, echo=quiet)
    assert checkpoint.exists(run) and not (run / "result.json").exists()
    assert (run / "config.yaml").read_bytes() != earlier["config.yaml"]
    assert not (run / ".earlier_run").exists()


@pytest.mark.timeout(300)
def test_the_next_command_puts_back_what_a_killed_command_set_aside(
    graph_file: Path, tmp_path: Path
) -> None:
    """`kill -9` of a new run before its first checkpoint left the earlier run's files in
    .earlier_run/, and the next new run in the folder removed them unread: the earlier
    run's result was lost (3 Dec 2026). Now the next command puts them back first."""
    import signal
    import time

    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    cli = [sys.executable, "-m", "runners.train", *small_env(graph_file), "env.baselines=[]",
           f"output_dir={run}"]  # fmt: skip
    first = subprocess.run([*cli, "agent=single"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=240)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    earlier, hydra = _files(run), _tree(run / ".hydra")
    cmd = [*cli, "train.timesteps=10000000", "train.checkpoint_every=100000",
           "agent.ppo.n_steps=64"]  # fmt: skip

    def new_config() -> bool:  # the earlier run's is moved aside, then the new one written
        try:
            return (run / "config.yaml").read_bytes() != earlier["config.yaml"]
        except FileNotFoundError:
            return False

    def kill_a_new_run_once_it_has_set_the_earlier_one_aside() -> None:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 200
            while not new_config():
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    kill_a_new_run_once_it_has_set_the_earlier_one_aside()
    assert (run / ".earlier_run" / "result.json").is_file() and not (run / "result.json").exists()
    assert _tree(run / ".hydra") != hydra  # the killed command's
    # even a refused command puts it back, .hydra/ included (the killed command's replaced it)
    refused = subprocess.run([*cli, "agent=ideal_dp", "+agent.options.time_limit=-1"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert refused.returncode == 2 and "time_limit" in refused.stderr, refused.stderr[-2000:]
    assert "put back (config.yaml, result.json" in refused.stdout, refused.stdout[-2000:]
    other = ("train.log", ".devplace.lock", "error.txt")  # appended to; lock; the refusal
    assert {k: v for k, v in _files(run).items() if k not in other} == {
        k: v for k, v in earlier.items() if k not in other
    }
    assert _tree(run / ".hydra") == hydra
    assert not (run / ".earlier_run").exists()
    # killed again, then resume= (which writes no .hydra/ of its own) succeeds: the earlier
    # run's .hydra/ is back too (it kept the killed command's; fuzzing, 3 Dec 2026)
    kill_a_new_run_once_it_has_set_the_earlier_one_aside()
    resumed = subprocess.run([sys.executable, "-m", "runners.train", f"resume={run}"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert resumed.returncode == 0 and "finished already" in resumed.stdout + resumed.stderr
    assert _tree(run / ".hydra") == hydra and _files(run)["result.json"] == earlier["result.json"]


def test_put_back_after_kill_keeps_inputs_and_a_folder_the_stopped_run_owns(
    tmp_path: Path,
) -> None:
    """The stopped run's files go and the earlier run's come back, but the files it was
    told to read (left in place) stay; a stopped run that had its first checkpoint owns the
    folder (settle), and only then: a result.json copied in by hand, or a set-aside or
    put-back cut short, used to make the next command delete the earlier run (fuzzing,
    3 Dec 2026)."""
    from runners.earlier_run import MANIFEST, set_aside
    from runners.train import RUN_DIRS, RUN_FILES, put_back_after_kill, settle

    run = tmp_path / "run"
    run.mkdir()
    earlier = {"config.yaml": b"a", "policy.pt": b"p", "result.json": b"r", "checkpoint.pkl": b"c"}

    def fresh() -> None:
        for p in run.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        for name, data in earlier.items():
            (run / name).write_bytes(data)

    def killed(kept: set[str] = frozenset()) -> None:  # what the new run sets aside, then SIGKILL
        set_aside(run, ("config.yaml", *RUN_FILES), RUN_DIRS, set(kept))
        (run / "config.yaml").write_text("b")
        (run / "baselines.json").write_text("new")
        (run / "tb").mkdir()

    fresh()
    killed({"policy.pt"})
    assert sorted(put_back_after_kill(run)) == ["checkpoint.pkl", "config.yaml", "result.json"]
    assert _files(run) == earlier and not (run / "tb").exists()
    assert put_back_after_kill(run) == [] and sorted(p.name for p in run.iterdir()) == sorted(
        earlier
    )
    # owned: the first checkpoint settles the folder
    fresh()
    killed()
    (run / "checkpoint.pkl").write_text("mine")
    settle(run)
    assert put_back_after_kill(run) == [] and (run / "checkpoint.pkl").read_text() == "mine"
    assert not (run / ".earlier_run").exists()
    # a result.json copied back by hand, or written by another runner: not the run's own
    fresh()
    killed()
    (run / "result.json").write_bytes((run / ".earlier_run" / "result.json").read_bytes())
    put_back_after_kill(run)
    assert _files(run) == earlier
    # a put-back cut short after one file, then done again
    fresh()
    killed()
    (run / ".earlier_run" / "config.yaml").replace(run / "config.yaml")
    put_back_after_kill(run)
    assert _files(run) == earlier
    # a set-aside cut short: the checkpoint not yet moved
    fresh()
    killed()
    (run / ".earlier_run" / "checkpoint.pkl").replace(run / "checkpoint.pkl")
    put_back_after_kill(run)
    assert _files(run) == earlier
    # a manifest edited by hand: the files with a copy come back, nothing else is removed;
    # one that leaves out a file with a copy there, or names another folder as hydra's
    # output folder (which was removed), is not followed (fuzzing, 3 Dec 2026)
    left_out = '{"moved": ["config.yaml"], "kept": [], "hydra": null}'
    for text in ("null", "123", '["config.yaml"]', "{bad", left_out):
        fresh()
        killed()
        (run / ".earlier_run" / MANIFEST).write_text(text)
        put_back_after_kill(run)
        assert {k: v for k, v in _files(run).items() if k != "baselines.json"} == earlier
    from runners.earlier_run import _manifest

    for hydra in (".", "..", "/tmp", "a/b", ""):
        (run / ".earlier_run").mkdir(exist_ok=True)
        (run / ".earlier_run" / MANIFEST).write_text(
            json.dumps({"moved": [], "kept": [], "hydra": hydra})
        )
        assert _manifest(run / ".earlier_run", ("config.yaml",)) is None, hydra
    assert _manifest(run / ".earlier_run", ("config.yaml",)) is None
    shutil.rmtree(run / ".earlier_run")
    # a file that cannot be moved aside: one line, and the folder as it was
    fresh()
    real = Path.replace

    def stuck(self: Path, target: object) -> Path:
        if self.name == "result.json" and ".earlier_run" not in str(self):
            raise PermissionError(1, "Operation not permitted", str(self))
        return real(self, target)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "replace", stuck)
        with pytest.raises(
            ValueError, match=r"cannot set the earlier run's files aside .*Operation not permitted"
        ):
            killed()
    assert _files(run) == earlier and not (run / ".earlier_run").exists()
    fresh()
    (run / ".earlier_run").write_text("x")
    with pytest.raises(ValueError, match=r"\.earlier_run is a file, not the folder"):
        put_back_after_kill(run)


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.timeout(300)
def test_a_new_run_replaces_the_earlier_runs_logger_folder_and_a_refused_one_keeps_it(
    graph_file: Path, tmp_path: Path
) -> None:
    """A second logger=tensorboard run in one folder wrote its events beside the earlier
    run's in tb/ (tensorboard drew the two as one run); now tb/ (and wandb/) are the new
    run's, and a refused command leaves the earlier run's byte for byte."""
    run, quiet = tmp_path / "run", (lambda s: None)
    base = [*small_env(graph_file), "env.baselines=[]", "logger=tensorboard"]
    train(compose([*base, "agent=single"]), run, echo=quiet)
    first = _tree(run / "tb")
    assert len([n for n in first if "tfevents" in n]) == 1
    with pytest.raises(ValueError, match="time_limit"):
        train(compose([*base, "agent=ideal_dp", "+agent.options.time_limit=-1"]), run, echo=quiet)
    assert _tree(run / "tb") == first and not (run / ".earlier_run").exists()
    said: list[str] = []
    train(compose([*base, "agent=round_robin"]), run, echo=said.append)
    assert any("replacing its" in line and "tb" in line for line in said)
    second = _tree(run / "tb")
    assert len([n for n in second if "tfevents" in n]) == 1 and not set(second) & set(first)


@pytest.mark.timeout(300)
def test_resume_refuses_a_graph_file_replaced_since_the_run_started(
    graph_file: Path, tmp_path: Path
) -> None:
    """env.graph_file is read again on resume: a file replaced since was trained on in the
    checkpoint's envs and the plan scored on the new one, "speed-up vs metis x0.26", exit 0
    (fuzzing, 2 Dec 2026)."""
    g = tmp_path / "g.json"
    g.write_bytes(graph_file.read_bytes())
    run = tmp_path / "run"
    ov = [*small_env(graph_file), f"env.graph_file={g}", "env.baselines=[]",
          "train.timesteps=256", "train.checkpoint_every=1", "agent.ppo.n_steps=64",
          "train.crash_after_updates=1"]  # fmt: skip
    with pytest.raises(CrashForTest):
        train(compose(ov), run, echo=lambda s: None)
    assert "problem" in json.loads((run / "run_info.json").read_text())
    d = json.loads(g.read_text())
    d["nodes"]["flops"] = [4 * x for x in d["nodes"]["flops"]]
    g.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"the run's problem changed since it started \(graph: "):
        train(compose(["+env=rnnlm_k40_2", f"resume={run}"]), tmp_path / "x", echo=lambda s: None)


@pytest.mark.timeout(300)
def test_a_run_with_relative_input_paths_resumes_from_another_folder(
    graph_file: Path, tmp_path: Path
) -> None:
    """config.yaml kept env.graph_file / agent.init_policy / cpu_N@PATH as typed, so
    resume= from another folder failed: "g/chain.json: cannot read file" (2 Dec 2026)."""
    import shutil

    from runners.train import absolute_input_paths

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    (work / "g").mkdir(parents=True)
    elsewhere.mkdir()
    shutil.copy(graph_file, work / "g" / "chain.json")
    ov = [a for a in small_env(graph_file) if not a.startswith("env.graph_file=")]
    killed = _run(
        [
            "runners.train", *ov, "env.graph_file=g/chain.json", "env.baselines=[]",
            "train.timesteps=512", "train.checkpoint_every=1", "agent.ppo.n_steps=64",
            "train.crash_after_updates=2", "output_dir=run",
        ],
        work,
    )  # fmt: skip
    assert killed.returncode != 0 and "crash_after_updates=2 reached" in killed.stderr
    saved = (work / "run" / "config.yaml").read_text()
    assert f"graph_file: {work / 'g' / 'chain.json'}" in saved
    resumed = _run(["runners.train", f"resume={work / 'run'}"], elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((work / "run" / "result.json").read_text())["timesteps"] == 512
    assert not list(elsewhere.iterdir())  # nothing written where the resume was typed

    # the policy it wrote starts another run by a relative path, kept absolute too
    shutil.copy(work / "run" / "policy.pt", work / "p.pt")
    (work / "cal.json").write_text("{}")
    cfg = compose(
        [*ov, "agent.init_policy=p.pt", "env.graph_file=g/chain.json", "env.cluster=cpu_2@cal.json"]
    )
    cwd = os.getcwd()
    try:
        os.chdir(work)
        changed = absolute_input_paths(cfg)
    finally:
        os.chdir(cwd)
    assert changed == ["env.graph_file", "agent.init_policy", "env.cluster"]
    assert cfg.agent.init_policy == str(work / "p.pt")
    assert cfg.env.cluster == f"cpu_2@{work / 'cal.json'}"
    cfg = compose([*ov, "agent.init_policy=generalist", "env.graph_file=nosuch.json"])
    assert absolute_input_paths(cfg) == []  # a shipped name and a missing file stay as typed
    assert (cfg.agent.init_policy, cfg.env.graph_file) == ("generalist", "nosuch.json")
