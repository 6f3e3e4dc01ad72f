"""Every conf/ file composes against its schema; bad keys, choices and a missing env are refused."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from runners import common, schema
from runners.train import _hydra_main  # noqa: F401 - registers the schemas like the app does
from tests.runners.conftest import compose

ROOT = Path(__file__).resolve().parents[2]

ENVS = common.available("env")
AGENTS = common.available("agent")
REQUIRED_ENVS = {
    "gpt2_8gpu",
    "bert_8gpu",
    "llama_h100_16",
    "moe_a100_8",
    "hetero",
    "rnnlm_k40_2",
    "rnnlm_k40_4",
    "nmt_k40_2",
    "nmt_k40_4",
    "inception_k40_2",
    "inception_k40_4",
    "synthetic",
    "cpu_profiled",
    "my_model",
}


def test_required_groups_present() -> None:
    assert REQUIRED_ENVS <= set(ENVS)
    from agents import baselines, policies

    assert set(baselines.names()) | set(policies.names()) <= set(AGENTS)
    assert set(common.available("logger")) == {"wandb", "tensorboard", "none"}
    assert common.available("experiment")


@pytest.mark.parametrize("env", ENVS)
def test_every_env_composes(env: str) -> None:
    cfg = compose([f"+env={env}"])
    spec = common.env_spec(cfg.env)
    assert spec.name == env
    assert (spec.model is None) != (spec.graph_file is None)
    assert spec.microbatches >= 1 and spec.schedule in ("gpipe", "1f1b")
    from agents import baselines

    assert set(spec.baselines) <= set(baselines.names())
    from graphs import clusters

    assert clusters.exists(spec.cluster)
    assert spec.env_id in __import__("placement_env").ENV_IDS


@pytest.mark.parametrize("agent", AGENTS)
def test_every_agent_composes(agent: str) -> None:
    cfg = compose(["+env=gpt2_8gpu", f"agent={agent}"])
    assert cfg.agent.name == agent
    if cfg.agent.kind == "baseline":
        from agents import baselines

        baselines.get(cfg.agent.baseline)  # raises if unknown
    elif cfg.agent.kind == "finetune":
        from agents.export import resolve_policy

        assert resolve_policy(cfg.agent.init_policy).exists()  # a shipped policy name
    else:
        assert cfg.agent.kind == "ppo"
        from agents import policies

        assert cfg.agent.policy == "auto" or cfg.agent.policy in policies.names()


def test_default_agent_takes_env_policy_and_logger_is_wandb() -> None:
    cfg = compose(["+env=gpt2_8gpu"])
    assert cfg.agent.name == "ppo" and cfg.agent.policy == "auto"
    assert cfg.logger.kind == "wandb"


@pytest.mark.parametrize("exp", [e for e in common.available("experiment")])
def test_every_experiment_composes(exp: str) -> None:
    if exp.startswith("eval_"):
        cfg = compose([f"+experiment={exp}"], config="evaluate")
        assert set(cfg.envs) <= set(ENVS) and set(cfg.agents) <= set(AGENTS)
    else:
        extra = [] if exp == "generalist" else ["+env=gpt2_8gpu"]
        cfg = compose([*extra, f"+experiment={exp}"])
        assert cfg.train.timesteps > 0


def test_plan_and_evaluate_configs_compose() -> None:
    cfg = compose(["policy=p.pt", "+env=nmt_k40_4"], config="plan")
    assert cfg.env.cluster == "k40_4" and cfg.samples is None and cfg.policy == "p.pt"
    assert compose(["+env=nmt_k40_4"], config="plan").policy == "generalist"  # the shipped one
    ev = compose([], config="evaluate")
    assert set(ev.envs) <= set(ENVS) and set(ev.agents) <= set(AGENTS)


def test_misspelt_key_in_yaml_fails_at_composition() -> None:
    with pytest.raises((ConfigCompositionException, ConfigKeyError, HydraException)):
        compose(["+env=gpt2_8gpu", "env.microbatch=4"])


def test_cli_key_check_lists_valid_keys() -> None:
    with pytest.raises(ValueError, match="'microbatch'.*valid keys:.*'microbatches'"):
        schema.check_overrides(schema.TrainConfig, ["+env=gpt2_8gpu", "env.microbatch=4"])
    with pytest.raises(ValueError, match="valid keys:.*'seconds'.*'timesteps'"):
        schema.check_overrides(schema.TrainConfig, ["train.steps=5"])
    # group choices, free-form dicts and hydra keys are left to hydra
    schema.check_overrides(
        schema.TrainConfig,
        [
            "-m",
            "agent=gdp,placeto",
            "seed=0,1",
            "+env.model_config.n_layer=2",
            "hydra.verbose=true",
        ],
    )


def test_unknown_choice_names_the_options() -> None:
    with pytest.raises(HydraException) as err:
        compose(["+env=gpt3_8gpu"])
    assert "gpt2_8gpu" in str(err.value) and "rnnlm_k40_2" in str(err.value)


def test_missing_env_lists_envs(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose([])
    assert OmegaConf.is_missing(cfg, "env")
    with pytest.raises(SystemExit) as exc:
        common.require_env(cfg, "train")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "+env=" in err and all(e in err for e in REQUIRED_ENVS)


def test_env_spec_refuses_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown keys \\['bogus'\\]"):
        common.env_spec({"name": "x", "bogus": 1})


@pytest.mark.parametrize("env", ENVS)
def test_every_op_placement_env_has_a_plan_that_fits(env: str) -> None:
    """A shipped env that no plan can fit is a defect (moe_a100_8 was one until 26 Nov 2026:
    Mixtral-8x7B's 696 GiB of parameter state on 640 GiB of A100s): the chain DP finds a
    plan the simulator does not flag OOM on every op-placement env."""
    from agents import baselines
    from placement_env.oracles.simulator import Simulator

    spec = common.env_spec(compose([f"+env={env}"]).env)
    if spec.env_id == common.HYBRID_ENV_ID:
        pytest.skip("hybrid plans shard the state; covered by the hybrid tests")
    p = common.build_problem(spec)
    kw = dict(microbatches=spec.microbatches, schedule=spec.schedule, objective=spec.objective)
    sim = Simulator(p.graph, p.cluster, **kw)
    plan = baselines.get("pipedream_dp")(p.graph, p.cluster, sim, None)
    assert not Simulator(p.graph, p.cluster, **kw).evaluate(plan).oom


def test_an_env_no_placement_can_fit_is_refused_by_name() -> None:
    """The full 32-layer Mixtral on 8 A100-80GB: refused before any planner runs, with the
    sizes and the ways out."""
    spec = common.env_spec(compose(["+env=moe_a100_8", "env.model_config.n_layer=32"]).env)
    with pytest.raises(ValueError) as info:
        common.build_problem(spec)
    msg = str(info.value)
    assert "env 'moe_a100_8': no placement can fit" in msg
    assert "695.9 GiB of parameter state" in msg and "640.0 GiB of 'dgx_a100_8'" in msg
    assert "env.model_config" in msg and "Hybrid-v0" in msg


def test_memory_fraction_scales_the_problems_cluster_and_is_named_when_it_refuses() -> None:
    """``env.memory_fraction`` gives the problem a cluster with that share of each device's
    memory; when the share is what makes the model not fit, the message says so."""
    full = common.build_problem(common.env_spec(compose(["+env=moe_a100_8"]).env))
    spec = common.env_spec(compose(["+env=moe_a100_8", "env.memory_fraction=0.75"]).env)
    part = common.build_problem(spec)
    assert np.allclose(part.cluster.memory, 0.75 * full.cluster.memory)
    assert part.cluster.meta["memory_fraction"] == 0.75
    # its 367 GiB of state and one microbatch fit 8 x 80 GiB, not 8 x 40 GiB
    tiny = common.env_spec(compose(["+env=moe_a100_8", "env.memory_fraction=0.5"]).env)
    with pytest.raises(ValueError, match=r"more than env\.memory_fraction=0\.5 of each device"):
        common.build_problem(tiny)


def test_an_env_with_both_a_model_and_a_graph_file_is_refused(tmp_path) -> None:
    """+env=rnnlm_k40_2 env.graph_file=g.json used to drop the model without a word, and the
    plans then named no model for runners.execute."""
    from runners import common
    from tests.runners.conftest import compose

    cfg = compose(["+env=rnnlm_k40_2", f"env.graph_file={tmp_path / 'g.json'}"])
    with pytest.raises(ValueError, match=r"both env.model \('rnnlm'\) and env.graph_file"):
        common.env_spec(cfg.env)
    ok = compose(["+env=rnnlm_k40_2", f"env.graph_file={tmp_path / 'g.json'}", "env.model=null"])
    assert common.env_spec(ok.env).model is None


def test_generator_options_of_a_fixed_problem_are_refused() -> None:
    """+env=gpt2_8gpu env.generator_options.num_nodes=50 was ignored without a word: the
    fixed problem is the env's model. Refused; with a generator they are its options."""
    from runners import common
    from tests.runners.conftest import compose

    cfg = compose(["+env=gpt2_8gpu", "+env.generator_options.num_nodes=50"])
    with pytest.raises(
        ValueError,
        match=r"env.generator_options \{'num_nodes': 50\} set, but env.generator is 'fixed'",
    ):
        common.env_spec(cfg.env)
    assert common.env_spec(compose(["+env=synthetic"]).env).generator_options


@pytest.mark.parametrize(
    "argv, says",
    [
        (["+env=nosuch"], r"'\+env=nosuch': 'nosuch' is not one of the env choices \['bert_8gpu'"),
        (["+env=gpt2_tiny_cpu4", "agent=metis,nosuch"],
         r"'agent=metis,nosuch': 'nosuch' is not one of the agent choices"),
        (["logger=foo"], r"'foo' is not one of the logger choices \['none', 'tensorboard', 'wandb'\]"),
        (["+experiment=nosuch"], r"'nosuch' is not one of the experiment choices"),
        (["-m", "+env=gpt2_tiny_cpu4", "agent=metis,expert", "output_dir=/tmp/x"],
         r"output_dir= with -m \(a sweep\) would put every job into one folder"),
    ],
)  # fmt: skip
def test_group_choices_and_a_sweep_into_one_folder_are_one_error_line(argv, says, capsys):
    """Found by fuzzing: a wrong group choice was hydra's several-line message (exit 1); with
    -m and output_dir= every job wrote into one folder, each replacing the last."""
    from runners import schema

    with pytest.raises(SystemExit) as stop:
        schema.run_checked(schema.TrainConfig, lambda: pytest.fail("hydra ran"), argv=argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and re.search(says, err), err


def test_an_experiment_for_another_runner_is_one_error_line(capsys):
    """Found by fuzzing: `+experiment=eval_mirhoseini` (the evaluate suite) on runners.train
    and `+experiment=generalist` on runners.evaluate were hydra's several-line messages."""
    from runners import schema

    for cls, argv, says in (
        (schema.TrainConfig, ["+experiment=eval_mirhoseini"],
         "experiment 'eval_mirhoseini' sets ['agents', 'envs', 'seeds'], which TrainConfig"),
        (schema.EvaluateConfig, ["+experiment=generalist"],
         "experiment 'generalist' sets ['agent', 'env'], which EvaluateConfig has no keys"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            schema.run_checked(cls, lambda: pytest.fail("hydra ran"), argv=argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and says in err, err
    ran = []
    schema.run_checked(schema.TrainConfig, lambda: ran.append(1), argv=["+experiment=generalist"])
    schema.run_checked(
        schema.EvaluateConfig, lambda: ran.append(1), argv=["+experiment=eval_mirhoseini"]
    )
    assert ran == [1, 1]


@pytest.mark.parametrize(
    "runner, argv, says",
    [
        # a single folder or name for a list key: hydra's several lines, exit status 1
        ("EvaluateConfig", ["runs=outputs/train/x"],
         "key 'runs' is 'outputs/train/x'; expected a list in brackets, e.g. "
         "[outputs/train/x] (or null)"),
        ("EvaluateConfig", ["envs=rnnlm_k40_2"], "key 'envs' is 'rnnlm_k40_2'; expected a list"),
        ("TrainConfig", ["+env=rnnlm_k40_2", "env.baselines=metis"],
         "key 'env.baselines' is 'metis'; expected a list in brackets, e.g. [metis]"),
        # a config group the runner does not have: hydra's "Could not override" lines
        ("EvaluateConfig", ["logger=none"],
         "'logger=none': this runner (EvaluateConfig) has no 'logger' config group; its keys: "
         "['agents', 'envs', "),
        ("PlanConfig", ["+env=bert_8gpu", "agent=metis"],
         "this runner (PlanConfig) has no 'agent' config group"),
        ("ExecuteConfig", ["plan=p.json", "logger=none"],
         "this runner (ExecuteConfig) has no 'logger' config group"),
    ],
)  # fmt: skip
def test_a_scalar_for_a_list_and_a_foreign_group_are_one_error_line(runner, argv, says, capsys):
    """2 Dec 2026: `runners.evaluate runs=DIR` (the README writes runs=[DIR]) and
    `logger=none` given to a runner without a logger ended in hydra's multi-line message."""
    from runners import schema

    with pytest.raises(SystemExit) as stop:
        schema.run_checked(getattr(schema, runner), lambda: pytest.fail("hydra ran"), argv=argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and says in err, err
    ran = []  # the list written as a list, and null where the key may be null, go through
    schema.run_checked(schema.EvaluateConfig, lambda: ran.append(1), argv=["runs=[a, b]"])
    schema.run_checked(schema.EvaluateConfig, lambda: ran.append(1), argv=["runs=null"])
    assert ran == [1, 1]


def test_a_key_inside_a_free_form_field_needs_no_plus() -> None:
    """2 Dec 2026: `env.model_config.n_layer=1` (an env whose file sets no model_config) and
    `agent.options.t0=0.5` failed in hydra's several lines ("not in struct ... use +") and
    worked only where the file already set the key; they are now written ++KEY=V."""
    import subprocess
    import sys

    from runners import schema

    argv = ["+env=rnnlm_k40_2", "env.model_config.n_layer=1", "agent.options.t0=0.5",
            "env.max_groups=8", "+agent.options.t_end=0.1", "~env.baselines", "seed=1",
            "env.env_kwargs={max_steps: 3}"]  # fmt: skip
    assert schema.free_form_overrides(schema.TrainConfig, argv) == [
        "+env=rnnlm_k40_2", "++env.model_config.n_layer=1", "++agent.options.t0=0.5",
        "env.max_groups=8", "+agent.options.t_end=0.1", "~env.baselines", "seed=1",
        "++env.env_kwargs={max_steps: 3}",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "runners.train", "+env=rnnlm_k40_2", "agent=anneal",
         "env.model_config.n_layer=1", "agent.options.t0=0.5", "--cfg", "job"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    assert cfg["env"]["model_config"] == {"n_layer": 1} and cfg["agent"]["options"]["t0"] == 0.5


def test_evaluate_passes_its_overrides_on_as_the_command_line_would() -> None:
    from runners.evaluate import cell_overrides

    cfg = OmegaConf.structured(schema.EvaluateConfig)
    cfg.overrides = ["env.model_config.n_layer=1", "+agent.options.t0=0.5", "env.max_groups=8"]
    cell = cell_overrides(cfg, "rnnlm_k40_2", "anneal", 0)
    assert cell[:3] == ["+env=rnnlm_k40_2", "agent=anneal", "seed=0"]
    assert cell[-3:] == [
        "++env.model_config.n_layer=1",
        "+agent.options.t0=0.5",
        "env.max_groups=8",
    ]


@pytest.mark.parametrize(
    "arg, says",
    [
        ("overrides=[nosuch=1]", "cannot parse override 'overrides=[nosuch=1]': no viable "
         "alternative at input '[nosuch='; a value holding '=' must be quoted, e.g. "
         "overrides=['...']"),
        ("envs=[a", "cannot parse override 'envs=[a': no viable alternative at input '[a'"),
    ],
)  # fmt: skip
def test_an_override_hydra_cannot_parse_is_one_error_line(arg, says, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        schema.run_checked(schema.EvaluateConfig, lambda: pytest.fail("hydra ran"), argv=[arg])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == f"error: {says}\n"


@pytest.mark.parametrize(
    "value",
    ["/tmp/r(1)", "/tmp/a,b", "/tmp/x=y", "/tmp/it's", "/tmp/a[1]", 'say "hi"', "$HOME/{a}",
     # hints that failed when pasted (fuzzing, 2 Dec 2026): both quote kinds, a trailing
     # backslash, an interpolation, backslashes before a quote
     "q/both'\"x(1)", "q/x(\\", "q/${x}(1)", "q/a\\'b", "q/\\${x}(1)", "ü nï (1)"],
)  # fmt: skip
def test_a_path_hydra_reads_as_syntax_gets_a_quoting_that_works(value, capsys) -> None:
    """``output_dir=/tmp/r(1)`` was hydra's grammar error alone, ``output_dir=/tmp/a,b``
    hydra's several lines on sweeps with exit status 1 (2 Dec 2026): the error now shows the
    argument to type, and that argument, as bash reads it, is ``value`` to hydra and OmegaConf."""
    import subprocess

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    with pytest.raises(SystemExit) as stop:
        schema.run_checked(
            schema.PlanConfig, lambda: pytest.fail("hydra ran"), argv=[f"output_dir={value}"]
        )
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert ("is a sweep over 2 values" in err) == ("," in value)
    typed = err.rstrip("\n").split("inside the shell's quotes: ", 1)[1]
    bash = subprocess.run(["bash", "-c", f"printf %s {typed}"], capture_output=True, text=True)
    (ov,) = OverridesParser.create().parse_overrides([bash.stdout])
    assert ov.key_or_group == "output_dir" and not ov.is_sweep_override()
    assert OmegaConf.create({"v": ov.value()}).v == value


@pytest.mark.parametrize("value", ["a\\b", "a\\", "it's", "x(1)", 'say "hi"'])
def test_resume_hands_hydra_the_folder_as_typed(value, tmp_path, monkeypatch) -> None:
    """``resume=q16/a\\b``: every backslash was doubled in the hydra.run.dir it handed hydra,
    which logged the resume into a sibling folder ``a\\\\b`` (fuzzing, 2 Dec 2026)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    monkeypatch.chdir(tmp_path)
    folder = value
    os.makedirs(folder, exist_ok=True)
    resume = "resume=" + schema.hydra_quoted(value, literal=False)
    extra = schema._resume_dir_overrides(schema.TrainConfig, [resume])
    parser = OverridesParser.create()
    (run_dir,) = parser.parse_overrides([extra[0]])
    (given,) = parser.parse_overrides([resume])
    got = OmegaConf.create({"a": run_dir.value(), "b": given.value()})
    assert run_dir.key_or_group == "hydra.run.dir" and got.a == got.b == folder


def test_the_quoting_the_error_shows_runs_from_a_shell(tmp_path) -> None:
    """The journey: the refused command, then the argument the error shows, typed into bash."""
    import os
    import subprocess
    import sys

    from tests.runners.conftest import ROOT

    folder = tmp_path / "lr(3e-4)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m runners.plan +env=gpt2_tiny_cpu4 samples=4 "

    def bash(arg: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", cmd + arg], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=240,
        )  # fmt: skip

    refused = bash(f"'output_dir={folder}'")
    assert refused.returncode == 2 and not folder.exists(), refused.stderr
    typed = refused.stderr.strip().split("inside the shell's quotes: ", 1)[1]
    done = bash(typed)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (folder / "result.json").is_file()


def test_output_dir_and_hydra_run_dir_must_name_one_folder(tmp_path, capsys) -> None:
    """``output_dir=X hydra.run.dir=Y``: the run went to X, hydra's files and the folder's
    lock to Y (fuzzing, 2 Dec 2026)."""
    argv = [f"output_dir={tmp_path / 'x'}", f"hydra.run.dir={tmp_path / 'y'}"]
    with pytest.raises(SystemExit) as stop:
        schema.run_checked(schema.PlanConfig, lambda: pytest.fail("hydra ran"), argv=argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "name two folders: the run would go to output_dir" in err
    ran = []
    same = [f"output_dir={tmp_path / 'x'}", f"hydra.run.dir={tmp_path / 'x' / '.'}"]
    schema.run_checked(schema.PlanConfig, lambda: ran.append(1), argv=same)  # one folder: fine
    assert ran == [1]


def test_a_sweep_without_multirun_is_one_error_line(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        schema.run_checked(
            schema.TrainConfig, lambda: pytest.fail("hydra ran"), argv=["agent=expert,metis"]
        )
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err == (
        "error: 'agent=expert,metis' is a sweep over 2 values (the commas): add --multirun (-m) "
        "to run each\n"  # no quoting offered: a group choice or numbers are never one string
    )


def test_an_env_key_on_resume_is_one_error_line(tmp_path, capsys) -> None:
    """resume=DIR with env.* overrides failed in hydra ("Missing mandatory value: env")."""
    from runners import schema

    with pytest.raises(SystemExit) as stop:
        schema.run_checked(
            schema.TrainConfig, lambda: pytest.fail("hydra ran"),
            argv=[f"resume={tmp_path}", "env.model_config.n_layer=3"],
        )  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert "env keys cannot be changed on resume: ['env.model_config.n_layer']" in err


def test_microbatches_that_do_not_divide_the_batch_are_refused_before_planning() -> None:
    """Found by fuzzing: 8 microbatches of gpt2_tiny_cpu4's batch of 4 (and the shipped
    llama_h100_16's 16 of 8) were planned and scored as half-sample microbatches, and only
    runners.execute refused the plan."""
    spec = common.env_spec(compose(["+env=gpt2_tiny_cpu4", "env.microbatches=8"]).env)
    with pytest.raises(
        ValueError, match=r"env\.microbatches = 8 does not divide the model's batch of 4"
    ):
        common.build_problem(spec)
    llama = common.build_problem(common.env_spec(compose(["+env=llama_h100_16"]).env))
    assert llama.graph.meta["batch"] == 16 and llama.spec.microbatches == 16
