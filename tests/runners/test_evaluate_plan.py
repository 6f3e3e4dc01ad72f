"""runners.evaluate (suite -> table + chart) and runners.plan (zero-shot with an exported policy)."""

from __future__ import annotations

import csv
import json
import os
import re
import socket
from pathlib import Path

import pytest

from runners import folder_lock
from runners.evaluate import aggregate, evaluate
from runners.plan import SUMMARY_KEYS, plan
from runners.train import train
from tests.runners.conftest import compose, small_env


def test_aggregate_mean_std_by_hand() -> None:
    rows = [
        {"env": "e", "agent": "a", "seed": 0, "step_time_ms": 10.0, "lower_bound_ms": 5.0,
         "oom": False, "oracle_calls": 4, "wall_seconds": 1.0},
        {"env": "e", "agent": "a", "seed": 1, "step_time_ms": 14.0, "lower_bound_ms": 5.0,
         "oom": False, "oracle_calls": 6, "wall_seconds": 3.0},
        {"env": "e", "agent": "b", "seed": 0, "step_time_ms": None, "lower_bound_ms": 5.0,
         "oom": True, "oracle_calls": 0, "wall_seconds": 0.5},
    ]  # fmt: skip
    a, b = aggregate(rows)
    assert (a["mean_ms"], a["std_ms"], a["feasible"], a["runs"]) == (12.0, 2.0, 2, 2)
    assert (a["oracle_calls"], a["wall_seconds"]) == (5.0, 2.0)
    assert b["mean_ms"] is None and b["feasible"] == 0


def test_evaluate_refuses_an_empty_runs_list(tmp_path: Path, monkeypatch) -> None:
    """`runs=[]` (a comparison of no runs) used to start the whole default suite."""
    from runners import evaluate as ev

    monkeypatch.setattr(ev, "train", lambda *a, **k: pytest.fail("a cell was trained"))
    with pytest.raises(ValueError, match=r"evaluate: runs=\[\] names no run folder"):
        evaluate(compose(["runs=[]"], config="evaluate"), tmp_path)
    assert compose([], config="evaluate").runs is None  # leaving runs out trains the suite


@pytest.mark.timeout(240)
def test_evaluate_suite_writes_table_and_chart(graph_file: Path, tmp_path: Path) -> None:
    cfg = compose(
        [
            "envs=[rnnlm_k40_2]",
            "agents=[expert,single,random]",
            "seeds=[0,1]",
            f'overrides=["env.graph_file={graph_file}","env.model=null"]',
        ],
        config="evaluate",
    )
    rows = evaluate(cfg, tmp_path, echo=lambda s: None)
    assert len(rows) == 6
    by = {(r["agent"], r["seed"]): r for r in rows}
    assert by[("single", 0)]["step_time_ms"] is None  # does not fit one K40
    assert by[("expert", 0)]["step_time_ms"] == by[("expert", 1)]["step_time_ms"] > 0
    assert by[("random", 0)]["oracle_calls"] == 200
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    md = (tmp_path / "results.md").read_text()
    assert "| rnnlm_k40_2 | single | no plan |" in md
    assert (tmp_path / "results.png").stat().st_size > 1000
    assert (tmp_path / "rnnlm_k40_2" / "expert" / "s1" / "best_plan.json").exists()


def test_evaluate_refuses_unknown_names(tmp_path: Path) -> None:
    cfg = compose(["envs=[nope]"], config="evaluate")
    with pytest.raises(ValueError, match="unknown envs \\['nope'\\]; available:.*gpt2_8gpu"):
        evaluate(cfg, tmp_path)


@pytest.mark.timeout(240)
def test_plan_zero_shot_with_exported_policy(graph_file: Path, tmp_path: Path) -> None:
    ov = [*small_env(graph_file), "env.baselines=[]", "train.timesteps=128", "agent.ppo.n_steps=64"]
    train(compose(ov), tmp_path / "train", echo=lambda s: None)
    policy = tmp_path / "train" / "policy.pt"
    # plan the same graph on a 4-device cluster the policy never saw
    cfg = compose(
        [
            f"policy={policy}",
            "+env=rnnlm_k40_4",
            f"env.graph_file={graph_file}",
            "env.model=null",
            "samples=2",
        ],
        config="plan",
    )
    lines: list[str] = []
    res = plan(cfg, tmp_path / "plan", echo=lines.append)
    saved = json.loads((tmp_path / "plan" / "result.json").read_text())
    assert saved == res
    assert res["oom"] is False and res["step_time"] >= res["lower_bound"] > 0
    assert res["oracle_calls"] >= 2
    import hashlib  # which weights planned (a name or a path alone does not say)

    assert res["policy_file"] == str(policy.resolve())
    assert res["policy_sha256"] == hashlib.sha256(policy.read_bytes()).hexdigest()
    assert (tmp_path / "plan" / "plan.json").exists()
    assert (tmp_path / "plan" / "plan_gantt.png").exists()
    assert "zero-shot plan" in lines[-1]


