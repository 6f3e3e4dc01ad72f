"""scripts/bench_hybrid_learning.py: reading a run folder into a row and the row into the table."""

from __future__ import annotations

import json
import math

from runners.common import BaselineOutcome
from tests.scripts import load_script


def _run_folder(path, baselines: list[BaselineOutcome], curve: list[list[float]]) -> None:
    path.mkdir()
    (path / "baselines.json").write_text(json.dumps({b.name: b.to_dict() for b in baselines}))
    result = {
        "num_gpus": 1024, "seed": 3, "best_step_time": curve[-1][3],
        "oracle_calls": int(curve[-1][1]), "meta": {"curve": curve},
    }  # fmt: skip
    (path / "result.json").write_text(json.dumps(result))


def test_best_at_reads_the_curve_up_to_the_calls_or_seconds():
    b = load_script("bench_hybrid_learning")
    # (timesteps, oracle calls, seconds, best feasible step time so far)
    curve = [[64, 50, 1.0, math.inf], [128, 100, 2.0, 20.0], [192, 150, 3.0, 18.0]]
    assert b.best_at(curve, calls=49) == math.inf
    assert b.best_at(curve, calls=100) == 20.0 and b.best_at(curve, calls=149) == 20.0
    assert b.best_at(curve, secs=2.5) == 20.0 and b.best_at(curve, secs=99) == 18.0


def test_row_and_table_with_pipedream_without_a_plan(tmp_path):
    b = load_script("bench_hybrid_learning")
    assert b.CLASSIC == ("megatron_grid", "alpa", "pipedream")
    run = tmp_path / "run"
    _run_folder(
        run,
        [
            BaselineOutcome("megatron_grid", 17.567, 5016, 3.2),
            BaselineOutcome("alpa", 17.567, 3987, 2.9),
            BaselineOutcome("pipedream", None, 0, 0.4, error="no layer fits a GPU"),
        ],
        [[128, 3000, 2.0, 21.0], [256, 5016, 3.0, 19.0], [384, 6000, 9.0, 17.567]],
    )
    row = b._read_row("GPT-3 175B", "gpt3_175b_a100_1024", run)
    assert row["pipedream"] == (math.inf, 0, 0.4)
    assert row["ppo_calls"] == 19.0  # at the grid's 5,016 calls
    assert row["ppo_time"] == 19.0  # at the grid's 3.2 s: the point at 3.0 s, not the one at 9.0 s
    assert row["ppo_total"] == (17.567, 6000, 9.0) and not row["short_calls"]
    lines = b.table([row]).splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 10
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[3:6] == ["17,567 ms (5,016, 3 s)", "17,567 ms (3,987, 3 s)", "no plan (0, 0 s)"]
    assert cells[6:] == ["19,000 ms", "19,000 ms", "17,567 ms (6,000, 9 s)"]


def test_a_run_from_before_pipedream_reads_as_not_run(tmp_path):
    b = load_script("bench_hybrid_learning")
    run = tmp_path / "old"
    _run_folder(
        run,
        [BaselineOutcome("megatron_grid", 0.19, 216, 0.1), BaselineOutcome("alpa", 0.19, 166, 0.1)],
        [[128, 100, 1.0, math.inf], [512, 521, 4.0, 0.19]],
    )
    row = b._read_row("GPT-2 XL", "gpt2_8gpu_hybrid", run)
    assert row["pipedream"] is None
    cells = [c.strip() for c in b.table([row]).splitlines()[2].split("|")[1:-1]]
    assert cells[5] == "not run" and cells[6] == "no feasible plan yet"
