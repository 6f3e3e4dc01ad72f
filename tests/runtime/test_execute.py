"""runtime.execute: plans are refused before launch when they do not fit; a torchrun run is measured."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from graphs.cpu_cluster import cpu_cluster
from graphs.extraction import extract
from graphs.plan import Plan
from runtime.dist import seed_everything
from runtime.execute import ExecResult, execute, execute_many, run_specs
from runtime.launch import RankFailure
from runtime.spec import RunSpec, make_run_spec, plan_hash
from runtime.toy import branchy

pytestmark = pytest.mark.timeout(150)

MODEL = {"factory": "runtime.toy:branchy", "config": {"batch": 8}}


@pytest.fixture(scope="module")
def graph():
    seed_everything(0)
    zm = branchy(batch=8)
    return extract(zm.module, zm.example_inputs, loss_fn=zm.loss_fn, name="branchy")


@pytest.fixture(scope="module")
def cluster():
    return cpu_cluster(3, calibration={})


def ping_pong(graph, cluster, **kw) -> Plan:
    return Plan.for_graph(graph.group % 2, graph, cluster, meta={"model": MODEL}, **kw)


def test_spec_from_plan(graph, cluster):
    spec = make_run_spec(ping_pong(graph, cluster), graph, cluster)
    assert spec.mode == "oplevel" and spec.world_size == 2 and spec.devices == [0, 1]
    assert spec.device_of["linear"] == 0 and spec.device_of["relu"] == 1
    assert "bwd:linear" not in spec.device_of  # backward follows its forward op
    # devices 0 and 2 used: two ranks, rank 1 is cluster device 2
    plan = Plan.for_graph(
        np.where(graph.group % 2 == 1, 2, 0), graph, cluster, meta={"model": MODEL}
    )
    spec = make_run_spec(plan, graph, cluster)
    assert spec.devices == [0, 2] and spec.device_of["relu"] == 1
    assert RunSpec.from_json(spec.to_json()) == spec


def test_refuses_plan_for_another_graph(graph, cluster):
    other = graph.replace(flops=graph.flops + 1.0)
    plan = ping_pong(other, cluster)
    with pytest.raises(ValueError, match="made for graph"):
        execute(plan, graph, cluster)


def test_refuses_device_out_of_range(graph, cluster):
    plan = Plan(
        np.full(graph.num_nodes, 3),
        graph.content_hash(),
        cluster.content_hash(),
        meta={"model": MODEL},
    )
    with pytest.raises(ValueError, match="on device 3"):
        execute(plan, graph, cluster)


def test_refuses_world_size_mismatch(graph, cluster):
    with pytest.raises(ValueError, match="world size must equal"):
        execute(ping_pong(graph, cluster), graph, cluster, nproc=3)


def test_refuses_plan_without_model(graph, cluster):
    plan = Plan.for_graph(graph.group % 2, graph, cluster)
    with pytest.raises(ValueError, match="names no model"):
        execute(plan, graph, cluster)


def test_refuses_microbatches_that_do_not_divide_the_batch(graph, cluster):
    """Checked by ``make_run_spec``, before any process starts (each rank used to fail on
    its own after the launch)."""
    assert graph.meta["batch"] == 8
    with pytest.raises(ValueError, match=r"microbatches = 3 does not divide the model's batch"):
        make_run_spec(ping_pong(graph, cluster, microbatches=3), graph, cluster)
    make_run_spec(ping_pong(graph, cluster, microbatches=4), graph, cluster)  # 4 divides 8


@pytest.mark.parametrize(
    "options, says",
    [
        ({"backend": "nope"}, "RunSpec.backend 'nope'"),  # each rank raised AssertionError
        ({"optimizer": "nope"}, "RunSpec.optimizer 'nope'"),  # each rank raised KeyError
        ({"threads": 0}, "RunSpec.threads 0"),
        ({"lr": 0.0}, "RunSpec.lr 0.0"),
        # found by fuzzing: 2.5 failed on every rank unnamed, True ran one step
        ({"steps": 2.5}, r"RunSpec: steps must be an integer >= 1 .* got 2.5, 2"),
        ({"steps": True}, r"RunSpec: steps must be an integer >= 1"),
        ({"warmup": 1.5}, r"warmup an integer >= 0, got 5, 1.5"),
        ({"seed": -1}, r"RunSpec.seed -1: expected an integer in \[0, 2\*\*32\)"),
    ],
)
def test_refuses_bad_run_options_before_launch(graph, cluster, options, says):
    with pytest.raises(ValueError, match=says):
        make_run_spec(ping_pong(graph, cluster), graph, cluster, **options)


def test_refuses_a_timeout_that_cannot_be_met_before_launch(graph, cluster, tmp_path):
    """``timeout_s=0`` launched torchrun and then reported "rank -1 failed with timeout"."""
    with pytest.raises(ValueError, match="timeout_s 0: expected a finite number of seconds > 0"):
        execute(ping_pong(graph, cluster), graph, cluster, timeout_s=0, out_dir=tmp_path)
    assert not (tmp_path / "spec.json").exists() and not list(tmp_path.glob("rank*.json"))


def test_the_optimizers_a_spec_may_name_are_the_workers():
    from runtime.spec import OPTIMIZER_NAMES
    from runtime.worker import OPTIMIZERS

    assert set(OPTIMIZER_NAMES) == set(OPTIMIZERS)


def test_refuses_multiple_stages_per_device_without_interleaving(graph, cluster):
    stage = np.arange(graph.num_nodes) % 2
    plan = Plan.for_graph(
        np.zeros(graph.num_nodes, int),
        graph,
        cluster,
        stage=stage,
        stage_device=(0, 0),
        meta={"model": MODEL},
    )
    with pytest.raises(ValueError, match="interleaved"):
        make_run_spec(plan, graph, cluster)


@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_execute_with_either_launcher(graph, cluster, tmp_path, launcher, monkeypatch):
    """The same 2-process plan under the local launcher (ranks forked from the fork server,
    each with its own log) and under torchrun: the same reference loss and figures. Neither
    leaves a folder in $TMPDIR (torchrun made a torchelastic_* folder per launch)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))  # the launched processes' temporary folder
    monkeypatch.delenv("PET_LOG_DIR", raising=False)
    plan = ping_pong(graph, cluster, microbatches=2)
    # a user's files that only look like the launch's records stay (fuzzing: "rank*.json"
    # deleted ranked_plan.json, the plan being run, from output_dir)
    for mine in ("ranked_plan.json", "rank_notes.json", "rank1.json.bak"):
        (tmp_path / mine).write_text("{}")
    res = execute(plan, graph, cluster, steps=2, warmup=1, out_dir=tmp_path, launcher=launcher)
    assert all((tmp_path / mine).exists() for mine in ("ranked_plan.json", "rank_notes.json"))
    assert (tmp_path / "rank1.json.bak").exists()
    assert isinstance(res, ExecResult)
    assert res.world_size == 2 and res.mode == "oplevel" and len(res.step_times) == 2
    # the op-level runtime's own order ran, not the plan's 1f1b: result.json says so
    assert plan.schedule == "1f1b" and res.schedule == "in_order"
    assert res.step_time > 0 and all(c > 0 for c in res.compute) and all(c > 0 for c in res.comm)
    assert len(res.cpu) == 2  # CPU seconds per step of each rank's process
    for r in range(2):
        assert res.compute[r] + res.comm[r] + res.idle[r] <= max(res.step_times) * 1.001
        assert 0 < res.cpu[r] < 2 * max(res.step_times)  # threads of one process, 2 cores
        # step memory: this run's peak RSS minus the RSS once the model was built
        assert res.base_memory[r] > 50 * 2**20  # Python + torch + gloo + the model
        assert res.run_peak[r] >= res.base_memory[r]
        assert res.step_memory[r] == pytest.approx(res.run_peak[r] - res.base_memory[r])
    seed_everything(0)
    zm = branchy(batch=8)
    with torch.no_grad():
        ref = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs).item()
    assert res.loss == pytest.approx(ref, abs=1e-5)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["plan_hash"] == res.plan_hash and (tmp_path / "rank1.json").exists()
    logs = {"local": ["rank0.log", "rank1.log"], "torchrun": ["torchrun.log"]}[launcher]
    assert sorted(p.name for p in tmp_path.glob("*.log")) == logs
    assert not list(tmp_path.glob("result_rank*.json"))  # the launcher's own markers are gone
    assert not list(tmpdir.iterdir())


