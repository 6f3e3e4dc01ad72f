"""scripts/eval_generalist.py: the per-model search reference the generalist is measured against."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from agents import baselines
from agents import generalist as G
from graphs import synthetic
from tests.scripts import load_script


@pytest.fixture(scope="module")
def ev():
    return load_script("eval_generalist")


def _row(seed: int = 3) -> G.Problem:
    g = synthetic.sample(np.random.default_rng(seed), "layered", min_nodes=40, max_nodes=40)
    c = G.sample_cluster(np.random.default_rng(seed), "pcie", 3, hetero=True)
    return G.Problem("row", g, c, 4, "1f1b", "heldout")


def test_search_keys_keep_the_earlier_caches_readable_and_name_the_reference(ev):
    pb = _row()
    assert ev.search_key(pb, 2000, "best") == "row | M=4 1f1b | anneal=2000"  # as before
    assert ev.search_key(pb, 2000) == "row | M=4 1f1b | anneal=2000 | reference=each"
    with pytest.raises(ValueError, match="reference must be one of"):
        ev.search_key(pb, 2000, "all")
    with pytest.raises(ValueError, match="reference must be one of"):
        ev.per_model_search(pb, ["metis"], 10, reference="all")


def test_two_problems_sharing_a_cache_key_are_refused_by_name(ev):
    """Search caches are keyed by name, microbatches and schedule: two rows of one key on
    other clusters would read one per-model search for both, so that is an error; the same
    problem twice is not."""
    pb = _row()
    other = G.Problem("row", pb.graph, G.sample_cluster(np.random.default_rng(9), "pcie", 3, hetero=True),
                      4, "1f1b", "heldout")  # fmt: skip
    keys = [ev.search_key(p, 2000) for p in (pb, other)]
    assert keys[0] == keys[1]
    with pytest.raises(ValueError, match="two different problems share the search cache key"):
        ev.check_cache_keys([pb, other], keys)
    ev.check_cache_keys([pb, _row()], keys)  # equal problems: fine
    assert G.problem_key(pb) == G.problem_key(_row()) != G.problem_key(other)
    for seed in (0, 1, 2):  # the draws the scripts use have no such pair
        rows = G.corpus_instances(dataclasses.replace(G.CORPUS, seed=seed), split="heldout")
        ev.check_cache_keys(rows, [ev.search_key(p, 2000) for p in rows])
    val = G.validation_instances(24)
    ev.check_cache_keys(val, [p.name for p in val])  # the "best" reference's validation keys


def test_the_default_reference_includes_the_exact_planners(ev):
    assert set(ev.ONE_CALL) < set(ev.BASELINES)
    assert {"chain_dp", "ideal_dp", "ideal_dp_makespan"} <= set(ev.BASELINES)
    assert all(name in baselines.names() for name in ev.BASELINES)
    assert ev.default_baselines("each") == list(ev.BASELINES)
    assert ev.default_baselines("best") == list(ev.ONE_CALL)
    with pytest.raises(ValueError, match="reference must be one of"):
        ev.default_baselines("all")


def test_without_annealing_the_reference_is_the_best_one_call_plan(ev):
    pb = _row()
    names = ["single", "round_robin", "metis", "pipedream_dp", "ideal_dp_makespan"]
    times = {}
    for n in names:
        try:
            times[n] = float(baselines.get(n)(pb.graph, pb.cluster, pb.oracle()).meta["step_time"])
        except baselines.InfeasiblePlanError:
            pass
    times = {n: t for n, t in times.items() if math.isfinite(t)}
    best = min(times, key=times.get)
    for reference in ("best", "each"):
        r = ev.per_model_search(pb, names, 0, reference=reference)
        assert r["search_ms"] == pytest.approx(1e3 * times[best], rel=1e-12)
        assert r["search_from"] == r["best_baseline"] == best and r["search_calls"] == 0


def test_annealing_from_each_plan_is_never_worse_than_from_the_best_one(ev):
    pb = _row()
    names = ["single", "round_robin", "metis", "pipedream_dp", "chain_dp"]
    calls = 40
    best = ev.per_model_search(pb, names, calls, reference="best")
    each = ev.per_model_search(pb, names, calls, reference="each")
    assert best["starts"] == 1 and best["search_calls"] == calls
    assert each["starts"] > 1 and each["search_calls"] == calls * each["starts"]
    # the "each" reference anneals from the best plan too, with the same seed: never worse
    assert each["search_ms"] <= best["search_ms"] * (1 + 1e-12)
    assert each["search_ms"] <= each["best_baseline_ms"]
    # and it is the best of the annealing runs from every distinct one-call plan
    runs = []
    for n in names:
        p = baselines.get(n)(pb.graph, pb.cluster, pb.oracle())
        a = baselines.get("anneal")(pb.graph, pb.cluster, pb.oracle(), calls, init=p.placement)
        runs.append(min(float(p.meta["step_time"]), float(a.meta["step_time"])))
    assert each["search_ms"] == pytest.approx(1e3 * min(runs), rel=1e-12)


def test_the_plot_shows_every_row_and_a_missing_plan(ev, tmp_path, monkeypatch):
    """``plot_rows`` draws one bar per row (an out-of-memory row hatched to the worst-pair
    target) and the planning times beside them, and writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [
        dict(name=f"m{i}", split="heldout" if i < 3 else "train",
             ratio=None if i == 1 else 1 + 0.05 * i, plan_seconds=0.1 * (i + 1))
        for i in range(5)
    ]  # fmt: skip
    drawn = []
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        drawn.append(fig)
        return real(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    out = ev.plot_rows(rows, tmp_path / "gen.png", "title")
    assert out.read_bytes()[:4] == b"\x89PNG"
    ax, at = drawn[0].axes
    ratios = sorted(round(p.get_x() + p.get_width(), 6) for p in ax.patches)
    # a bar from 1 per row (the missing row's of zero width), then its hatched one to 1.25
    assert ratios == [1.0, 1.0, 1.1, 1.15, 1.2, 1.25]
    assert sorted(round(p.get_width(), 6) for p in at.patches) == [0.1, 0.2, 0.3, 0.4, 0.5]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    geo = math.exp(np.mean(np.log([1.0, 1.1])))
    assert f"heldout: geo-mean {geo:.3f}, worst 1.100" in labels


@pytest.mark.parametrize(
    "script, argv, says",
    [
        ("eval_generalist", ["--samples", "0"], "--samples must be an integer >= 1, got 0"),
        ("eval_generalist", ["--penalty", "1,nan"], "a penalty must be a finite number >= 0, got nan"),
        ("eval_generalist", ["--temperature", "-1"], "--temperature must be finite numbers > 0"),
        ("eval_generalist", ["--link-exponent", "nan"], "--link-exponent must be finite numbers >= 0"),
        ("eval_generalist", ["--anneal-calls", "-5"], "--anneal-calls must be an integer >= 0"),
        ("eval_generalist", ["--baselines", "nope"], r"--baselines: \['nope'\] are not op-placement"),
        ("eval_generalist", ["--baselines", "alpa"], r"--baselines: \['alpa'\] are not op-placement"),
        ("eval_generalist", ["--splits", "bogus"], "invalid choice: 'bogus'"),
        ("eval_generalist", ["--policy", "/nonexistent.pt"], "--policy: /nonexistent.pt: not a loadable"),
        ("validate_generalist", ["--policies", "generalist", "--rows", "0"], "--rows must be an integer >= 1"),
        ("validate_generalist", ["--policies", "generalist", "--seed", "-1"], "--seed must be an integer >= 0"),
        ("validate_generalist", ["--policies", "generalist", "--temperatures", "0"], "--temperatures must be finite"),
        ("validate_generalist", ["--policies", "generalist", "--penalties", "nan"], "--penalties: a penalty"),
    ],
)  # fmt: skip
def test_bad_arguments_stop_before_the_searches(script, argv, says, capsys, monkeypatch, tmp_path):
    """Found by fuzzing: --samples 0 failed only after minutes of per-model search, --penalty
    nan and --anneal-calls -5 were taken, --baselines nope gave every row a nan reference,
    --rows 0 divided by zero."""
    from tests.scripts import load_script

    mod = load_script(script)
    monkeypatch.setattr(mod, "per_model_search", lambda *a, **k: pytest.fail("a search ran"))
    with pytest.raises(SystemExit) as e:
        mod.main(
            [*argv, *(["--json", str(tmp_path / "e.json")] if script == "eval_generalist" else [])]
        )
    assert e.value.code == 2 and re.search(says, capsys.readouterr().err)


def test_a_cached_search_of_another_problem_is_refused_and_planner_bugs_are_not_hidden(
    ev, tmp_path, monkeypatch
):
    """The cache is keyed by row name: a search cached before the row's graph or cluster
    changed was reused as the reference; and any exception of a baseline was dropped, so a
    planner bug weakened the reference (found by an audit, 29 Nov 2026)."""
    pb = _row()
    other = G.Problem("row", pb.graph, G.sample_cluster(np.random.default_rng(9), "pcie", 3, hetero=True),
                      4, "1f1b", "heldout")  # fmt: skip
    key = ev.search_key(pb, 10)
    cache = {key: {"search_ms": 1.0, "problem": G.problem_key(other)}}
    with pytest.raises(ValueError, match=r"the search cached for .* was made for .*not for this"):
        ev.check_cached_problems([pb], [key], cache, tmp_path / "c.json")
    cache[key]["problem"] = G.problem_key(pb)
    ev.check_cached_problems([pb], [key], cache, tmp_path / "c.json")
    res = ev.per_model_search(pb, ["metis", "single"], 0, reference="each")
    assert set(res["skipped"]) <= {"single"}  # refusals (ValueError) are recorded, by name

    def broken(*a, **k):
        raise ZeroDivisionError("a planner bug")

    real = baselines.get
    monkeypatch.setattr(baselines, "get", lambda n: broken if n == "metis" else real(n))
    with pytest.raises(ZeroDivisionError, match="a planner bug"):
        ev.per_model_search(pb, ["metis"], 0, reference="each")