@pytest.mark.timeout(240)
def test_plan_default_samples_follow_the_decoding(graph_file: Path, tmp_path: Path) -> None:
    """Without samples=, the shipped generalist (chain decoding) scores up to 1024
    placements: the Viterbi placements of the penalty ladder, then chain samples; the plan
    is the best of them, so never slower than the ladder's Viterbi placements alone."""
    from agents.export import DEFAULT_SAMPLES

    assert DEFAULT_SAMPLES == {"chain": 1024, "independent": 16}
    base = ["+env=rnnlm_k40_4", f"env.graph_file={graph_file}", "env.model=null"]
    res = plan(compose(base, config="plan"), tmp_path / "a", echo=lambda s: None)
    assert (res["samples"], res["decode"]) == (1024, "chain")
    assert 16 < res["oracle_calls"] <= 1024 and res["oom"] is False
    few = plan(compose([*base, "samples=4"], config="plan"), tmp_path / "b", echo=lambda s: None)
    assert few["samples"] == 4 and few["oracle_calls"] <= 4
    assert res["step_time"] <= few["step_time"] + 1e-12
    # the sampling temperature: the policy's default (1) unless temperature= is given
    assert res["temperature"] == 1.0
    flat = compose([*base, "samples=64", "temperature=3"], config="plan")
    hot = plan(flat, tmp_path / "c", echo=lambda s: None)
    assert hot["temperature"] == 3.0 and hot["samples"] == 64
    with pytest.raises(ValueError, match="temperature"):
        plan(compose([*base, "temperature=0"], config="plan"), tmp_path / "d", echo=print)
    # link-aware device changes: the policy's default (1) unless link_exponent= is given
    assert res["link_exponent"] == 1.0
    flat = plan(
        compose([*base, "samples=4", "link_exponent=0"], config="plan"), tmp_path / "e", echo=print
    )
    assert flat["link_exponent"] == 0.0
    with pytest.raises(ValueError, match="link.exponent must be"):
        plan(compose([*base, "link_exponent=-1"], config="plan"), tmp_path / "f", echo=print)


def test_plan_shows_a_progress_bar_unless_told_not_to(
    graph_file: Path, tmp_path: Path, capsys
) -> None:
    """runners.plan draws a bar over the placements it scores (progress=true, the default);
    progress=false draws none and plans the same."""
    base = ["+env=rnnlm_k40_4", f"env.graph_file={graph_file}", "env.model=null", "samples=8"]
    a = plan(compose(base, config="plan"), tmp_path / "a", echo=lambda s: None)
    assert "8/8" in capsys.readouterr().err
    b = plan(compose([*base, "progress=false"], config="plan"), tmp_path / "b", echo=lambda s: None)
    assert capsys.readouterr().err == ""
    assert a["step_time"] == b["step_time"] and a["oracle_calls"] == b["oracle_calls"]


def test_plan_sends_its_result_to_the_logger(graph_file: Path, tmp_path: Path, monkeypatch) -> None:
    """logger= (none by default): the result's figures, the Gantt chart and plan.json go to
    the tracker, which is closed; logger=wandb writes an offline run in the run folder."""
    from runners import tracking

    base = ["+env=rnnlm_k40_4", f"env.graph_file={graph_file}", "env.model=null", "samples=4"]
    assert compose(base, config="plan").logger.kind == "none"
    seen: dict = {}

    class Recording(tracking.NullTracker):
        def summary(self, values):
            seen["summary"] = dict(values)

        def log_image(self, key, path, step=None):
            seen["image"] = (key, Path(path).name)

        def log_artifact(self, path, name, type):
            seen["artifact"] = (Path(path).name, name, type)

        def finish(self):
            seen["finished"] = True

    made = []

    def make(kind, run_dir, config, *, name, options=None):
        made.append((kind, name, config["env"]["name"]))
        return Recording()

    monkeypatch.setattr(tracking, "make_tracker", make)
    res = plan(compose([*base, "logger=tensorboard"], config="plan"), tmp_path / "a", echo=print)
    assert made == [("tensorboard", "rnnlm_k40_4-plan-s0", "rnnlm_k40_4")]
    assert seen["summary"] == {k: res[k] for k in SUMMARY_KEYS}
    assert {"step_time", "oom", "planning_seconds"} <= set(SUMMARY_KEYS)
    assert seen["image"] == ("plots/gantt", "plan_gantt.png")
    assert seen["artifact"] == ("plan.json", "plan-rnnlm_k40_4", "plan") and seen["finished"]
    monkeypatch.undo()
    plan(compose([*base, "logger=wandb"], config="plan"), tmp_path / "w", echo=lambda s: None)
    assert list((tmp_path / "w" / "wandb").glob("offline-run-*")), "no offline wandb run"


