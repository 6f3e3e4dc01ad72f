"""`python -m runners.train ... agent=ideal_dp_makespan`: the makespan DP from the CLI writes its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runners.conftest import small_env
from tests.runners.test_train import _run


@pytest.mark.timeout(300)
def test_train_cli_runs_the_makespan_dp(graph_file: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [a if not a.startswith("env.baselines=") else "env.baselines=[pipedream_dp]"
            for a in small_env(graph_file)]  # fmt: skip
    p = _run(
        ["runners.train", *args, "agent=ideal_dp_makespan", "env.microbatches=4",
         "env.schedule=1f1b", f"hydra.run.dir={run_dir}"],
        tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads((run_dir / "result.json").read_text())
    report = res["meta"]["planner"]
    assert report["algorithm"] == "ideal_dp_makespan" and report["exact"] is True
    assert report["status"] == "done" and report["microbatches"] == 4
    assert report["surrogate_objective"] > 0 and res["oom"] is False
    assert res["best_step_time"] == pytest.approx(report["step_time"])
    assert (run_dir / "best_plan.json").is_file()
    assert res["best_step_time"] <= res["baselines"]["pipedream_dp"] * (1 + 1e-9)
