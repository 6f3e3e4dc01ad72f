"""A model of one's own by import path (``model: pkg.mod:fn``): extracted, trained on, planned."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runners import common
from tests.runners.conftest import compose

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["env.model_config.n_layer=1", "env.model_config.width=32"]


def spec_of(*overrides: str) -> common.EnvSpec:
    return common.env_spec(compose(list(overrides)).env)


def test_model_spec_names_what_execute_builds() -> None:
    spec = spec_of("+env=my_model")
    assert common.model_spec(spec) == {
        "factory": "examples.my_model:build",
        "config": {"batch": 32, "d_in": 64, "width": 128, "n_layer": 4, "classes": 10},
        "max_groups": 16,
    }
    zoo = common.model_spec(spec_of("+env=cpu_profiled"))
    assert zoo is not None and zoo["name"] == "gpt2" and zoo["max_groups"] == 16
    assert common.model_spec(dataclasses.replace(spec, model=None, graph_file="g.json")) is None
    assert common.is_factory("examples.my_model:build") and not common.is_factory("gpt2-xl")


@pytest.mark.timeout(300)
def test_env_config_extracts_the_example_like_execute_does() -> None:
    from runtime.model import graph_for_model

    spec = spec_of("+env=my_model", *SMALL)
    graph = common.load_graph(spec)
    assert graph.meta["name"] == "examples.my_model:build"
    assert 1 < graph.num_groups <= 16 and graph.num_nodes > graph.num_groups
    # runners.execute rebuilds the graph from the plan's model spec: the same graph
    assert graph_for_model(common.model_spec(spec)).content_hash() == graph.content_hash()


def test_bad_import_path_or_arguments_are_clear_errors() -> None:
    spec = spec_of("+env=my_model")
    missing = dataclasses.replace(spec, model="examples.no_such_module:build")
    with pytest.raises(ValueError, match=r"env 'my_model': model 'examples.no_such_module:build'"):
        common.load_graph(missing)
    with pytest.raises(ValueError, match="cannot be imported.*PYTHONPATH"):
        common.load_graph(missing)
    with pytest.raises(ValueError, match="cannot be imported"):
        common.load_graph(dataclasses.replace(spec, model="examples.my_model:no_such_fn"))
    with pytest.raises(ValueError, match=r"model_config \{'depth': 2\}.*depth"):
        common.load_graph(dataclasses.replace(spec, model_config={"depth": 2}))


@pytest.mark.timeout(400)
def test_train_cli_plans_the_example(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "runners.train",
            "+env=my_model",
            "agent=metis",
            "env.baselines=[single]",
            *SMALL,
            "logger=none",
            f"output_dir={run}",
        ],
        cwd=tmp_path,
        env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads((run / "best_plan.json").read_text())
    assert plan["format"] == "devplace.plan" and set(plan["placement"]) <= {0, 1}
    result = json.loads((run / "result.json").read_text())
    assert result["best_step_time"] > 0