def test_plan_missing_policy_file(tmp_path: Path) -> None:
    cfg = compose([f"policy={tmp_path / 'nope.pt'}", "+env=rnnlm_k40_2"], config="plan")
    with pytest.raises(ValueError, match="nope.pt: no such file"):
        plan(cfg, tmp_path)


def test_plan_refuses_a_hybrid_env_before_building_it(tmp_path: Path, monkeypatch) -> None:
    """A hybrid env (layouts, not operator placements) is refused at once with the command
    that plans it; it used to build the 1,024-GPU problem and search op placements for
    20 s before saying that none fits."""
    from runners import common

    def never(*a, **k):
        raise AssertionError("the problem was built")

    monkeypatch.setattr(common, "build_problem", never)
    cfg = compose(["+env=gpt3_175b_a100_1024"], config="plan")
    with pytest.raises(ValueError, match=r"hybrid-parallel problems.*agent=megatron_grid"):
        plan(cfg, tmp_path / "plan", echo=lambda s: None)


_TRAIN = '{"env": "x", "agent": "a", %s}'


@pytest.mark.parametrize(
    "text, says",
    [
        ("{bad", "not valid JSON"),
        ("[1]", "field '(top level)' is [1]; expected an object"),
        ('{"best_step_time": 0.1}', "field 'env' is missing"),
        ('{"planning_seconds": 1, "env": "x"}', "field 'policy' is missing"),
        ('{"env": "x"}', "neither a runners.train nor a runners.plan result"),
        # figures of the wrong sign or type: a negative step time became a table row, a
        # string step time or an unhashable env a TypeError
        (_TRAIN % '"best_step_time": -0.5', "field 'best_step_time' is -0.5"),
        (_TRAIN % '"best_step_time": "fast"', "field 'best_step_time' is 'fast'"),
        (_TRAIN % '"best_step_time": 0.5, "lower_bound": "x"', "field 'lower_bound' is 'x'"),
        (_TRAIN % '"best_step_time": 0.5, "seed": -3', "field 'seed' is -3"),
        (_TRAIN % '"best_step_time": 0.5, "seed": 1.7', "field 'seed' is 1.7"),
        (_TRAIN % '"best_step_time": 0.5, "oracle_calls": "12"', "field 'oracle_calls'"),
        ('{"env": ["x"], "agent": "a", "best_step_time": 0.5}', "field 'env' is ['x']"),
        ('{"env": "x", "agent": 3, "best_step_time": 0.5}', "field 'agent' is 3"),
        ('{"env": "x", "agent": "a", "best_step_time": NaN}', "is nan"),
    ],
)
def test_evaluate_names_a_broken_result_file(tmp_path: Path, text: str, says: str) -> None:
    """A run's result.json cut short (a killed run) or edited: one error naming the file
    (a bare json or KeyError before)."""
    from runners.evaluate import row_of_run

    (tmp_path / "result.json").write_text(text)
    with pytest.raises(ValueError) as info:
        row_of_run(tmp_path)
    assert str(tmp_path / "result.json") in str(info.value) and says in str(info.value)


def test_the_table_prints_what_the_run_printed(tmp_path: Path) -> None:
    """A lower bound of 2.3048 ms: runners.train prints 2.30, the table printed 2.31 (rounded
    to 2.305 first)."""
    from runners import common
    from runners.evaluate import row_of_run, write_tables

    common.write_json(
        tmp_path / "result.json",
        {"env": "e", "agent": "a", "best_step_time": 0.0031248, "lower_bound": 0.0023048},
    )
    row = row_of_run(tmp_path)
    assert f"{row['lower_bound_ms']:.2f}" == common.ms(0.0023048).split()[0] == "2.30"
    write_tables([row], tmp_path)
    assert "| 3.12 ± 0.00 | 2.30 |" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize(
    "override, says",
    [
        (
            "env.env_id=placement_env/Nope-v0",
            "env.env_id 'placement_env/Nope-v0' is not a devplace env",
        ),
        ("+env.env_kwargs.max_devices=1", r"does not use env.env_kwargs \{'max_devices': 1\}"),
    ],
)
def test_plan_refuses_env_settings_it_would_ignore(
    tmp_path: Path, override: str, says: str
) -> None:
    """Found by fuzzing: runners.plan ran with both and ignored them."""
    cfg = compose(["+env=gpt2_tiny_cpu4", "samples=2", override], config="plan")
    with pytest.raises(ValueError, match=says):
        plan(cfg, tmp_path, echo=lambda s: None)


