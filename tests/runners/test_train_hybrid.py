"""runners.train on a hybrid-parallel env: a hybrid planner's layout, step time, TFLOP/s, MFU and memory in result.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphs.plan import Plan
from runners.train import CrashForTest, train
from tests.runners.conftest import compose

SMALL = [
    "+env=gpt3_175b_a100_1024",
    # a 1.3B GPT on 2 DGX A100 nodes keeps the test fast; the env's entry point is the same
    "env.model_config={hidden: 2048, layers: 24, heads: 16, vocab: 51200, seq: 2048, batch: 64}",
    "env.cluster=dgx_a100_80g_x2",
    "env.baselines=[alpa]",
    "logger=none",
    "train.progress=false",
]


@pytest.mark.timeout(600)
def test_megatron_grid_run_writes_the_layout(tmp_path: Path) -> None:
    cfg = compose([*SMALL, "agent=megatron_grid"])
    lines: list[str] = []
    res = train(cfg, tmp_path, echo=lines.append)
    # the env's microbatches and schedule are not the layouts': the header used to show them
    assert (
        "microbatches and schedule per layout (env.microbatches, env.schedule unused)" in lines[0]
    )
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["layout"] == res["layout"]
    lay = res["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 16 and lay["global_batch"] == 64
    assert not res["oom"] and res["best_step_time"] == pytest.approx(res["step_time"])
    assert 0 < res["mfu"] < 1 and res["tflops_per_gpu"] == pytest.approx(res["mfu"] * 312)
    assert 0 < res["memory_per_gpu"] <= 80 * 2**30
    assert res["lower_bound"] < res["best_step_time"]
    # alpa searches a superset of the grid's v = 1 layouts, the grid all v: neither beats the other by much
    assert res["speedup_vs"]["alpa"] == pytest.approx(1.0, rel=0.1)
    plan = Plan.load(tmp_path / "best_plan.json")
    assert plan.layout is not None and plan.layout.to_dict() == lay
    assert plan.meta["algorithm"] == "megatron_grid"


@pytest.mark.timeout(600)
def test_op_level_sac_through_the_runner_lowers_selective_memory(tmp_path: Path) -> None:
    """The env's model_config takes the model's switches: with FlashAttention on, the grid
    restricted to selective recomputation (agent.options) finds a layout whose memory per
    GPU is lower under torchtitan's op-level SAC than under Korthikanti's selective
    recomputation (which keeps every activation but the attention core); the step model is
    the same (the switch is memory only)."""
    out = {}
    for sac in (False, True):
        cfg = compose(
            [
                *SMALL,
                "+env.model_config.flash_attention=true",
                f"+env.model_config.op_level_sac={str(sac).lower()}",
                "agent=megatron_grid",
                "+agent.options.recompute=[selective]",
            ]
        )
        run = tmp_path / f"sac_{sac}"
        out[sac] = train(cfg, run, echo=lambda s: None)
        assert json.loads((run / "result.json").read_text())["layout"]["recompute"] == "selective"
        assert Plan.load(run / "best_plan.json").layout.recompute == "selective"
    # both fit easily here, so the grid picks the same (fastest) layout: 5.0 vs 3.5 GiB
    assert out[True]["layout"] == out[False]["layout"]
    assert out[True]["best_step_time"] == pytest.approx(out[False]["best_step_time"], rel=1e-12)
    assert out[True]["memory_per_gpu"] < 0.8 * out[False]["memory_per_gpu"]


@pytest.mark.timeout(600)
def test_megatron_bf16_keywords_through_the_runner(tmp_path: Path) -> None:
    """``grad_bytes`` (Megatron-LM's fp32 gradient buffer under bf16) and ``dropout`` are
    model_config keys like the switches above: the run's memory per GPU is that of its
    layout on the model built with them, not without; a bad value is refused by name."""
    from graphs import clusters, zoo
    from placement_env.oracles.hybrid import HybridModel

    cfg = compose(
        [*SMALL, "+env.model_config.grad_bytes=4", "+env.model_config.dropout=false",
         "agent=megatron_grid", "+agent.options.zero=[0]"]
    )  # fmt: skip
    res = train(cfg, tmp_path / "run", echo=lambda s: None)
    plan = Plan.load(tmp_path / "run" / "best_plan.json")
    dims = dict(hidden=2048, layers=24, heads=16, vocab=51200, seq=2048, batch=64)
    cl = clusters.load("dgx_a100_80g", nodes=2)
    mem = {}
    for kw in ({}, {"grad_bytes": 4, "dropout": False}):
        g = zoo.build("gpt", **dims, **kw)
        mem[bool(kw)] = float(HybridModel(g, cl).evaluate(plan.layout).peak_memory.max())
    assert res["memory_per_gpu"] == pytest.approx(mem[True], rel=1e-9)
    assert mem[True] != pytest.approx(mem[False], rel=1e-3)
    with pytest.raises(Exception, match="grad_bytes"):
        train(compose([*SMALL, "+env.model_config.grad_bytes=-1", "agent=megatron_grid"]),
              tmp_path / "bad", echo=lambda s: None)  # fmt: skip


@pytest.mark.timeout(600)
def test_alpa_run_writes_per_stage_submeshes_and_execute_refuses_it_for_this_machine(
    tmp_path: Path,
) -> None:
    """Journey: ``runners.train ... agent=alpa`` on a problem where the inter-op DP's
    per-stage submeshes win (GPT, 16 layers, 128k vocabulary, 8 V100s, no ZeRO) writes the
    layout with ``stage_meshes`` to result.json and best_plan.json; ``runners.execute`` on
    that plan builds the parametric ``gpt``'s module on the meta device and, with
    ``rehearse=true``, stops before launch because 8 processes of a 3.3B model do not fit
    this machine's memory, saying so -- not at the layout: plans with per-stage submeshes
    run, and so do plans of small parametric models (``tests/runners/test_execute_cli.py``)."""
    import subprocess
    import sys

    cfg = compose(
        [
            "+env=gpt3_175b_a100_1024",
            "env.model_config={hidden: 4096, layers: 16, heads: 32, vocab: 128000, seq: 2048, batch: 32}",
            "env.cluster=dgx1_v100_8",
            "env.baselines=[]",
            "agent=alpa",
            "+agent.options.zero=[0]",
            "logger=none",
            "train.progress=false",
        ]
    )
    res = train(cfg, tmp_path / "train", echo=lambda s: None)
    lay = res["layout"]
    assert len(lay["stage_meshes"]) == lay["pp"] and lay["zero"] == 0
    assert sum(d * t for d, t in lay["stage_meshes"]) == 8
    assert len(set(map(tuple, lay["stage_meshes"]))) > 1
    assert len(res["memory_per_stage"]) == lay["pp"]
    plan = Plan.load(tmp_path / "train" / "best_plan.json")
    assert plan.layout.to_dict() == lay and plan.meta["submesh_layouts_scored"] >= 1
    out = tmp_path / "exec"
    proc = subprocess.run(
        [sys.executable, "-m", "runners.execute", f"plan={tmp_path / 'train' / 'best_plan.json'}",
         f"hydra.run.dir={out}", "rehearse=true"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    error = (out / "error.txt").read_text()
    assert "WrongMachine" in error and "needs about" in error and "8 GPUs" in error, error
    assert "stage_meshes" not in error and "parametric" not in error


def test_op_placement_agent_is_refused_on_a_hybrid_env(tmp_path: Path) -> None:
    cfg = compose([*SMALL, "env.baselines=[]", "agent=round_robin"])
    with pytest.raises(ValueError, match="agent 'round_robin' places operators; use agent=ppo"):
        train(cfg, tmp_path, echo=lambda s: None)


# PPO on Hybrid-v0: a 4-layer GPT on one DGX A100 (8 GPUs), two PPO updates of 16 steps
TINY_PPO = [
    "+env=gpt3_175b_a100_1024",
    "env.model_config={hidden: 1024, layers: 4, heads: 16, vocab: 51200, seq: 1024, batch: 16}",
    "env.cluster=dgx_a100_80g_x1",
    "env.baselines=[megatron_grid]",
    "agent=ppo",
    "agent.ppo.n_steps=16",
    "agent.ppo.batch_size=16",
    "train.timesteps=32",
    "train.checkpoint_every=1",
    "logger=none",
    "train.progress=false",
]


def test_ppo_run_writes_the_layout_and_resumes_exactly(tmp_path: Path) -> None:
    res = train(compose(TINY_PPO), tmp_path / "a", echo=lambda s: None)
    assert res["agent"] == "ppo" and res["timesteps"] == 32 and not res["oom"]
    assert res["meta"]["policy"] == "MultiInputPolicy" and res["meta"]["updates"] == 2
    # every step and each episode's reset is one oracle call (the actions are masked: no no-ops)
    assert res["oracle_calls"] == 33
    lay = res["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 8 and lay["global_batch"] == 16
    for key in ("step_time", "tflops_per_gpu", "mfu", "memory_per_gpu", "wall_seconds"):
        assert res[key] > 0, key
    assert res["best_step_time"] == pytest.approx(res["step_time"])
    assert res["tflops_per_gpu"] == pytest.approx(res["mfu"] * 312)
    assert res["lower_bound"] < res["best_step_time"]
    assert "megatron_grid" in res["speedup_vs"]
    plan = Plan.load(tmp_path / "a" / "best_plan.json")
    assert plan.layout is not None and plan.layout.to_dict() == lay
    assert plan.meta["algorithm"] == "ppo" and plan.meta["oracle_calls"] == 33
    assert not (tmp_path / "a" / "policy.pt").exists()  # MultiInputPolicy: nothing to plan with
    curve = res["meta"]["curve"]  # (timesteps, oracle calls, wall s, best)
    assert curve and curve[-1][3] == pytest.approx(res["best_step_time"])

    # killed after its first update (checkpointed), then resumed: the same run (no baselines:
    # they only cost time, and PPO's episodes do not depend on them)
    b, quiet = tmp_path / "b", [*TINY_PPO, "env.baselines=[]"]
    with pytest.raises(CrashForTest):
        train(compose([*quiet, "train.crash_after_updates=1"]), b, echo=lambda s: None)
    assert (b / "checkpoint.pkl").exists() and not (b / "result.json").exists()
    again = train(compose([*quiet, f"resume={b}"]), b, echo=lambda s: None)
    assert again["layout"] == lay and again["best_step_time"] == res["best_step_time"]
    assert again["timesteps"] == 32 and again["oracle_calls"] == res["oracle_calls"]


@pytest.mark.parametrize(
    ("override", "match"),
    [("agent.policy=placeto", "MultiInputPolicy"), ("agent.init_policy=generalist", "init_policy")],
)
def test_ppo_refuses_graph_policy_options_on_a_hybrid_env(
    tmp_path: Path, override: str, match: str
) -> None:
    cfg = compose([*TINY_PPO, "env.baselines=[]", override])
    with pytest.raises(ValueError, match=match):
        train(cfg, tmp_path, echo=lambda s: None)


def test_ppo_with_per_stage_zero_moves(tmp_path: Path) -> None:
    # +env.env_kwargs.stage_zero=true gives PPO the env's per-stage ZeRO moves; the run and
    # its plan file work as without them, and a value that is not a boolean is refused by name
    quiet = [*TINY_PPO, "env.baselines=[]"]
    res = train(compose([*quiet, "+env.env_kwargs.stage_zero=true"]), tmp_path / "z",
                echo=lambda s: None)  # fmt: skip
    assert res["timesteps"] == 32 and res["oracle_calls"] == 33 and not res["oom"]
    lay = res["layout"]
    assert lay["dp"] * lay["tp"] * lay["pp"] == 8
    assert Plan.load(tmp_path / "z" / "best_plan.json").layout.to_dict() == lay
    with pytest.raises(ValueError, match="stage_zero 'yes': expected true or false"):
        train(compose([*quiet, "+env.env_kwargs.stage_zero=yes"]), tmp_path / "bad",
              echo=lambda s: None)  # fmt: skip


@pytest.mark.timeout(600)
def test_memory_fraction_caps_what_the_grid_may_use(tmp_path: Path) -> None:
    # the 1.3B GPT's fastest grid layout uses some memory M; with env.memory_fraction set so
    # that only 0.9 M fits, the grid must pick another layout, under that share of 80 GiB
    quiet = [*SMALL, "env.baselines=[]", "agent=megatron_grid"]
    free = train(compose(quiet), tmp_path / "a", echo=lambda s: None)
    frac = 0.9 * free["memory_per_gpu"] / (80 * 2**30)
    capped = train(
        compose([*quiet, f"env.memory_fraction={frac:.6f}"]), tmp_path / "b", echo=lambda s: None
    )
    assert capped["layout"] != free["layout"] and not capped["oom"]
    assert capped["memory_per_gpu"] <= frac * 80 * 2**30
    assert free["memory_capacity_per_gpu"] == 80 * 2**30
    assert capped["memory_capacity_per_gpu"] == pytest.approx(frac * 80 * 2**30, rel=1e-5)
    assert capped["best_step_time"] >= free["best_step_time"]
    with pytest.raises(
        ValueError, match=r"env\.memory_fraction' is 1\.5; expected a finite number > 0 and <= 1"
    ):
        train(compose([*quiet, "env.memory_fraction=1.5"]), tmp_path / "c", echo=lambda s: None)


def test_header_names_the_step_model_and_how_to_calibrate_a_cpu_cluster(tmp_path: Path) -> None:
    # on a cpu_N without a hybrid calibration the layouts are scored by the GPU-style model
    # with nominal CPU figures: the run says so, and how to get the calibrated model
    lines: list[str] = []
    base = ["+env=gpt2_cpu4_hybrid", "agent=megatron_grid", "env.baselines=[]",
            "logger=none", "train.progress=false"]  # fmt: skip
    train(compose(base), tmp_path / "cpu", echo=lines.append)
    assert "(layouts scored by HybridModel with the CPUs' nominal figures" in lines[0]
    assert "python -m runners.profile calibration=PATH hybrid.model=..." in lines[0]
    # a calibration without a hybrid section: the measured device figures, not nominal ones
    # (it said "nominal figures, not this machine's": a docs walk-through, 30 Nov 2026)
    import json

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"device": {"peak_flops": 1e9, "memory": 2**30}}))
    lines.clear()
    train(compose([*base, f"env.cluster=cpu_4@{cal}"]), tmp_path / "cal", echo=lines.append)
    assert "with this machine's measured device figures; the calibration has no hybrid" in lines[0]
    lines.clear()
    train(compose([*SMALL, "agent=megatron_grid"]), tmp_path / "gpu", echo=lines.append)
    assert lines[0].endswith("oracle simulator (layouts scored by HybridModel)")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["agent=megatron_grid", "env.baselines=[expert,pipedream_dp]"],
         r"env.baselines \['expert', 'pipedream_dp'\] place operators"),
        (["agent=metis", "env.baselines=[]"], "agent 'metis' places operators"),
    ],
)  # fmt: skip
def test_op_planners_are_refused_on_a_hybrid_env_before_any_runs(
    tmp_path: Path, monkeypatch, overrides: list[str], says: str
) -> None:
    """Op-placement baselines on a hybrid env used to run and be scored by the op simulator,
    so the speed-ups against them compared two models (`expert` 514.90 ms, x2.71); an op
    agent was refused only after the baselines had run."""
    from agents import baselines
    from runners import common

    assert set(baselines.HYBRID_PLANNERS) <= set(baselines.names())
    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    with pytest.raises(ValueError, match=says):
        train(compose([*SMALL, *overrides]), tmp_path, echo=lambda s: None)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["agent=pipedream", "env.baselines=[]"], "agent 'pipedream' plans data x tensor"),
        (["agent=megatron_grid", "env.baselines=[expert]"], "agent 'megatron_grid' plans"),
        (["agent=metis", "env.baselines=[expert,alpa,hybrid_anneal]"],
         r"env.baselines \['alpa', 'hybrid_anneal'\] plan data x tensor"),
    ],
)  # fmt: skip
def test_hybrid_planners_are_refused_on_an_op_env_before_any_runs(
    tmp_path: Path, monkeypatch, overrides: list[str], says: str
) -> None:
    """The reverse: on an op-placement env a hybrid planner's layout was scored as the op
    placement of each stage's first device (`agent=pipedream` on gpt2_tiny_cpu4 printed
    `best 4.50 ms` for a layout its planner scored 1.59 ms; as a baseline it printed
    `pipedream 1.59 ms`, below the env's 2.04 ms lower bound). The error says how to plan
    the model's layouts instead, which works."""
    from runners import common

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    op_env = ["+env=gpt2_tiny_cpu4", "logger=none", "train.progress=false"]
    with pytest.raises(ValueError, match=says) as err:
        train(compose([*op_env, *overrides]), tmp_path / "op", echo=lambda s: None)
    assert "env.env_id=placement_env/Hybrid-v0" in str(err.value)
    monkeypatch.undo()
    hybrid = compose(
        [*op_env, "env.env_id=placement_env/Hybrid-v0", "agent=pipedream", "env.baselines=[]"]
    )
    train(hybrid, tmp_path / "hybrid", echo=lambda s: None)
    res = json.loads((tmp_path / "hybrid" / "result.json").read_text())
    assert res["layout"]["pp"] >= 1 and res["best_step_time"] == res["meta"]["planner"]["step_time"]


def test_a_planner_batch_other_than_the_models_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`agent.options.global_batch=7` on a model of batch 8 wrote a plan of batch 7 that
    names the batch-8 model, which `runners.execute` then refused; the model's own batch
    given as the option is taken."""
    from runners import common

    tiny = [
        "+env=gpt3_175b_a100_1024", "env.cluster=cpu_4", "env.baselines=[]", "logger=none",
        "env.model_config={hidden: 64, layers: 4, heads: 4, vocab: 512, seq: 32, batch: 8}",
        "agent=pipedream", "train.progress=false",
    ]  # fmt: skip
    real = common.run_baselines
    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    with pytest.raises(ValueError, match=r"global_batch=7 is not the model's batch \(8 samples"):
        train(compose([*tiny, "+agent.options.global_batch=7"]), tmp_path / "a", echo=print)
    monkeypatch.setattr(common, "run_baselines", real)
    train(compose([*tiny, "+agent.options.global_batch=8"]), tmp_path / "b", echo=print)
    assert json.loads((tmp_path / "b" / "result.json").read_text())["layout"]["global_batch"] == 8


def test_an_env_global_batch_other_than_the_models_is_refused(tmp_path: Path, monkeypatch):
    """Found by fuzzing: `+env.env_kwargs.global_batch=2` on a model of batch 8 let PPO plan
    batch 2 and print a speed-up over megatron_grid's batch-8 layouts (below the lower
    bound); `runners.execute` then refused the plan."""
    from runners import common

    monkeypatch.setattr(common, "run_baselines", lambda *a, **k: pytest.fail("a baseline ran"))
    ov = ["+env=gpt2_cpu4_hybrid", "agent=ppo", "logger=none", "train.timesteps=8",
          "env.baselines=[megatron_grid]"]  # fmt: skip
    with pytest.raises(ValueError, match=r"env.env_kwargs.global_batch=2 is not the model's batch "
                       r"\(8 samples per step\)"):  # fmt: skip
        train(compose([*ov, "+env.env_kwargs.global_batch=2"]), tmp_path / "a", echo=print)


def test_a_planner_without_a_plan_says_why_on_the_terminal(tmp_path: Path) -> None:
    """GPT-3 175B on 4 CPU processes fits no layout: the run used to end with `best n/a
    (OOM)` and the planners' reasons only in result.json."""
    lines: list[str] = []
    cfg = compose(
        ["+env=gpt3_175b_a100_1024", "env.cluster=cpu_4", "agent=pipedream",
         "env.baselines=[megatron_grid]", "logger=none", "train.progress=false"]
    )  # fmt: skip
    train(cfg, tmp_path, echo=lines.append)
    (base,) = [ln for ln in lines if ln.startswith("baseline megatron_grid")]
    assert "no plan" in base and base.endswith("(least peak memory 652.29 GiB)")
    assert ": none of 672 layouts of 'gpt' fits on 'cpu_4'" in base
    (own,) = [ln for ln in lines if ln.startswith("pipedream: no plan: ")]
    assert own.startswith("pipedream: no plan: no split of 'gpt' on 'cpu_4' fits")
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["oom"] and res["meta"]["error"].startswith("pipedream: no split")
