"""runners.execute: the default cluster of a plan and the ``cluster=`` command-line key."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphs.compgraph import CompGraph
from graphs.io import save
from graphs.plan import Plan
from runners.execute import resolve
from tests.runners.conftest import run_cli_module

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> CompGraph:
    return CompGraph.build(3, [(0, 1), (1, 2)], flops=[1.0, 1.0, 1.0], meta={"name": "chain3"})


def _stamped(**kw) -> Plan:
    from graphs.clusters import load

    return Plan.for_graph(np.array([0, 1, 1]), _graph(), load("cpu_2"), **kw)


def test_default_cluster_counts_devices(tmp_path: Path) -> None:
    g = _graph()
    path = tmp_path / "g.json"
    save(g, path)
    model = {"meta": {"model": {"name": "any"}}}  # execute needs one; the cluster does not
    _, cluster = resolve(Plan(np.array([0, 1, 2]), **model), str(path), None)
    assert cluster.num_devices == 3
    # a pipeline x tensor-parallel plan: stages on devices 0 and 2, each a tp group of 2
    plan = Plan(
        np.array([0, 0, 2]), stage=np.array([0, 0, 1]), stage_device=(0, 2), tp_degree={0: 2},
        **model,
    )  # fmt: skip
    _, cluster = resolve(plan, str(path), None)
    assert cluster.num_devices == 4
    _, cluster = resolve(plan, str(path), "cpu_6")
    assert cluster.num_devices == 6


def test_a_plan_without_model_is_refused_naming_why(tmp_path: Path) -> None:

    with pytest.raises(ValueError, match="graph file g.json, which holds costs"):
        resolve(Plan(np.array([0, 1]), meta={"graph_file": "g.json"}), None, None)
    with pytest.raises(ValueError, match="names no model to run"):
        resolve(Plan(np.array([0, 1])), None, None)


def test_cluster_key_is_a_value_not_the_config_group(tmp_path: Path) -> None:
    # conf/cluster/ is a config group of the other runners; `cluster=cpu_4` must still reach
    # runners.execute as a plain value (it then fails on the missing plan file, not in hydra)
    proc = subprocess.run(
        [sys.executable, "-m", "runners.execute", f"plan={tmp_path / 'missing.json'}",
         "cluster=cpu_4", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "Could not override" not in proc.stderr
    assert "missing.json" in proc.stderr


TINY_GPT2 = {"name": "gpt2", "config": dict(batch=4, seq=16, n_layer=2, d_model=32, n_head=2,
                                           vocab=64, n_ctx=16)}  # fmt: skip


def execute_hybrid(tmp_path: Path, world: int, **layout) -> dict:
    """``Plan.hybrid(**layout)`` of :data:`TINY_GPT2` on ``cpu_{world}``, saved as JSON and run
    through ``python -m runners.execute`` (1 step): its result.json, after checking the run
    names its process count and the result carries the plan's hash."""
    import json

    from graphs.cpu_cluster import cpu_cluster
    from runtime.model import graph_for_model
    from runtime.spec import plan_hash

    graph = graph_for_model(TINY_GPT2)
    plan = Plan.hybrid(
        graph, cpu_cluster(world), microbatch_size=1, global_batch=4,
        meta={"model": TINY_GPT2, "cluster": f"cpu_{world}"}, **layout,
    )  # fmt: skip
    plan.save(tmp_path / "plan.json")
    proc = subprocess.run(
        [sys.executable, "-m", "runners.execute", f"plan={tmp_path / 'plan.json'}",
         f"output_dir={tmp_path / 'ex'}", "steps=1", "warmup=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"hybrid plan on {world} processes" in proc.stdout
    res = json.loads((tmp_path / "ex" / "result.json").read_text())
    assert res["plan_hash"] == plan_hash(Plan.load(tmp_path / "plan.json"))
    return res


def test_execute_runs_a_plan_whose_stages_shard_and_recompute_differently(tmp_path: Path) -> None:
    """Journey: a hybrid plan with a ZeRO stage and a recomputation mode per pipeline stage
    (what ``alpa`` and ``hybrid_anneal`` may plan; built here with ``Plan.hybrid``, saved as
    JSON): the first stage sharded (ZeRO-3) and fully recomputed, the last replicated (ZeRO-0)
    without recomputation, so the tied embedding's gradient is summed between a shard and a
    whole tensor. It runs through ``python -m runners.execute`` on 4 CPU processes (dp 2 x
    pp 2); the result is that plan's, with the loss of one full-batch step of the same model
    in one process. (Two tests, one per field, until 29 Nov 2026.)"""
    from tests.runtime._reference import reference

    res = execute_hybrid(
        tmp_path, 4, dp=2, tp=1, pp=2, zero=3, stage_zero=(3, 0), recompute="full",
        stage_recompute=("full", "none"),
    )  # fmt: skip
    assert (res["mode"], res["world_size"], res["microbatches"]) == ("hybrid", 4, 2)
    assert res["loss"] == pytest.approx(reference(TINY_GPT2)[0], abs=1e-5)
    assert res["step_time"] > 0
    plan = Plan.load(tmp_path / "plan.json")
    assert plan.layout.stage_zero == (3, 0) and plan.layout.stage_recompute == ("full", "none")


def test_execute_runs_a_plan_whose_stages_have_their_own_submeshes(tmp_path: Path) -> None:
    """Journey: a hybrid plan whose first stage is data-parallel (dp 2) and whose second is
    tensor-parallel (tp 2) -- Alpa's inter-op stages on submeshes of different shapes, what
    ``alpa`` and ``Hybrid-v0`` may plan -- saved as JSON, runs through ``python -m
    runners.execute`` on 4 CPU processes; the result is that plan's, with the loss of one
    full-batch step of the same model in one process (what the uniform plans report: the
    runtime's equivalence tests)."""
    from tests.runtime._reference import reference

    res = execute_hybrid(tmp_path, 4, dp=2, tp=1, pp=2, stage_meshes=((2, 1), (1, 2)))
    assert (res["mode"], res["world_size"], res["microbatches"]) == ("hybrid", 4, 2)
    assert len(res["compute"]) == 4 and res["step_time"] > 0
    assert res["loss"] == pytest.approx(reference(TINY_GPT2)[0], abs=1e-5)


def test_only_parametric_shapes_without_a_module_are_refused_naming_them() -> None:
    """Hybrid envs plan parametric models (``gpt`` by dimension, ``llama`` with dimension
    keywords); ``runners.execute`` runs them on the zoo's GPT-2 / LLaMA module of their
    dimensions and refuses, before building anything, only shapes no module has (a ``gpt``
    whose MLP is not 4 x hidden, a tied ``llama``) and operator placements of them.
    Extracted zoo models and factories pass."""
    from runners.execute import _check_buildable

    dims = {"hidden": 64, "layers": 2, "heads": 4, "vocab": 512, "seq": 32}
    with pytest.raises(ValueError, match="parametric 'gpt' with ffn = 128 has no PyTorch module"):
        _check_buildable({"name": "gpt", "config": dict(dims, ffn=128)})
    with pytest.raises(ValueError, match="parametric 'llama' with tied = true"):
        _check_buildable({"name": "llama", "config": dict(dims, kv_heads=2, tied=True)})
    with pytest.raises(ValueError, match=r"parametric 'gpt' needs \['vocab', 'seq'\]"):
        _check_buildable({"name": "gpt", "config": {"hidden": 64, "layers": 2, "heads": 4}})
    _check_buildable({"name": "gpt", "config": dims})
    _check_buildable({"name": "llama", "config": dict(dims, kv_heads=2, ffn=96)})
    # an operator placement of the parametric graph: its nodes are not the module's operators
    with pytest.raises(ValueError, match="places the operators of the parametric 'gpt'"):
        _check_buildable({"name": "gpt", "config": dims}, hybrid=False)
    _check_buildable({"name": "gpt2", "config": {"n_layer": 2}}, hybrid=False)
    _check_buildable({"name": "llama", "config": {"n_layer": 2, "d_model": 16}})
    _check_buildable({"factory": "pkg.mod:fn", "config": {"hidden": 4}})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("agent", ["megatron_grid", "pipedream"])
def test_journey_plan_a_parametric_gpt_with_a_hybrid_planner_then_execute_it(
    tmp_path: Path, agent: str
) -> None:
    """Journey: ``runners.train`` of a hybrid env's parametric GPT, shrunk to run here (4
    layers, h 64, on ``cpu_4``), with ``agent=megatron_grid`` or ``agent=pipedream``
    (PipeDream's DP: ``dp_p x 1`` stages, replicated where that is faster);
    ``runners.execute`` runs its ``best_plan.json`` on 4 processes (it used to refuse
    parametric models) with the loss of one full-batch process of the same module."""
    import json

    from tests.runtime._reference import reference

    model = {"hidden": 64, "layers": 4, "heads": 4, "vocab": 512, "seq": 32, "batch": 8}
    flow = "{" + ", ".join(f"{k}: {v}" for k, v in model.items()) + "}"
    others = "[]" if agent == "megatron_grid" else "[megatron_grid]"
    train = subprocess.run(
        [sys.executable, "-m", "runners.train", "+env=gpt3_175b_a100_1024",
         f"env.model_config={flow}", "env.cluster=cpu_4", f"env.baselines={others}",
         f"agent={agent}", "logger=none", "train.progress=false",
         f"output_dir={tmp_path / 'train'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    plan = Plan.load(tmp_path / "train" / "best_plan.json")
    assert plan.meta["model"] == {"name": "gpt", "config": model}
    assert plan.layout.world_size == 4 and plan.meta["algorithm"] == agent
    if agent == "pipedream":
        assert plan.layout.zero == 0 and all(t == 1 for _, t in plan.layout.meshes)
        res = json.loads((tmp_path / "train" / "result.json").read_text())
        assert "megatron_grid" in res["speedup_vs"] and not res["oom"]
    proc = subprocess.run(
        [sys.executable, "-m", "runners.execute", f"plan={tmp_path / 'train' / 'best_plan.json'}",
         f"output_dir={tmp_path / 'ex'}", "steps=1", "warmup=0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hybrid plan on 4 processes" in proc.stdout
    res = json.loads((tmp_path / "ex" / "result.json").read_text())
    assert res["mode"] == "hybrid" and res["step_time"] > 0
    assert res["loss"] == pytest.approx(reference({"name": "gpt", "config": model})[0], abs=1e-4)


@pytest.mark.parametrize(
    "arg, says",
    [
        ("rehearse=no", "key 'rehearse' is 'no'; expected true or false"),  # bool('no') was True
        ("steps=2.5", "key 'steps' is 2.5; expected an integer >= 1"),  # ran 2 steps
        ("steps=0", "key 'steps' is 0; expected an integer >= 1"),  # named RunSpec
        ("+stpes=3", "unknown config key 'stpes'"),  # ignored
        ("backend=mpi", "expected one of ['gloo', 'nccl'] or null"),
        ("optimizer=lamb", "expected one of ['sgd', 'adam'] or null"),
        ("timeout_s=-1", "key 'timeout_s' is -1"),
        ("launcher=mpirun", "key 'launcher' is 'mpirun'; expected one of ['local', 'torchrun']"),
    ],
)
def test_execute_checks_its_keys_and_values_before_running(
    tmp_path: Path, capsys, arg: str, says: str
) -> None:
    """runners.execute had no schema: a misspelt key was ignored, rehearse=no turned the
    rehearsal on and steps=2.5 ran 2 steps. Now each is refused by name, exit 2."""
    from runners import schema

    ran = []
    with pytest.raises(SystemExit) as exc:
        schema.run_checked(
            schema.ExecuteConfig, lambda: ran.append(1), [f"plan={tmp_path / 'p.json'}", arg]
        )
    assert exc.value.code == 2 and not ran
    assert says in capsys.readouterr().err


def test_execute_names_a_missing_plan_key_a_folder_and_nccl_without_gpus(tmp_path: Path) -> None:
    """No plan= (a MissingMandatoryValue traceback before), plan=FOLDER ("no such file"
    before) and backend=nccl on a machine without CUDA (failed after launch with a torch
    AttributeError) are refused before anything runs."""
    from omegaconf import OmegaConf

    from runners.execute import run

    base = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    base.pop("defaults"), base.pop("hydra")
    with pytest.raises(ValueError, match="plan=PATH is required"):
        run(base, tmp_path)
    g = _graph()
    plan = Plan(np.array([0, 1, 1]), meta={"model": {"name": "gpt2"}})
    (tmp_path / "run").mkdir()
    plan.save(tmp_path / "run" / "best_plan.json")
    cfg = OmegaConf.merge(base, {"plan": str(tmp_path / "run")})
    with pytest.raises(ValueError, match=r"is a folder; give the plan file in it \(best_plan"):
        run(cfg, tmp_path)
    rex = importlib.import_module("runtime.execute")  # the package exports a function of that name

    if rex._cuda_devices() < 2:
        save(g, tmp_path / "g.json")
        spec = rex.make_run_spec(plan, g, resolve(plan, str(tmp_path / "g.json"), None)[1],
                                 {"name": "gpt2"}, backend="nccl")  # fmt: skip
        with pytest.raises(rex.WrongMachine, match="backend=nccl needs 2 CUDA devices"):
            rex.check_machine(
                spec, resolve(plan, str(tmp_path / "g.json"), None)[1], rehearse=False
            )


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_a_new_run_in_a_used_folder_reports_its_own_error(
    tmp_path: Path, monkeypatch, launcher: str
) -> None:
    """An earlier failed run's error_rank*.json in output_dir used to be read as this run's
    (the earliest error wins): the wrong error was reported. The launcher clears them (and
    the earlier run's per-rank records and logs)."""
    import json as _json

    rex = importlib.import_module("runtime.execute")  # the package exports a function of that name

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "error_rank0.json").write_text(
        _json.dumps({"rank": 0, "message": "stages [1] hold no operations", "time": 1.0})
    )
    (folder / "rank1.json").write_text("{}")
    (folder / "rank1.log").write_text("an earlier run's output")
    seen = {}

    class Proc:
        pid, returncode = 0, 0

        def __init__(self, cmd, **kw):
            seen["files"] = sorted(p.name for p in folder.iterdir())

        def communicate(self, timeout=None):
            return "", None

    def fake_spawn(fn, nproc, args, **kw):
        seen["files"] = sorted(p.name for p in folder.iterdir())
        return [None] * nproc

    monkeypatch.setattr(rex.subprocess, "Popen", Proc)
    monkeypatch.setattr(rex, "spawn", fake_spawn)
    with pytest.raises(FileNotFoundError):  # no rank wrote a record in this fake launch
        rex._launch("{}", 2, 1, folder, 10.0, launcher)
    assert seen["files"] == ["spec.json"]


def test_plan_files_name_calibrations_and_graph_files_by_absolute_path(
    tmp_path: Path, monkeypatch
) -> None:
    """env.cluster=cpu_4@cal.json (the README's form) was stored in the plan as typed, so
    runners.execute run from another folder said the calibration did not exist."""
    from runners import common
    from tests.runners.conftest import chain_graph, compose, small_env

    monkeypatch.chdir(tmp_path)
    assert common.absolute_cluster_name("cpu_4@cal.json") == f"cpu_4@{tmp_path / 'cal.json'}"
    assert common.absolute_cluster_name("cpu_4@/x/c.json") == "cpu_4@/x/c.json"
    assert common.absolute_cluster_name("dgx1_v100_8") == "dgx1_v100_8"
    save(chain_graph(), tmp_path / "g.json")
    spec = common.env_spec(compose(small_env(Path("g.json"))).env)
    meta = common.plan_provenance(spec)
    assert meta["graph_file"] == str(tmp_path / "g.json")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("gpt2", "field 'meta.model' is 'gpt2'; expected an object"),
        ({"name": "gpt2", "config": [1]}, "field 'meta.model.config' is [1]; expected an object"),
        ({"name": "gpt2", "max_groups": "x"}, "field 'meta.model.max_groups' is 'x'"),
        ({"name": 5}, "field 'meta.model.name' is 5"),
        ({"config": {}}, "expected one of 'name' or 'factory'"),
        ({"name": "gpt2", "bogus": 1}, "'meta.model.bogus' is not a known key"),
    ],
)
def test_execute_names_a_bad_model_in_the_plan_file(tmp_path: Path, model, says) -> None:
    """An edited plan's meta.model failed with AttributeError / TypeError tracebacks."""
    from omegaconf import OmegaConf

    from runners.execute import run

    path = tmp_path / "best_plan.json"
    _stamped(meta={"model": model}).save(path)
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan = str(path)
    with pytest.raises(ValueError) as exc:
        run(cfg, tmp_path / "out")
    assert str(exc.value).startswith(f"{path}: ") and says in str(exc.value)


def test_execute_names_the_plans_unknown_cluster(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from runners.execute import run

    path = tmp_path / "best_plan.json"
    _stamped(meta={"model": {"name": "gpt2"}, "cluster": "nosuch"}).save(path)
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan = str(path)
    with pytest.raises(ValueError, match=rf"^{path}: the plan's meta.cluster: .*nosuch"):
        run(cfg, tmp_path / "out")


def test_execute_names_both_clusters_of_a_plan_made_for_another(tmp_path: Path) -> None:
    """Found by fuzzing: `cluster=cpu_8` for a plan made on cpu_2 said "Plan was made for
    cluster 96844..." naming neither the plan's cluster nor `cluster=`."""
    from omegaconf import OmegaConf

    from runners.execute import run

    path = tmp_path / "best_plan.json"
    graph = tmp_path / "g.json"
    save(_graph(), graph)
    _stamped(meta={"model": {"name": "gpt2"}, "cluster": "cpu_2"}).save(path)
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan, cfg.graph, cfg.cluster = str(path), str(graph), "cpu_8"
    with pytest.raises(ValueError, match=rf"^plan={path} was made for cluster 'cpu_2', not "
                       r"'cpu_8' \(cluster=cpu_8\); a placement only runs on the cluster"):  # fmt: skip
        run(cfg, tmp_path / "out")
    # found by fuzzing: meta.cluster edited to disagree with cluster_hash read "made for
    # cluster 'cpu_4', not 'cpu_4' (its meta.cluster)"
    _stamped(meta={"model": {"name": "gpt2"}, "cluster": "cpu_4"}).save(path)
    cfg.cluster = None
    with pytest.raises(ValueError, match=rf"^plan={path}: its meta.cluster 'cpu_4' is not the "
                       r"cluster its cluster_hash \w+ was taken of \(an edited plan file\?\)"):  # fmt: skip
        run(cfg, tmp_path / "out2")


@pytest.mark.parametrize(
    ("stage", "says"),
    [
        ([1, 0, 1], "pipeline plan is not monotone: 'n0' (stage 1) feeds 'n1' (stage 0)"),
        ([0, 0, 0], "pipeline plan: stages [1] hold no forward operations"),
    ],
)
def test_a_staged_plan_the_pipeline_cannot_run_is_refused_before_launch(stage, says) -> None:
    """Reversed stages or an empty stage were found by every rank after its launch (~20 s)."""
    from graphs.clusters import load
    from runtime.spec import make_run_spec

    g, cl = _graph(), load("cpu_2")
    devices = [(0, 1)[s] for s in stage]
    plan = Plan.for_graph(np.array(devices), g, cl, stage=np.array(stage), stage_device=(0, 1),
                          microbatches=1, schedule="gpipe")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(says)):
        make_run_spec(plan, g, cl, {"name": "gpt2"})
    ok = Plan.for_graph(np.array([0, 1, 1]), g, cl, stage=np.array([0, 1, 1]), stage_device=(0, 1),
                        microbatches=1, schedule="gpipe")  # fmt: skip
    assert make_run_spec(ok, g, cl, {"name": "gpt2"}).mode == "pipeline"


def test_tp_degree_naming_a_group_the_graph_lacks_is_named() -> None:
    """tp_degree {"99999": 2} said "names groups whose forward nodes have no module path to
    shard", naming no group."""
    from graphs.clusters import load
    from runtime.spec import make_run_spec

    g, cl = _graph(), load("cpu_2")
    plan = Plan.for_graph(np.array([0, 0, 0]), g, cl, tp_degree={99999: 2})
    with pytest.raises(ValueError, match=r"Plan.tp_degree names group\(s\) \[99999\] that graph"):
        make_run_spec(plan, g, cl, {"name": "gpt2"})
    # a group the graph has, without a module to shard: named too (fuzzing, 2 Dec 2026)
    plan = Plan.for_graph(np.array([0, 0, 0]), g, cl, tp_degree={0: 2})
    with pytest.raises(ValueError, match=r"names group\(s\) \[0\] whose forward nodes \(.+\) "
                       r"have no module path to shard"):  # fmt: skip
        make_run_spec(plan, g, cl, {"name": "gpt2"})


@pytest.mark.parametrize(
    "what,message",
    [
        ("missing", "no such file"),
        ("folder", "is a folder; give the plan file in it"),
        ("not_a_plan", "not a devplace plan"),
    ],
)
def test_a_bad_plan_is_refused_before_torch_is_imported(what, message, tmp_path):
    """``runners.execute`` imported the runtime (torch, about two seconds) before it looked
    at the plan file."""
    plan = {"missing": tmp_path / "none.json", "folder": tmp_path}.get(what)
    if plan is None:
        plan = tmp_path / "bad.json"
        plan.write_text('{"bad": 1}')
    code, torch_imported, err = run_cli_module(
        "runners.execute", [f"plan={plan}", f"output_dir={tmp_path / 'out'}"]
    )
    assert (code, torch_imported) == (2, False), err[-2000:]
    assert message in err


def test_a_plan_splitting_a_forward_op_from_its_backward_is_refused() -> None:
    """Backward and optimizer nodes placed away from their forward op were ignored: the
    runtime runs them beside it (found by fuzzing, 29 Nov 2026)."""
    from graphs.clusters import load
    from graphs.compgraph import FWD
    from graphs.training import with_backward
    from runtime.spec import make_run_spec

    g, cl = with_backward(_graph()), load("cpu_2")
    plan = Plan.for_graph(np.where(g.kind == FWD, 0, 1), g, cl)
    with pytest.raises(ValueError, match=r"plan splits colocation group 0 \(n0, bwd:n0.*over "
                       r"devices \[0, 1\] \(3 such group\(s\)\)"):  # fmt: skip
        make_run_spec(plan, g, cl, {"name": "gpt2"})
    ok = Plan.for_graph(np.where(g.group == 2, 1, 0), g, cl)
    assert make_run_spec(ok, g, cl, {"name": "gpt2"}).devices == [0, 1]


def test_tensor_parallelism_without_stages_runs_on_the_block_of_its_device() -> None:
    """A placement with tp_degree but no stages ran plain tp on devices 0..t-1 whatever it
    said: over devices {0, 1, 2} of cpu_4, or all on device 3 (found by fuzzing)."""
    from graphs.clusters import load
    from runtime.spec import make_run_spec

    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=[1.0] * 3, module=["h.0", "h.1", "h.2"],
                        group=[0, 1, 2])  # fmt: skip
    cl = load("cpu_4")
    model = {"name": "gpt2", "config": {"n_layer": 2, "d_model": 32, "n_head": 2, "vocab": 64,
                                        "seq": 8, "batch": 2}}  # fmt: skip
    spread = Plan.for_graph(np.array([0, 1, 2]), g, cl, tp_degree={1: 2, 2: 2})
    with pytest.raises(ValueError, match=r"devices \[0, 1, 2\] with tp_degree 2 and no pipeline"):
        make_run_spec(spread, g, cl, model)
    last = Plan.for_graph(np.array([3, 3, 3]), g, cl, tp_degree={0: 2})
    with pytest.raises(ValueError, match=r"on device 3 with tp_degree 2 needs devices 3..4"):
        make_run_spec(last, g, cl, model)
    on2 = Plan.for_graph(np.array([2, 2, 2]), g, cl, tp_degree={0: 2})
    spec = make_run_spec(on2, g, cl, model)
    assert spec.mode == "tp" and spec.devices == [2, 3]


def test_a_plan_made_with_a_memory_fraction_runs_on_that_cluster(tmp_path: Path) -> None:
    """``env.memory_fraction=0.5``: the plan's hash is of the cluster with half its memory;
    runners.execute said "made for cluster 'cpu_4', not 'cpu_4'" (found by fuzzing)."""
    from graphs.clusters import load
    from runners.common import EnvSpec, plan_provenance

    assert (
        plan_provenance(EnvSpec(name="e", cluster="cpu_2", memory_fraction=0.5))["memory_fraction"]
        == 0.5
    )
    assert "memory_fraction" not in plan_provenance(EnvSpec(name="e", cluster="cpu_2"))
    half = load("cpu_2").with_memory_fraction(0.5)
    path = tmp_path / "g.json"
    save(_graph(), path)
    meta = {"model": {"name": "any"}, "cluster": "cpu_2", "memory_fraction": 0.5}
    plan = Plan.for_graph(np.array([0, 1, 1]), _graph(), half, meta=meta)
    _, cluster = resolve(plan, str(path), None)
    assert cluster.content_hash() == plan.cluster_hash == half.content_hash()
    bad = Plan.for_graph(np.array([0, 1, 1]), _graph(), half, meta={**meta, "memory_fraction": 2})
    with pytest.raises(ValueError, match=r"meta.memory_fraction is 2; expected a number in"):
        resolve(bad, str(path), None)


def test_a_graph_file_of_another_model_than_the_plans_is_refused(tmp_path: Path) -> None:
    """graph=FILE was only checked against the plan's hash, not against meta.model: a GPT-2
    placement with a 4-layer (or a BERT) meta.model ran that model, exit 0 (fuzzing)."""
    from omegaconf import OmegaConf

    from graphs import zoo
    from graphs.clusters import load
    from runners.execute import run

    cfg2 = {"n_layer": 2, "d_model": 32, "n_head": 2, "vocab": 64, "seq": 8, "n_ctx": 8, "batch": 2}
    g = zoo.build("gpt2", max_groups=4, **cfg2)
    graph = tmp_path / "g.json"
    save(g, graph)
    model4 = {"name": "gpt2", "config": {**cfg2, "n_layer": 4}, "max_groups": 4}
    path = tmp_path / "plan.json"
    Plan.for_graph(np.zeros(g.num_nodes, np.int64), g, load("cpu_2"),
                   meta={"model": model4, "cluster": "cpu_2"}).save(path)  # fmt: skip
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan, cfg.graph = str(path), str(graph)
    with pytest.raises(ValueError, match=r"is not the training graph of the plan's meta.model .*"
                       r"of the model's operators are not in it"):  # fmt: skip
        run(cfg, tmp_path / "out")


def test_sigterm_stops_the_ranks_and_records_why(tmp_path: Path) -> None:
    """SIGTERM (kill, a SLURM cancel) ended runners.execute at once and left its ranks, fork
    server and temporary folders behind (found by fuzzing); now the launcher's cleanup runs,
    the run folder gets error.txt and the exit status is 128 + 15."""
    import os
    import signal
    import time

    from graphs.cpu_cluster import cpu_cluster
    from graphs.extraction import extract
    from runtime.launch import descendants
    from runtime.toy import branchy

    zm = branchy(batch=8)
    g = extract(zm.module, zm.example_inputs, loss_fn=zm.loss_fn, name="branchy")
    model = {"factory": "runtime.toy:branchy", "config": {"batch": 8}}
    plan = tmp_path / "plan.json"
    Plan.for_graph(g.group % 2, g, cpu_cluster(2), meta={"model": model, "cluster": "cpu_2"}).save(
        plan
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runners.execute", f"plan={plan}", "steps=100000", "warmup=0",
         f"output_dir={out}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not (out / "rank1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the ranks are running steps
    below = descendants(proc.pid)
    assert below, "no ranks started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "error: runners.execute terminated by signal 15" in err
    assert "terminated by signal 15" in (out / "error.txt").read_text()
    time.sleep(1.0)
    alive = []
    for pid in below:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    for pid in alive:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not alive


def test_a_run_that_succeeds_leaves_no_error_of_an_earlier_attempt(tmp_path: Path) -> None:
    """A crashed run resumed to the end kept the crash's error.txt beside its result.json
    (found by a docs walk-through, 29 Nov 2026); a missing env left only .hydra/."""
    from omegaconf import OmegaConf

    from runners import common

    (tmp_path / "error.txt").write_text("runners.train failed: crash after 1 update")
    with common.reported_errors(tmp_path, "train"):
        pass
    assert not (tmp_path / "error.txt").exists()
    with pytest.raises(SystemExit), common.reported_errors(tmp_path, "train"):
        raise ValueError("a bad value")
    assert "a bad value" in (tmp_path / "error.txt").read_text()
    cfg = OmegaConf.create({"env": "???"})
    (tmp_path / "error.txt").unlink()
    with pytest.raises(SystemExit):
        common.require_env(cfg, "train", tmp_path)
    assert "no env chosen" in (tmp_path / "error.txt").read_text()
    assert "no env chosen" in (tmp_path / "train.log").read_text()


def test_output_dir_that_is_a_file_or_another_runners_run_is_refused(tmp_path: Path) -> None:
    """output_dir=FILE ended in hydra's FileExistsError traceback, and output_dir= of a
    runners.plan run folder had its result.json replaced by execute's (found by fuzzing)."""
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = run_cli_module("runners.execute", ["plan=p.json", f"output_dir={f}"])
    assert code == 2 and f"error: output_dir={f} is a file; give a folder" in err
    run = tmp_path / "planrun"
    run.mkdir()
    (run / "plan.log").write_text("")
    (run / "result.json").write_text("{}")
    code, _, err = run_cli_module("runners.execute", ["plan=p.json", f"output_dir={run}"])
    assert code == 2 and "is a runners.plan run folder (plan.log, result.json)" in err
    assert (run / "result.json").read_text() == "{}"
    from runners.schema import ExecuteConfig, PlanConfig, check_output_dir

    check_output_dir(PlanConfig, [f"output_dir={run}"])  # its own folder: a re-run, fine
    # a runners.evaluate cell (a train run without train.log) and an evaluate folder were
    # not recognised: execute replaced the cell's result.json, train the folder's config.yaml
    from runners.schema import TrainConfig

    def folder(name: str, *files: str) -> Path:
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("{}")
        return tmp_path / name

    cell = folder("cell", "run_info.json", "result.json")
    ev = folder("ev", "evaluate.log", "results.md")
    for schema_, path, says in [
        (ExecuteConfig, cell, r"runners.train run folder \(run_info.json, result.json\)"),
        (TrainConfig, ev, r"runners.evaluate run folder \(evaluate.log, results.md"),
    ]:
        with pytest.raises(ValueError, match=f"is a {says}"):
            check_output_dir(schema_, [f"output_dir={path}"])
    check_output_dir(TrainConfig, [f"output_dir={cell}"])
    check_output_dir(ExecuteConfig, [f"output_dir={tmp_path / 'new'}"])  # made if missing


def test_a_plan_of_another_coarsening_or_an_unnamed_cluster_is_named(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    from graphs.clusters import load
    from runners.execute import run

    g = tmp_path / "g.json"
    save(_graph(), g)
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    path = tmp_path / "plan.json"
    four = CompGraph.build(4, [(0, 1), (1, 2), (2, 3)], flops=[1.0] * 4)
    Plan.for_graph(np.array([0, 0, 1, 1]), four, load("cpu_2"),
                   meta={"model": {"name": "gpt2", "max_groups": 4}}).save(path)  # fmt: skip
    cfg.plan, cfg.graph = str(path), str(g)
    with pytest.raises(ValueError, match=rf"places 4 nodes, but graph={g} has 3: another model "
                       r"or coarsening \(the plan's meta.model has max_groups=4\)"):  # fmt: skip
        run(cfg, tmp_path / "out")
    # made on cpu_4 using devices 0 and 1, no meta.cluster: cpu_2 is only a guess
    Plan.for_graph(np.array([0, 1, 1]), _graph(), load("cpu_4"),
                   meta={"model": {"name": "gpt2"}}).save(path)  # fmt: skip
    with pytest.raises(ValueError, match=r"names no cluster \(no meta.cluster\) and was not made "
                       r"for 'cpu_2'.*give the cluster it was made for: cluster=NAME"):  # fmt: skip
        run(cfg, tmp_path / "out")


def test_a_plan_whose_meta_model_was_edited_is_named(tmp_path: Path) -> None:
    """An edited meta.model.config (same node count) said only "Plan was made for graph
    a8de..., not for 'gpt2' (bc42...)", pointing at neither field (fuzzing, 2 Dec 2026)."""
    import json

    from omegaconf import OmegaConf

    from runners.execute import run
    from runners.train import train
    from tests.runners.conftest import compose

    train(compose(["+env=gpt2_tiny_cpu4", "agent=single", "env.baselines=[]", "logger=none"]),
          tmp_path / "t", echo=lambda s: None)  # fmt: skip
    d = json.loads((tmp_path / "t" / "best_plan.json").read_text())
    d["meta"]["model"]["config"]["d_model"] *= 2
    (tmp_path / "edited.json").write_text(json.dumps(d))
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan = str(tmp_path / "edited.json")
    with pytest.raises(ValueError, match=r"edited.json was made for graph [0-9a-f]{16}, but the "
                       r"graph its meta.model builds \(.*d_model.*\) is [0-9a-f]{16}: meta.model "
                       r"was edited"):  # fmt: skip
        run(cfg, tmp_path / "out")


def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """Under a file, dangling or looping symlinks: hydra's traceback, exit status 1 (fuzzing,
    2 Dec 2026)."""
    import os

    from runners.schema import TrainConfig, check_output_dir

    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for given, says in [
        (
            tmp_path / "afile" / "sub",
            f"cannot be made: {tmp_path / 'afile'} is a file, not a folder",
        ),
        (tmp_path / "dangling", "is a symlink to nothing"),
        (tmp_path / "loop", "is a symlink to nothing"),  # itself
    ]:
        with pytest.raises(ValueError, match=f"output_dir={given} {says}".replace("(", r"\(")):
            check_output_dir(TrainConfig, [f"output_dir={given}"])
    check_output_dir(TrainConfig, [f"output_dir={tmp_path / 'new' / 'deeper'}"])  # made later
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(ValueError, match="is not writable"):
            check_output_dir(TrainConfig, [f"output_dir={ro / 'x'}"])


@pytest.mark.timeout(300)
def test_execute_says_the_calibration_changed_since_the_plan_was_made(tmp_path: Path) -> None:
    """`runners.profile` run again onto the calibration file a plan was made on: execute said
    "an edited plan file?" (fuzzing, 2 Dec 2026). Plans now record the figures' sha256."""
    import json

    from omegaconf import OmegaConf

    from runners.execute import run
    from runners.train import train
    from tests.runners.conftest import compose

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"device": {"peak_flops": 1e9, "memory": 2**30}}))
    ov = ["+env=gpt2_tiny_cpu4", f"env.cluster=cpu_4@{cal}", "agent=expert", "env.baselines=[]",
          "logger=none", "train.progress=false"]  # fmt: skip
    train(compose(ov), tmp_path / "run", echo=lambda s: None)
    path = tmp_path / "run" / "best_plan.json"
    was = Plan.load(path).meta["calibration_sha256"]
    from graphs.clusters import load

    assert was == load(f"cpu_4@{cal}").meta["calibration_sha256"]
    cal.write_text(json.dumps({"device": {"peak_flops": 2e9, "memory": 2**30}}))
    cfg = OmegaConf.load(ROOT / "conf" / "execute" / "config.yaml")
    cfg.pop("defaults"), cfg.pop("hydra")
    cfg.plan = str(path)
    with pytest.raises(ValueError, match=rf"made on the calibration in {cal} \(figures sha256 "
                       rf"{was}\), which has changed since \(now \w+: profiled again"):  # fmt: skip
        run(cfg, tmp_path / "out")
    older = Plan.load(path)  # a plan from before the digest was recorded
    older.meta.pop("calibration_sha256")
    older.save(tmp_path / "older.json")
    cfg.plan = str(tmp_path / "older.json")
    with pytest.raises(ValueError, match="the file was profiled again or edited since"):
        run(cfg, tmp_path / "out2")