def test_plan_says_which_problem_it_plans_for_a_generator_env(tmp_path: Path) -> None:
    """Found by fuzzing: ``+env=synthetic`` (a generator env) planned its fixed problem
    without saying that the generator is not used."""
    lines: list[str] = []
    cfg = compose(["+env=synthetic", "samples=4"], config="plan")
    result = plan(cfg, tmp_path, echo=lines.append)
    assert lines[0] == (
        "synthetic: env.generator='synthetic' samples training problems for runners.train; "
        "runners.plan plans the env's own problem, gpt2 on dgx1_v100_8"
    )
    assert result["step_time"] > 0 and json.loads((tmp_path / "result.json").read_text())


@pytest.mark.parametrize(
    "overrides, says",
    [
        # found by fuzzing: overrides=['agent=metis'] filed METIS's result under every agent,
        # seeds=[0,0,0] ran one folder three times and reported 3/3 runs
        (["agents=[random]", "overrides=['agent=metis']"],
         r"overrides entry 'agent=metis' sets the agent, which the suite sets for each cell"),
        (["overrides=['seed=5']"], r"overrides entry 'seed=5' sets the seed"),
        (["overrides=['train.timesteps=5']"], r"sets the train.\* budget"),
        (["seeds=[0,0,0]"], r"evaluate: seeds repeats \['0'\]; each cell runs once"),
        (["agents=[metis,metis]"], r"evaluate: agents repeats \['metis'\]"),
        (["envs=[]"], r"evaluate: envs=\[\] names nothing to run"),
        # an option only some agents take failed after the earlier cells had run
        (["envs=[gpt2_tiny_cpu4]", "agents=[anneal,metis]", "overrides=['+agent.options.t0=0.5']"],
         r"cell gpt2_tiny_cpu4 x metis x seed 0: baseline 'metis' has no option\(s\) \['t0'\]"),
        # a bad fine-tuning option was refused only when its cell trained (4 Dec 2026)
        (["envs=[gpt2_tiny_cpu4]", "agents=[chain_finetune]",
          "overrides=['+agent.options.elite=0']"],
         r"cell gpt2_tiny_cpu4 x chain_finetune x seed 0: agent 'chain_finetune': chain_finetune: "
         r"elite must be an integer >= 1, got 0"),
        # a misspelt key inside overrides was hydra's several-line message
        (["envs=[gpt2_tiny_cpu4]", "overrides=['agent.foo=1']"],
         r"cell gpt2_tiny_cpu4 x placeto x seed 0 \(overrides \['agent.foo=1'\]\): "),
    ],
)  # fmt: skip
def test_evaluate_refuses_a_bad_suite_before_any_cell(tmp_path, monkeypatch, overrides, says):
    from runners import evaluate as ev

    monkeypatch.setattr(ev, "train", lambda *a, **k: pytest.fail("a cell was trained"))
    with pytest.raises(ValueError, match=says):
        evaluate(compose(overrides, config="evaluate"), tmp_path, echo=lambda s: None)


def test_evaluate_refuses_runs_of_one_env_name_on_different_problems(tmp_path: Path) -> None:
    """Found by fuzzing: a run on cpu_4 and one on cpu_2, both of env gpt2_tiny_cpu4, were
    averaged into one row under the first one's lower bound."""
    base = ["+env=gpt2_tiny_cpu4", "agent=metis", "logger=none", "env.baselines=[]"]
    train(compose(base), tmp_path / "a", echo=lambda s: None)
    train(compose([*base, "env.cluster=cpu_2"]), tmp_path / "b", echo=lambda s: None)
    cfg = compose([f"runs=[{tmp_path / 'a'},{tmp_path / 'b'}]"], config="evaluate")
    with pytest.raises(
        ValueError, match=r"both ran env 'gpt2_tiny_cpu4' but on different problems"
    ):
        evaluate(cfg, tmp_path / "cmp", echo=lambda s: None)
    train(compose([*base, "seed=1"]), tmp_path / "c", echo=lambda s: None)  # same problem
    cfg = compose([f"runs=[{tmp_path / 'a'},{tmp_path / 'c'}]"], config="evaluate")
    (row,) = aggregate(evaluate(cfg, tmp_path / "ok", echo=lambda s: None))
    assert row["runs"] == 2
    # found by fuzzing: another schedule or memory fraction keeps the lower bound, and such
    # runs were averaged; result.json's problem tells them apart
    for i, other in enumerate(["env.schedule=gpipe", "env.memory_fraction=0.5"]):
        train(compose([*base, "seed=2", other]), tmp_path / f"d{i}", echo=lambda s: None)
        cfg = compose([f"runs=[{tmp_path / 'a'},{tmp_path / f'd{i}'}]"], config="evaluate")
        with pytest.raises(ValueError, match="on different problems") as info:
            evaluate(cfg, tmp_path / f"cmp{i}", echo=lambda s: None)
        assert ("schedule '1f1b' vs 'gpipe'" if i == 0 else "cluster '") in str(info.value)


