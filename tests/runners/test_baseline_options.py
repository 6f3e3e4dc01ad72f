"""Baseline options: unknown ones are refused naming the valid ones; the seed goes where it is taken."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runners import common

ROOT = Path(__file__).resolve().parents[2]


def takes_seed(
    graph: Any, cluster: Any, oracle: Any, budget: Any, *, seed: int = 0, t0: float = 1.0
):
    return {"seed": seed, "t0": t0}


def no_seed(graph: Any, cluster: Any, oracle: Any, budget: Any = None, *, width: int = 2):
    return {"width": width}


def anything(graph: Any, cluster: Any, oracle: Any, budget: Any, **kw: Any):
    return kw


ARGS = (None, None, None, 10)


def test_seed_only_to_baselines_that_take_it() -> None:
    call = common._call_with_options
    assert call(takes_seed, ARGS, {"t0": 0.5}, name="a", seed=7) == {"seed": 7, "t0": 0.5}
    assert call(no_seed, ARGS, {}, name="b", seed=7) == {"width": 2}
    assert call(anything, ARGS, {"x": 1}, name="c", seed=7) == {"x": 1, "seed": 7}


def test_unknown_options_name_baseline_and_valid_options() -> None:
    with pytest.raises(ValueError) as err:
        common._call_with_options(takes_seed, ARGS, {"t_0": 0.5, "zz": 1}, name="a", seed=0)
    assert str(err.value) == "baseline 'a' has no option(s) ['t_0', 'zz']; valid options: ['t0']"
    with pytest.raises(ValueError, match=r"'b' has no option\(s\) \['seed'\].*seed="):
        common._call_with_options(no_seed, ARGS, {"seed": 3}, name="b", seed=0)
    # budget is positional; listing it as an option is refused too
    assert common.baseline_option_names(no_seed) == ["width"]
    assert common.baseline_option_names(anything) is None


def test_registered_baselines_are_checked_by_name() -> None:
    common.check_baseline_options("anneal", {"t0": 0.5, "t_end": 1e-4})
    common.check_baseline_options("single", None)
    with pytest.raises(
        ValueError, match=r"'anneal' has no option\(s\) \['t_0'\]; valid options: \[.*'t0'"
    ):
        common.check_baseline_options("anneal", {"t_0": 0.5})
    with pytest.raises(ValueError, match="valid options: none"):
        common.check_baseline_options("single", {"device": 1})


@pytest.mark.timeout(300)
def test_train_cli_refuses_misspelled_option(tmp_path: Path) -> None:
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "runners.train",
            "+env=rnnlm_k40_2",
            "agent=anneal",
            "+agent.options.t_0=0.5",
            "env.baselines=[]",
            "logger=none",
            f"output_dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert p.returncode != 0
    assert (
        "baseline 'anneal' has no option(s) ['t_0']; valid options: ['init', 't0', 't_end', 'time_limit']"
        in p.stderr
    )