def test_refuses_an_unknown_launcher_before_launch(graph, cluster, tmp_path):
    with pytest.raises(
        ValueError, match=r"launcher 'mpirun': expected one of \['local', 'torchrun'\]"
    ):
        execute(ping_pong(graph, cluster), graph, cluster, out_dir=tmp_path, launcher="mpirun")
    assert not list(tmp_path.glob("rank*"))


def test_execute_many_runs_plans_in_order_one_launch_per_world_size(graph, cluster, tmp_path):
    """Two 2-process plans (one repeated) and a 1-process plan: results in plan order, each
    equal to the single-process reference loss, files kept per world size."""
    pp = ping_pong(graph, cluster, microbatches=2)
    pp4 = ping_pong(graph, cluster, microbatches=4)
    one = Plan.for_graph(np.zeros(graph.num_nodes, np.int64), graph, cluster, meta={"model": MODEL})
    res = execute_many([pp, one, pp4, pp], graph, cluster, steps=2, warmup=1, out_dir=tmp_path)
    assert [r.world_size for r in res] == [2, 1, 2, 2]
    assert [r.microbatches for r in res] == [2, 1, 4, 2]
    assert [r.plan_hash for r in res] == [plan_hash(p) for p in (pp, one, pp4, pp)]
    seed_everything(0)
    zm = branchy(batch=8)
    with torch.no_grad():
        ref = zm.loss_fn(zm.module(*zm.example_inputs), *zm.example_inputs).item()
    for r in res:  # every plan rebuilt from the seed: the same first-step loss
        assert r.loss == pytest.approx(ref, abs=1e-5)
        assert len(r.step_times) == 2 and r.step_time > 0
    saved = json.loads((tmp_path / "world2" / "results.json").read_text())
    assert [s["microbatches"] for s in saved] == [2, 4, 2]
    assert (tmp_path / "world1" / "results.json").exists()