def test_evaluate_refuses_two_runs_of_one_seed(tmp_path: Path) -> None:
    """Found by fuzzing: seed 0 trained twice was averaged as two seeds. Runs of one seed
    whose settings differ are two methods, labelled by the settings (4 Dec 2026; they were
    refused too); the same settings twice are refused."""
    base = ["+env=gpt2_tiny_cpu4", "agent=metis", "logger=none", "env.baselines=[]"]
    train(compose(base), tmp_path / "a", echo=lambda s: None)
    train(compose([*base[:-1], "env.baselines=[expert]"]), tmp_path / "b", echo=lambda s: None)
    train(compose(base), tmp_path / "c", echo=lambda s: None)
    cfg = compose([f"runs=[{tmp_path / 'a'},{tmp_path / 'c'}]"], config="evaluate")
    with pytest.raises(ValueError, match=r"are both env 'gpt2_tiny_cpu4', agent 'metis', seed 0"):
        evaluate(cfg, tmp_path / "cmp", echo=lambda s: None)
    cfg = compose([f"runs=[{tmp_path / 'a'},{tmp_path / 'b'}]"], config="evaluate")
    rows = evaluate(cfg, tmp_path / "cmp2", echo=lambda s: None)
    assert [r["agent"] for r in rows] == [
        "metis[env.baselines=[]]",
        "metis[env.baselines=['expert']]",
    ]


def test_a_sweep_over_a_setting_is_one_row_per_value_averaged_over_seeds(tmp_path: Path) -> None:
    """``-m agent.budget=4,8 seed=0,1``: its four runs were refused as "two runs of one
    seed" (4 Dec 2026); each budget is now its own row, averaged over its two seeds, and
    settings that are not the method (the logger, the output folder) label nothing."""
    base = ["+env=gpt2_tiny_cpu4", "agent=anneal", "env.baselines=[]"]
    for budget in (4, 8):
        for seed in (0, 1):
            log = "logger=none" if seed == 0 else "logger=tensorboard"
            train(compose([*base, log, f"agent.budget={budget}", f"seed={seed}"]),
                  tmp_path / f"b{budget}" / f"s{seed}", echo=lambda s: None)  # fmt: skip
    cfg = compose([f"runs=[{tmp_path}]"], config="evaluate")
    cells = aggregate(evaluate(cfg, tmp_path / "cmp", echo=lambda s: None))
    assert [(c["agent"], c["runs"]) for c in cells] == [
        ("anneal[agent.budget=4]", 2),
        ("anneal[agent.budget=8]", 2),
    ]


