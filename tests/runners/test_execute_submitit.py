"""runners.execute through hydra's submitit launcher: the SLURM launcher composes, and the local
submitit executor (no SLURM here) runs a hybrid plan file end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from graphs import clusters
from graphs.plan import Plan
from runtime.model import graph_for_model
from tests.runtime._reference import TINY, reference

MODEL = {"name": "gpt2", "config": dict(TINY, n_layer=2)}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    graph = graph_for_model(MODEL)
    Plan.hybrid(
        graph, clusters.load("cpu_2"), dp=1, tp=1, pp=2, microbatch_size=1, global_batch=4,
        meta={"model": MODEL},
    ).save(path)  # fmt: skip
    return path


def test_slurm_launcher_config_composes(plan_file):
    out = subprocess.run(
        [sys.executable, "-m", "runners.execute", "hydra/launcher=submitit_slurm",
         f"plan={plan_file}", "hydra.launcher.nodes=2", "hydra.launcher.partition=gpu",
         "--cfg", "hydra"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "submitit_launcher.SlurmLauncher" in out.stdout
    assert "partition: gpu" in out.stdout and "nodes: 2" in out.stdout


@pytest.mark.timeout(400)
def test_local_submitit_executor_runs_a_hybrid_plan(plan_file, tmp_path):
    sweep = tmp_path / "multirun"
    out = subprocess.run(
        [sys.executable, "-m", "runners.execute", "-m", "hydra/launcher=submitit_local",
         f"plan={plan_file}", "steps=1", "warmup=0", f"hydra.sweep.dir={sweep}",
         "hydra.launcher.timeout_min=5"],
        capture_output=True, text=True, timeout=380,
    )  # fmt: skip
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    result = json.loads((sweep / "0" / "result.json").read_text())
    assert (result["mode"], result["world_size"], result["microbatches"]) == ("hybrid", 2, 4)
    assert result["loss"] == pytest.approx(reference(MODEL)[0], abs=1e-5)
    assert list(sweep.glob(".submitit/*/*_0_result.pkl"))  # it went through submitit