def test_run_specs_refuses_mixed_world_sizes(graph, cluster):
    a = make_run_spec(ping_pong(graph, cluster), graph, cluster)
    one = Plan.for_graph(np.zeros(graph.num_nodes, np.int64), graph, cluster, meta={"model": MODEL})
    b = make_run_spec(one, graph, cluster)
    with pytest.raises(ValueError, match=r"same world size.*\(1, .*\(2, "):
        run_specs([a, b])
    assert run_specs([]) == []


def test_run_specs_one_failing_spec_fails_the_launch(graph, cluster):
    """The second spec's microbatches do not divide the batch: every rank raises there.
    (``make_run_spec`` refuses such a plan before launch, so the spec is edited after it.)"""
    import dataclasses

    good = make_run_spec(ping_pong(graph, cluster), graph, cluster, steps=1, warmup=0)
    bad = dataclasses.replace(good, microbatches=3, steps=1, warmup=1)
    with pytest.raises(RankFailure, match="cannot be split into 3 equal microbatches"):
        run_specs([good, bad], timeout_s=120)


def test_check_machine_refuses_or_rehearses_a_gpu_plan(monkeypatch):
    """A plan for accelerators: refused in one message without enough CUDA devices, or
    rehearsed on gloo processes (rehearse=True) when the memory check allows it."""
    import importlib
    from types import SimpleNamespace

    from graphs.clusters import load

    ex = importlib.import_module(
        "runtime.execute"
    )  # the module (runtime.execute is also a function)

    gpus = load("k40_2")
    spec = SimpleNamespace(devices=[0, 1], world_size=2, backend=None, model={})
    monkeypatch.setattr(ex, "_cuda_devices", lambda: 0)
    monkeypatch.setattr(ex, "rehearsal_memory", lambda s: 10 * 2**30)
    with pytest.raises(
        ex.WrongMachine, match="machine with 2 GPUs .* 2 gloo CPU processes with rehearse=true"
    ):
        ex.check_machine(spec, gpus, rehearse=False)
    monkeypatch.setattr(ex, "_available_memory", lambda: 2**30)
    with pytest.raises(ex.WrongMachine, match=r"needs about 10.0 GiB .* only 1.0 GiB"):
        ex.check_machine(spec, gpus, rehearse=True)
    monkeypatch.setattr(ex, "_available_memory", lambda: 64 * 2**30)
    assert "rehearsal" in ex.check_machine(spec, gpus, rehearse=True)
    monkeypatch.setattr(ex, "_cuda_devices", lambda: 2)  # enough GPUs: runs as it is
    assert ex.check_machine(spec, gpus, rehearse=False) is None
    # a plan for CPU processes is never refused
    assert ex.check_machine(spec, load("cpu_2"), rehearse=False) is None