def test_evaluate_names_the_run_folders_it_leaves_out(tmp_path: Path) -> None:
    """A sweep folder with a failed job (error.txt, no result.json) and a killed one
    (train.log and a checkpoint only) was compared as if they did not exist (fuzzing)."""
    base = ["+env=gpt2_tiny_cpu4", "agent=metis", "logger=none", "env.baselines=[]"]
    sweep = tmp_path / "sweep"
    train(compose(base), sweep / "0", echo=lambda s: None)
    (sweep / "1").mkdir()
    (sweep / "1" / "error.txt").write_text("ValueError: the problem\nTraceback ...\n")
    (sweep / "2" / ".hydra").mkdir(parents=True)
    (sweep / "2" / "train.log").write_text("started\n")
    (sweep / "3").mkdir()  # an interrupted runners.evaluate cell: no train.log (fuzzing)
    (sweep / "3" / "run_info.json").write_text("{}")
    (sweep / "0" / ".hydra").mkdir()
    (sweep / "0" / ".hydra" / "error.txt").write_text("not a run folder\n")  # hydra's own
    (sweep / "4").mkdir()  # a run going on now: its runner holds the folder's lock
    (sweep / "4" / "train.log").write_text("started\n")
    lines: list[str] = []
    cfg = compose([f"runs=[{sweep}]"], config="evaluate")
    with folder_lock.held(sweep / "4", "train"):
        (row,) = aggregate(evaluate(cfg, tmp_path / "cmp", echo=lines.append))
    assert row["runs"] == 1
    left = [ln for ln in lines if "left out" in ln]
    assert left == [
        f"evaluate: left out, no result.json: {sweep / '1'} (failed: ValueError: the problem)",
        f"evaluate: left out, no result.json: {sweep / '2'} (unfinished: killed or still running)",
        f"evaluate: left out, no result.json: {sweep / '3'} (unfinished: killed or still running)",
        f"evaluate: left out, no result.json: {sweep / '4'} (still running: runners.train "
        f"(pid {os.getpid()} on {socket.gethostname()}, since {left[3][-25:-2]}))",
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", left[3][-25:-2])
    md = (tmp_path / "cmp" / "results.md").read_text()
    assert f"- left out, no result.json: {sweep / '1'} (failed" in md


def test_evaluate_does_not_take_a_killed_commands_earlier_run_folder_for_a_run(
    tmp_path: Path,
) -> None:
    """`kill -9` of a new run before its first checkpoint leaves the earlier run's files in
    .earlier_run/ (runners.train puts them back at its next command); evaluate took that
    hidden folder for a run of its own: a sweep's job counted twice, refused as two runs of
    one seed (3 Dec 2026)."""
    from runners.train import EARLIER_RUN

    base = ["+env=gpt2_tiny_cpu4", "agent=metis", "logger=none", "env.baselines=[]"]
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        train(compose(base), sweep / job, echo=lambda s: None)
        (sweep / job / EARLIER_RUN).mkdir()
        (sweep / job / "result.json").replace(sweep / job / EARLIER_RUN / "result.json")
    (sweep / "1" / EARLIER_RUN / "result.json").replace(sweep / "1" / "result.json")
    (sweep / "1" / EARLIER_RUN / "result.json").write_bytes(
        (sweep / "1" / "result.json").read_bytes()
    )
    lines: list[str] = []
    train(compose([*base, "seed=1"]), sweep / ".2", echo=lambda s: None)  # a dot-folder's run
    (row,) = aggregate(evaluate(compose([f"runs=[{sweep}]"], config="evaluate"),
                                tmp_path / "cmp", echo=lines.append))  # fmt: skip
    assert row["runs"] == 2  # jobs 1 and .2; job 0 only has the set-aside result
    assert any(f"{sweep / '0'} (unfinished: killed or still running; the earlier run's result "
               f"is set aside in {EARLIER_RUN}/" in ln for ln in lines), lines  # fmt: skip
    cfg = compose([f"runs=[{sweep / '0'}]"], config="evaluate")
    with pytest.raises(ValueError, match=r"left the earlier run's in .*\.earlier_run: the next"):
        evaluate(cfg, tmp_path / "cmp0", echo=lambda s: None)


def test_a_plan_of_the_shipped_generalist_is_named_by_its_name(tmp_path: Path) -> None:
    """`runners.plan` with the default generalist was tabulated as `plan:pretrained` (the
    folder of the shipped file; 3 Dec 2026); a trained policy stays `plan:FOLDER`."""
    from runners.evaluate import policy_label

    cfg = compose(["+env=gpt2_tiny_cpu4", "policy=generalist", "samples=2"], config="plan")
    plan(cfg, tmp_path / "p", echo=lambda s: None)
    (row,) = evaluate(compose([f"runs=[{tmp_path / 'p'}]"], config="evaluate"), tmp_path / "cmp",
                      echo=lambda s: None)  # fmt: skip
    assert row["agent"] == "plan:generalist"
    assert policy_label("outputs/j/train/policy.pt") == "train"
    assert policy_label("policy.pt") == "policy"
    assert policy_label("/venv/lib/site-packages/agents/pretrained/generalist.pt") == "generalist"


def test_plan_names_a_policy_a_killed_training_command_set_aside(tmp_path: Path) -> None:
    """`policy=RUN/policy.pt` after a kill -9 of a new run in RUN said only "no such file"."""
    run = tmp_path / "run"
    (run / ".earlier_run").mkdir(parents=True)
    (run / ".earlier_run" / "policy.pt").write_bytes(b"x")
    cfg = compose(["+env=gpt2_tiny_cpu4", f"policy={run / 'policy.pt'}"], config="plan")
    with pytest.raises(
        ValueError, match=r"no such file \(a runners.train command stopped .* set it aside as"
    ):
        plan(cfg, tmp_path / "p", echo=lambda s: None)
    ov = ["+env=gpt2_tiny_cpu4", "logger=none", f"agent.init_policy={run / 'policy.pt'}"]
    with pytest.raises(ValueError, match=r"agent.init_policy=.*: no such file \(a runners.train"):
        train(compose(ov), tmp_path / "t", echo=lambda s: None)


def test_a_refused_evaluate_leaves_the_earlier_config_and_hydra_files(tmp_path: Path) -> None:
    """A refused runners.evaluate in a used folder left its config.yaml beside the earlier
    command's results.md, and so .hydra/ was not put back either (fuzzing, 3 Dec 2026)."""
    import subprocess
    import sys

    base = ["+env=gpt2_tiny_cpu4", "agent=metis", "logger=none", "env.baselines=[]"]
    train(compose(base), tmp_path / "a", echo=lambda s: None)
    ev = tmp_path / "ev"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run(runs: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runners.evaluate", f"runs=[{runs}]",
                               f"output_dir={ev}"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=240)  # fmt: skip

    assert run(str(tmp_path / "a")).returncode == 0
    before = {
        p.name: p.read_bytes() for p in [ev / "config.yaml", *sorted((ev / ".hydra").iterdir())]
    }
    refused = run(str(tmp_path / "nosuch"))
    assert refused.returncode == 2 and "does not exist" in refused.stderr, refused.stderr[-2000:]
    after = {
        p.name: p.read_bytes() for p in [ev / "config.yaml", *sorted((ev / ".hydra").iterdir())]
    }
    assert after == before


def test_problem_identity_tells_scoring_models_and_env_kinds_apart() -> None:
    """Found by fuzzing (2 Dec 2026): a hybrid-calibrated cpu_2 (CpuHybridModel, not in the
    cluster's content hash) and a plain one (HybridModel) gave one `problem`, so runs scored
    10.61 and 0.51 ms were averaged as two seeds; an op-level and a hybrid run of one env had
    one `problem` too; and two hybrid runs differing only in the unused env.microbatches were
    refused as different problems."""
    import dataclasses

    from runners import common

    def problem(*ov: str) -> common.Problem:
        cfg = compose(["+env=gpt2_tiny_cpu4", *ov])
        return common.build_problem(common.env_spec(cfg.env))

    hyb = ["env.env_id=placement_env/Hybrid-v0"]
    op, h = common.problem_identity(problem()), common.problem_identity(problem(*hyb))
    assert op["env_id"] == "placement_env/Sweep-v0" and h["env_id"] == "placement_env/Hybrid-v0"
    assert h["hybrid_model"] == "HybridModel" and "hybrid_model" not in op
    assert common.problem_identity(problem(*hyb, "env.microbatches=2")) == h
    p = problem(*hyb)
    meta = {**p.cluster.meta, "hybrid_calibration": {"gemm": [1.0, 2.0]}}
    cal = dataclasses.replace(p, cluster=dataclasses.replace(p.cluster, meta=meta))
    assert cal.cluster.content_hash() == p.cluster.content_hash()  # by design
    got = common.problem_identity(cal)
    assert got["hybrid_model"].startswith("CpuHybridModel ") and got != h


@pytest.mark.timeout(240)
def test_a_folder_named_generalist_does_not_shadow_the_shipped_policy(
    tmp_path: Path, monkeypatch
) -> None:
    """A run folder ``generalist/`` in the current folder (``output_dir=generalist``) made
    ``runners.plan`` without ``policy=`` fail with "generalist is a folder" (4 Dec 2026): a
    folder is never a policy file, so the shipped name wins; a *file* of that name still
    does (the documented rule, ``tests/agents/test_generalist.py``)."""
    import hashlib

    from agents import load_policy
    from agents.export import resolve_policy
    from agents.generalist import shipped_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "generalist").mkdir()
    (tmp_path / "generalist" / "result.json").write_text("{}\n")
    shipped = shipped_path("generalist")
    assert resolve_policy("generalist") == shipped
    assert load_policy("generalist").meta == load_policy(shipped).meta
    cfg = compose(["+env=gpt2_tiny_cpu4", "samples=2"], config="plan")  # no policy=
    res = plan(cfg, tmp_path / "p", echo=lambda s: None)
    assert res["policy_file"] == str(shipped.resolve())
    assert res["policy_sha256"] == hashlib.sha256(shipped.read_bytes()).hexdigest()
    assert res["step_time"] > 0 and res["oom"] is False


