"""Arguments of the planners looked up by name, refused by name before they plan (2 Dec 2026,
found by fuzzing: one-call planners took any budget, options of the wrong type failed with
TypeErrors / AttributeErrors from inside, NaN turned caps off)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agents import baselines
from graphs import clusters, zoo
from placement_env.oracles import Simulator


@pytest.fixture(scope="module")
def problem():
    g = zoo.build(
        "gpt2", max_groups=16, n_layer=2, d_model=64, n_head=2, vocab=128, seq=16, batch=4
    )
    return g, clusters.load("cpu_4")


@pytest.mark.parametrize("name", ["metis", "expert", "m_topo", "m_etf", "m_sct", "round_robin",
                                  "chain_dp", "pipedream_dp", "ideal_dp", "ilp"])  # fmt: skip
@pytest.mark.parametrize("budget", [-1, 0, 2.5, "10", math.nan])
def test_every_planner_refuses_a_bad_budget(problem, name, budget) -> None:
    g, c = problem
    sim = Simulator(g, c, objective="max_load")
    with pytest.raises(ValueError, match=rf"{name}: budget must be an integer >= 1"):
        baselines.get(name)(g, c, sim, budget)


def test_the_checked_planner_keeps_its_signature_and_works(problem) -> None:
    from runners.common import baseline_option_names

    g, c = problem
    sim = Simulator(g, c, microbatches=2, schedule="1f1b")
    assert "max_stages" in baseline_option_names(baselines.get("chain_dp"))
    assert baselines.get("metis") is baselines.get("metis")
    assert baselines.get("metis")(g, c, sim, 3).meta["oracle_calls"] >= 1
    assert baselines.get("anneal")(g, c, sim, budget=5, t0=0.5).meta["oracle_calls"] <= 6


@pytest.mark.parametrize(
    "args, error, says",
    [
        (("gpt2", "C", "S"), TypeError, "metis: graph must be a CompGraph"),
        (("G", "cpu_4", "S"), TypeError, r"metis: cluster must be a Cluster \(graphs.clusters.load\('cpu_4'\)\)"),
        (("G", "C", None), TypeError, "metis: oracle must be an oracle with evaluate()"),
    ],
)  # fmt: skip
def test_wrong_argument_types_are_named(problem, args, error, says) -> None:
    g, c = problem
    real = {"G": g, "C": c, "S": Simulator(g, c)}
    with pytest.raises(error, match=says):
        baselines.get("metis")(*(real.get(a, a) if isinstance(a, str) else a for a in args))


@pytest.mark.parametrize(
    "name, options, says",
    [
        ("chain_dp", {"max_stages": 0}, "max_stages must be an integer >= 1 or None, got 0"),
        ("chain_dp", {"max_stages": 2.5}, "max_stages must be an integer >= 1 or None, got 2.5"),
        ("chain_dp", {"max_stages": "2"}, "max_stages must be an integer >= 1"),
        ("pipedream_dp", {"max_stages": math.nan}, "max_stages must be an integer >= 1"),
        ("chain_dp", {"max_stages": True}, "max_stages must be an integer >= 1"),
        ("anneal", {"t0": "1"}, "anneal: t0 must be a finite number, got '1'"),
        ("anneal", {"t0": math.inf}, "anneal: t0 must be a finite number, got inf"),
        ("anneal", {"t_end": None}, "anneal: t_end must be a finite number, got None"),
        ("anneal", {"time_limit": "1"}, "anneal: time_limit must be > 0 seconds, got '1'"),
        ("ilp", {"max_rows": math.nan}, "ilp: max_rows must be an integer >= 1, got nan"),
        ("ilp", {"max_variables": None}, "ilp: max_variables must be an integer >= 1, got None"),
        ("ilp", {"highs_options": [("a", 1)]}, "ilp: highs_options must be a mapping"),
        ("ilp", {"highs_options": {1: 2}}, "ilp: highs_options must be a mapping"),
    ],
)  # fmt: skip
def test_planner_options_are_refused_by_name(problem, name, options, says) -> None:
    g, c = problem
    sim = Simulator(g, c, objective="max_load" if name == "ilp" else "makespan")
    kw = {"time_limit": 1, **options} if name == "ilp" else options
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        baselines.get(name)(g, c, sim, 20 if name == "anneal" else None, **kw)
    # numpy integers are integers
    if name == "chain_dp":
        sim2 = Simulator(g, c, microbatches=2)
        assert (
            baselines.get("chain_dp")(g, c, sim2, None, max_stages=np.int64(2)).meta["stages"] <= 2
        )