def test_step_memory_counts_what_the_steps_allocate():
    """StepMemory (CPU, Linux): an allocation kept after ``built`` shows up in ``step``; one
    made and freed before ``start`` does not."""
    import sys

    from runtime.worker import StepMemory

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status")
    junk = torch.ones(40 * 2**20 // 4)  # 40 MiB, freed before start
    del junk
    mem = StepMemory(torch.device("cpu"))
    mem.start()
    mem.built()
    kept = torch.ones(64 * 2**20 // 4)  # 64 MiB touched during the "step"
    out = mem.finish()
    assert out["base_memory"] > 0 and out["run_peak"] >= out["base_memory"]
    assert 60 * 2**20 <= out["step_memory"] <= 80 * 2**20
    assert float(kept[0]) == 1.0


def test_in_order_plan_runs_op_by_op_whatever_its_stages(graph, cluster):
    # an in_order plan was scored in the op-level runtime's order, so it runs in that mode
    # even when a stage planner recorded stages on it (the stage runtime knows no in_order)
    place = graph.group % 2
    plan = Plan.for_graph(
        place, graph, cluster, stage=place, stage_device=(0, 1), schedule="in_order",
        meta={"model": MODEL},
    )  # fmt: skip
    spec = make_run_spec(plan, graph, cluster)
    assert spec.mode == "oplevel" and spec.devices == [0, 1]
    assert spec.device_of == make_run_spec(ping_pong(graph, cluster), graph, cluster).device_of
    staged = Plan.for_graph(
        place, graph, cluster, stage=place, stage_device=(0, 1), meta={"model": MODEL}
    )
    # without in_order the stages go to the pipeline runtime, which needs them monotone:
    # refused before launch (every rank found it after its launch until 28 Nov 2026)
    with pytest.raises(ValueError, match="pipeline plan is not monotone"):
        make_run_spec(staged, graph, cluster)


def test_a_torchrun_launch_past_its_timeout_leaves_no_worker_running(graph, cluster, tmp_path):
    """torchrun starts each worker in a session of its own: killing torchrun's process group
    on timeout left them running, and the call returned only when they ended (2 min past a
    30 s limit; found by fuzzing). Now the workers are killed with it."""
    import time

    plan = ping_pong(graph, cluster, microbatches=2)
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match="did not finish within 8"):
        execute(plan, graph, cluster, steps=100000, warmup=0, out_dir=tmp_path,
                launcher="torchrun", timeout_s=8)  # fmt: skip
    assert time.monotonic() - t0 < 30
    time.sleep(0.5)
    spec = str(tmp_path / "spec.json")
    left = []
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if spec in cmd:
            left.append((pid, cmd[:120]))
    assert not left


def test_descendants_and_kill_tree_reach_processes_in_sessions_of_their_own():
    import subprocess
    import sys
    import time

    from runtime.launch import descendants, kill_tree

    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    for _ in range(100):
        kids = descendants(parent.pid)
        if kids:
            break
        time.sleep(0.05)
    assert len(kids) == 1
    kill_tree(parent.pid)
    parent.wait(timeout=10)
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{kids[0]}") or (
        open(f"/proc/{kids[0]}/stat").read().split()[2] == "Z"  # a zombie of init: dead
    )


def test_the_first_steps_loss_check_is_not_timed(monkeypatch):
    """Step 0 all-reduces the loss (and copies the gradients) for the equivalence checks;
    with ``warmup=0`` that step is timed, and the check's time must not count in it."""
    import time
    from types import SimpleNamespace

    import runtime.worker as worker

    class Runner:
        def parameters(self):
            return []

        def forward_backward(self, inputs):
            return 1.0

    slow = 0.3  # what the loss all-reduce costs here
    fake_dist = SimpleNamespace(barrier=lambda: None, all_reduce=lambda t: time.sleep(slow))
    monkeypatch.setattr(worker, "dist", fake_dist)
    monkeypatch.setattr(worker, "build_runner", lambda *a: (Runner(), None))
    monkeypatch.setattr(worker, "local_grads", lambda runner: (time.sleep(slow), {})[1])
    spec = SimpleNamespace(warmup=0, steps=2, devices=[0], optimizer="sgd", lr=0.1)
    monkeypatch.setattr(worker, "inject_fault", lambda *a: None)
    rec = worker.run_steps(spec, 0, torch.device("cpu"), capture_grads=True)
    assert rec["loss"] == 1.0 and rec["grads"] == {}
    assert [s["wall"] < slow / 2 for s in rec["steps"]] == [True, True], rec["steps"]
    assert all(s["idle"] < slow / 2 and s["cpu"] < slow / 2 for s in rec["steps"])


def test_a_zoo_model_other_than_the_graphs_is_refused():
    """Found by fuzzing ``runtime.execute``: a 4-layer model under a 2-layer GPT-2 plan (and a
    BERT under a GPT-2 plan) ran, extra layers placed by a fallback."""
    from graphs import zoo
    from graphs.clusters import load

    cfg = {"n_layer": 2, "d_model": 64, "n_head": 2, "vocab": 512, "seq": 32, "batch": 4}
    g = zoo.build("gpt2", max_groups=24, **cfg)
    c = load("cpu_4")
    plan = Plan.for_graph(np.zeros(g.num_nodes, int), g, c)
    with pytest.raises(
        ValueError, match=r"model 'gpt2' config n_layer=4 is not the graph's \(n_layer=2\)"
    ):
        make_run_spec(plan, g, c, model={"name": "gpt2", "config": dict(cfg, n_layer=4)})
    with pytest.raises(ValueError, match="model 'bert-base' is not the graph's model 'gpt2'"):
        make_run_spec(plan, g, c, model={"name": "bert-base", "config": {}})
    spec = make_run_spec(plan, g, c, model={"name": "gpt2", "config": cfg})
    assert spec.model["config"]["n_layer"] == 2