@pytest.mark.timeout(300)
def test_plans_of_two_policies_whose_folders_share_a_name_are_told_apart(
    graph_file: Path, tmp_path: Path
) -> None:
    """``runners.plan`` runs of ``a/train/policy.pt`` and ``b/train/policy.pt`` (two trained
    policies) were both ``plan:train``: on one env refused as "two runs of one seed", across
    envs one table row of two policies (4 Dec 2026). Now each label carries its weights'
    digest; one policy planned on two envs keeps the plain label."""
    import hashlib

    ov = [*small_env(graph_file), "env.baselines=[]", "train.timesteps=128", "agent.ppo.n_steps=64"]
    digests = {}
    for name, seed in (("a", 0), ("b", 1)):
        train(compose([*ov, f"seed={seed}"]), tmp_path / name / "train", echo=lambda s: None)
        pol = tmp_path / name / "train" / "policy.pt"
        digests[name] = hashlib.sha256(pol.read_bytes()).hexdigest()
    assert digests["a"] != digests["b"]

    def plan_with(name: str, env: str, out: str) -> Path:
        cfg = compose(
            [f"policy={tmp_path / name / 'train' / 'policy.pt'}", f"+env={env}",
             f"env.graph_file={graph_file}", "env.model=null", "samples=2"],
            config="plan",
        )  # fmt: skip
        plan(cfg, tmp_path / out, echo=lambda s: None)
        return tmp_path / out

    runs = [plan_with("a", "rnnlm_k40_4", "pa"), plan_with("b", "rnnlm_k40_4", "pb")]
    cfg = compose([f"runs=[{','.join(map(str, runs))}]"], config="evaluate")
    rows = evaluate(cfg, tmp_path / "cmp", echo=lambda s: None)
    assert sorted(r["agent"] for r in rows) == sorted(
        f"plan:train@{digests[n][:8]}" for n in ("a", "b")
    )
    assert f"plan:train@{digests['a'][:8]}" in (tmp_path / "cmp" / "results.md").read_text()
    # one policy on two envs: one label, no digest
    runs = [plan_with("a", "rnnlm_k40_4", "qa"), plan_with("a", "rnnlm_k40_2", "qb")]
    cfg = compose([f"runs=[{','.join(map(str, runs))}]"], config="evaluate")
    rows = evaluate(cfg, tmp_path / "cmp2", echo=lambda s: None)
    assert [r["agent"] for r in rows] == ["plan:train", "plan:train"]


@pytest.mark.timeout(300)
def test_a_run_started_from_a_policy_is_another_row_than_the_agent_from_scratch(
    graph_file: Path, tmp_path: Path
) -> None:
    """PPO from scratch and PPO from the generalist (``agent.init_policy=generalist``) of one
    env and seed -- the comparison docs/generalisation.md makes -- were both ``gdp``: refused
    as "two runs of one seed" (across seeds: one row averaging both; 4 Dec 2026)."""
    ov = [*small_env(graph_file), "agent=gdp", "env.baselines=[]", "train.timesteps=32",
          "agent.ppo.n_steps=16"]  # fmt: skip
    train(compose(ov), tmp_path / "scratch", echo=lambda s: None)
    train(compose([*ov, "agent.init_policy=generalist"]), tmp_path / "init", echo=lambda s: None)
    cfg = compose([f"runs=[{tmp_path / 'scratch'},{tmp_path / 'init'}]"], config="evaluate")
    rows = evaluate(cfg, tmp_path / "cmp", echo=lambda s: None)
    assert sorted(r["agent"] for r in rows) == ["gdp", "gdp+generalist"]
    assert "gdp+generalist" in (tmp_path / "cmp" / "results.md").read_text()


@pytest.mark.timeout(300)
def test_plan_runs_of_other_seeds_and_samples_are_seeds_and_rows(tmp_path: Path) -> None:
    """``runners.plan -m samples=4,16 seed=0,1``: every plan run counted as seed 0 of
    ``plan:generalist``, so the sweep was refused as "two runs of one seed" (4 Dec 2026).
    The plan's seed is its seed now, and the number of samples its own row."""
    for samples in (4, 16):
        for seed in (0, 1):
            cfg = compose(["+env=gpt2_tiny_cpu4", f"samples={samples}", f"seed={seed}",
                           "progress=false"], config="plan")  # fmt: skip
            res = plan(cfg, tmp_path / f"k{samples}" / f"s{seed}", echo=lambda s: None)
            assert res["seed"] == seed and res["samples"] == samples and res["greedy"] is True
    rows = evaluate(compose([f"runs=[{tmp_path}]"], config="evaluate"), tmp_path / "cmp",
                    echo=lambda s: None)  # fmt: skip
    assert sorted((r["agent"], r["seed"]) for r in rows) == [
        ("plan:generalist[samples=16]", 0), ("plan:generalist[samples=16]", 1),
        ("plan:generalist[samples=4]", 0), ("plan:generalist[samples=4]", 1),
    ]  # fmt: skip
    assert [c["runs"] for c in aggregate(rows)] == [2, 2]
