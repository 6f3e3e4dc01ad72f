"""Tests of agents.baselines: registry, hand-checked optima, memory/colocation properties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agents.baselines as B
from agents.baselines.anneal import best_at
from agents.baselines.baechi import favourite_children
from agents.baselines.common import InfeasiblePlanError, device_chain, make_problem
from agents.baselines.pipedream import boundary_bytes
from graphs.cluster import Cluster, Device, Link
from graphs.compgraph import CompGraph
from graphs.training import with_backward
from placement_env.oracles.simulator import Simulator

ALL = [
    "alpa",
    "anneal",
    "chain_dp",
    "expert",
    "hybrid_anneal",
    "ideal_dp",
    "ideal_dp_makespan",
    "ilp",
    "m_etf",
    "m_sct",
    "m_topo",
    "megatron_grid",
    "metis",
    "pipedream",
    "pipedream_dp",
    "random",
    "round_robin",
    "single",
]
#: Hybrid-parallel planners (plans with a layout; tests/agents/test_hybrid_planners.py).
HYBRID = set(B.HYBRID_PLANNERS)
#: Op-placement baselines, the ones the tests below run on arbitrary graphs.
OP = [n for n in ALL if n not in HYBRID]
#: Small budgets/time limits so the whole file stays fast.
FAST = {"ilp": {"time_limit": 2.0}}
BUDGET = {"anneal": 12, "random": 8}


def uniform_cluster(D: int, memory: float = 1e12, bw: float = 10.0, lat: float = 0.0) -> Cluster:
    """D identical 1 FLOP/s devices, all-to-all links of ``bw`` bytes/s: times equal flops."""
    devs = tuple(Device(f"d{i}", "x", 1.0, 1e30, memory) for i in range(D))
    links = tuple(Link(a, b, bw, lat) for a in range(D) for b in range(D) if a != b)
    return Cluster(f"u{D}", devs, links)


def chain6(param: float = 10.0) -> CompGraph:
    """1 -> 2 -> ... -> 6 with compute 1..6 s and 1 byte per edge (0.1 s at 10 B/s)."""
    return CompGraph.build(
        6,
        [(i, i + 1) for i in range(5)],
        flops=[1, 2, 3, 4, 5, 6],
        out_bytes=1.0,
        param_bytes=param,
        layer=range(6),
        meta={"name": "chain6"},
    )


def run(name: str, graph: CompGraph, cluster: Cluster, oracle, budget=None):
    return B.get(name)(graph, cluster, oracle, BUDGET.get(name, budget), **FAST.get(name, {}))


# ---------------------------------------------------------------- registry
def test_names_and_unknown_name():
    assert B.names() == ALL
    with pytest.raises(ValueError, match="valid names.*'anneal'"):
        B.get("simulated_annealing")
    with pytest.raises(ValueError, match="already registered"):
        B.register("ilp", "agents.baselines.ilp:ilp")


def test_infeasible_error_is_value_error():
    assert issubclass(B.InfeasiblePlanError, ValueError)


# ------------------------------------------------------- hand-checked optima
def test_pipedream_dp_chain_optimum_by_hand():
    g, c = chain6(), uniform_cluster(3)
    plan = run("pipedream_dp", g, c, Simulator(g, c))
    # stages {1,2,3} = 6 + 0.1 out, {4,5} = 9 + 0.1 in + 0.1 out, {6} = 6 + 0.1 in
    assert plan.meta["dp_objective"] == pytest.approx(9.2)
    assert plan.placement.tolist() == [0, 0, 0, 1, 1, 2]
    assert plan.stage.tolist() == [0, 0, 0, 1, 1, 2]
    assert plan.stage_device == (0, 1, 2)


def _contiguous_optimum(times, cap_units: int, bw: float, D: int) -> float:
    """Exhaustive bottleneck over all contiguous splits of a chain into <= D stages."""
    n, best = len(times), np.inf
    for S in range(1, D + 1):
        for cuts in itertools.combinations(range(1, n), S - 1):
            bounds = [0, *cuts, n]
            worst = 0.0
            for k in range(S):
                lo, hi = bounds[k], bounds[k + 1]
                if hi - lo > cap_units:
                    worst = np.inf
                t = sum(times[lo:hi]) + (1 / bw if k > 0 else 0) + (1 / bw if k < S - 1 else 0)
                worst = max(worst, t)
            best = min(best, worst)
    return best


@pytest.mark.parametrize("memory,cap_units,expected", [(1e12, 6, 9.2), (25.0, 2, 11.1)])
def test_pipedream_dp_matches_exhaustive_contiguous_search(memory, cap_units, expected):
    g, c = chain6(), uniform_cluster(3, memory=memory)
    plan = run("pipedream_dp", g, c, Simulator(g, c))
    assert _contiguous_optimum([1, 2, 3, 4, 5, 6], cap_units, 10.0, 3) == pytest.approx(expected)
    assert plan.meta["dp_objective"] == pytest.approx(expected)


def test_ilp_chain_optimum_matches_exhaustive_simulator_search():
    g, c = chain6(), uniform_cluster(3)
    sim = Simulator(g, c, objective="max_load")
    plan = run("ilp", g, c, sim)
    best = min(sim.evaluate(np.array(p)).step_time for p in itertools.product(range(3), repeat=6))
    # by hand: [0 1 2 2 1 0] gives loads 7.2, 7.4, 7.2 (1+6, 2+5, 3+4 plus 0.1 per crossing edge end)
    assert best == pytest.approx(7.4)
    assert plan.meta["step_time"] == pytest.approx(best)
    assert plan.meta["ilp_objective"] == pytest.approx(best)
    assert plan.meta["mip_gap"] == pytest.approx(0.0, abs=1e-6)


def test_ilp_respects_memory_on_chain():
    g, c = chain6(param=10.0), uniform_cluster(3, memory=15.0)  # one unit per device at most
    with pytest.raises(InfeasiblePlanError):
        run("ilp", g, c, Simulator(g, c, objective="max_load"))
    c = uniform_cluster(3, memory=25.0)  # two units per device
    sim = Simulator(g, c, objective="max_load")
    plan = run("ilp", g, c, sim)
    best = min(
        r.step_time
        for r in (sim.evaluate(np.array(p)) for p in itertools.product(range(3), repeat=6))
        if not r.oom
    )
    assert np.bincount(plan.placement, minlength=3).max() <= 2
    assert plan.meta["step_time"] == pytest.approx(best)


def test_ilp_refuses_large_models():
    g, c = chain6(), uniform_cluster(3)
    with pytest.raises(ValueError, match="max_variables=10"):
        B.get("ilp")(g, c, Simulator(g, c), None, max_variables=10)


# ------------------------------------------------------------------ single
def test_single_infeasible_when_nothing_fits():
    g, c = chain6(param=10.0), uniform_cluster(2, memory=50.0)  # 60 B of state
    with pytest.raises(InfeasiblePlanError, match="fits on no single device"):
        run("single", g, c, Simulator(g, c))


def test_single_picks_fastest_device_that_fits():
    g = chain6(param=10.0)
    devs = (
        Device("small_fast", "x", 4.0, 1e30, 30.0),
        Device("slow", "x", 1.0, 1e30, 1e6),
        Device("mid", "x", 2.0, 1e30, 1e6),
    )
    links = tuple(Link(a, b, 1.0, 0.0) for a in range(3) for b in range(3) if a != b)
    c = Cluster("het", devs, links)
    plan = run("single", g, c, Simulator(g, c))
    assert plan.placement.tolist() == [2] * 6
    assert plan.meta["step_time"] == pytest.approx(21.0 / 2)


# ---------------------------------------------------------- other behaviour
def test_search_baselines_spend_exactly_their_budget():
    g, c = chain6(), uniform_cluster(3)
    for name, budget in (("anneal", 17), ("random", 9)):
        sim = Simulator(g, c)
        plan = B.get(name)(g, c, sim, budget)
        assert sim.calls == budget
        assert plan.meta["oracle_calls"] == budget
        assert plan.meta["step_time"] == pytest.approx(sim.evaluate(plan).step_time)


def test_anneal_curve_records_every_improvement():
    g, c = chain6(), uniform_cluster(3)
    sim = Simulator(g, c, microbatches=4, schedule="1f1b")
    plan = B.get("anneal")(g, c, sim, 60, init=np.zeros(6, dtype=np.int64))
    curve = plan.meta["curve"]
    calls = [n for n, _, _ in curve]
    secs = [t for _, t, _ in curve]
    vals = [v for _, _, v in curve]
    assert calls[0] == 1 and vals[0] == pytest.approx(plan.meta["initial_step_time"])
    assert calls == sorted(calls) and len(set(calls)) == len(calls) and calls[-1] <= 60
    assert secs == sorted(secs) and secs[-1] <= plan.meta["search_seconds"]
    assert all(b < a for a, b in zip(vals, vals[1:]))  # strictly better each time
    assert vals[-1] == pytest.approx(plan.meta["step_time"])
    assert plan.meta["evaluations"] == 60 and plan.meta["stopped_by"] == "budget"
    assert best_at(curve, calls=1) == vals[0]
    assert best_at(curve, calls=calls[-1]) == vals[-1]
    assert best_at(curve, seconds=secs[-1]) == vals[-1]
    assert best_at(curve, calls=0) is None
    # the same seed and budget without a time limit give the same search
    again = B.get("anneal")(g, c, Simulator(g, c, microbatches=4, schedule="1f1b"), 60,
                            init=np.zeros(6, dtype=np.int64), time_limit=1e6)  # fmt: skip
    assert [n for n, _, _ in again.meta["curve"]] == calls
    assert again.placement.tolist() == plan.placement.tolist()


def test_anneal_time_limit_stops_first():
    g, c = chain6(), uniform_cluster(3)
    sim = Simulator(g, c, microbatches=4, schedule="1f1b")
    plan = B.get("anneal")(g, c, sim, 10**9, time_limit=0.2)
    assert plan.meta["stopped_by"] == "time_limit"
    assert 1 <= plan.meta["evaluations"] == plan.meta["oracle_calls"] == sim.calls < 10**9
    assert plan.meta["search_seconds"] < 5.0
    with pytest.raises(ValueError, match="time_limit"):
        B.get("anneal")(g, c, sim, 10, time_limit=0.0)


def test_anneal_never_worse_than_its_start():
    g, c = chain6(), uniform_cluster(3)
    plan = B.get("anneal")(g, c, Simulator(g, c, microbatches=4, schedule="1f1b"), 40)
    assert plan.meta["step_time"] <= plan.meta["initial_step_time"]


def test_anneal_starts_from_init_by_hand():
    g, c = chain6(), uniform_cluster(3)
    # budget 1: only the start is evaluated; chain on one device = 1+...+6 = 21 s
    plan = B.get("anneal")(g, c, Simulator(g, c), 1, init=np.zeros(6, dtype=np.int64))
    assert plan.placement.tolist() == [0] * 6
    assert plan.meta["step_time"] == pytest.approx(21.0)
    assert plan.meta["warm_start"] is True
    # split 1+2+3 | 4+5+6 with one 1-byte transfer at 10 B/s: 6 + 0.1 + 15 = 21.1 s
    init = np.array([2, 2, 2, 1, 1, 1])
    sim = Simulator(g, c)
    plan = B.get("anneal")(g, c, sim, 40, init=init)
    assert plan.meta["initial_step_time"] == pytest.approx(21.1)
    assert plan.meta["step_time"] <= 21.1 + 1e-12
    assert sim.calls == 40
    assert plan.meta["step_time"] == pytest.approx(sim.evaluate(plan).step_time)
    # another planner's Plan as it is (was "placement has shape ()", fuzzing 2 Dec 2026)
    start = B.get("single")(g, c, Simulator(g, c))
    again = B.get("anneal")(g, c, Simulator(g, c), 1, init=start)
    assert again.placement.tolist() == start.placement.tolist() and again.meta["warm_start"]
    g2 = chain6(param=20.0)
    other = B.get("single")(g2, c, Simulator(g2, c))
    with pytest.raises(ValueError, match="Plan was made for graph"):
        B.get("anneal")(g, c, Simulator(g, c), 1, init=other)


def test_anneal_init_default_unchanged_and_checked():
    g, c = chain6(), uniform_cluster(3)
    a = B.get("anneal")(g, c, Simulator(g, c), 15, seed=3)
    b = B.get("anneal")(g, c, Simulator(g, c), 15, seed=3, init=None)
    assert a.placement.tolist() == b.placement.tolist() and a.meta["warm_start"] is False
    dp = B.get("pipedream_dp")(g, c, Simulator(g, c))
    assert a.meta["initial_step_time"] == pytest.approx(dp.meta["step_time"])
    with pytest.raises(ValueError, match="shape"):
        B.get("anneal")(g, c, Simulator(g, c), 5, init=np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="device 3"):
        B.get("anneal")(g, c, Simulator(g, c), 5, init=np.full(6, 3))
    grouped = g.replace(group=np.array([0, 0, 1, 1, 2, 2]))
    with pytest.raises(ValueError, match="colocation group"):
        B.get("anneal")(grouped, c, Simulator(grouped, c), 5, init=np.array([0, 1, 1, 1, 2, 2]))
    ok = B.get("anneal")(grouped, c, Simulator(grouped, c), 5, init=np.array([0, 0, 1, 1, 2, 2]))
    assert (ok.placement[0::2] == ok.placement[1::2]).all()


def test_metis_cuts_the_thin_edge():
    # two 4-cliques (heavy edges) joined by one light edge
    e = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    e += [(a + 4, b + 4) for a, b in e] + [(3, 4)]
    eb = [100.0] * 12 + [1.0]
    g = CompGraph.build(8, e, flops=1.0, edge_bytes=eb)
    c = uniform_cluster(2)
    plan = run("metis", g, c, Simulator(g, c))
    p = plan.placement
    assert len(set(p[:4])) == 1 and len(set(p[4:])) == 1 and p[0] != p[4]
    assert plan.meta["cut_bytes"] == pytest.approx(1.0)


def test_metis_keeps_the_c_librarys_messages_off_the_terminal(capfd, tmp_path):
    """A device ~1e300 times slower than the others: METIS used to refuse its target
    weight (0 in float32) and pymetis raise ``RuntimeError: Caught an unknown exception!``;
    now the plan comes back, and what METIS printed ("Cannot bisect a graph with 0
    vertices!") is in ``meta["metis_messages"]``, not on the terminal."""
    import json
    from pathlib import Path

    from graphs import io as gio

    data = Path(__file__).resolve().parents[1] / "data" / "fiddle_tiny_training.json"
    d = json.loads(data.read_text())
    d["nodes"][4]["fpgaLatency"] = 1e300
    (tmp_path / "f.json").write_text(json.dumps(d))
    g, c = gio.read_fiddle(tmp_path / "f.json")
    capfd.readouterr()
    plan = run("metis", g, c, Simulator(g, c, objective="max_load"))
    out, err = capfd.readouterr()
    assert "bisect" not in out + err and "too many parts" not in out + err
    assert any("Cannot bisect" in m for m in plan.meta["metis_messages"]), plan.meta
    assert np.isfinite(plan.meta["step_time"])


def test_expert_equal_cost_split_by_hand():
    g, c = chain6(), uniform_cluster(3)
    plan = run("expert", g, c, Simulator(g, c))
    # prefix costs 1,3,6,10,15,21; targets 7 and 14 -> cuts after 6 (node 3) and 15 (node 5)
    assert plan.placement.tolist() == [0, 0, 0, 1, 1, 2]
    assert plan.meta["rule"] == "equal_cost_layers"


def test_m_etf_keeps_a_chain_on_one_device():
    # with transfers as slow as compute, ETF never gains by moving a chain
    g, c = chain6(), uniform_cluster(3, bw=1.0)
    plan = run("m_etf", g, c, Simulator(g, c))
    assert len(set(plan.placement.tolist())) == 1
    assert plan.meta["model_makespan"] == pytest.approx(21.0)


def test_m_sct_favourite_children_fork():
    # 0 -> {1, 2}: at most one favourite child of 0; 1 and 2 each have one parent
    g = CompGraph.build(4, [(0, 1), (0, 2), (1, 3), (2, 3)], flops=1.0, out_bytes=5.0)
    c = uniform_cluster(2)
    fav, saving, info = favourite_children(make_problem(g, c, Simulator(g, c)))
    assert info["lp_status"] == "optimal"
    assert sum(fav[[1, 2]] == 0) <= 1
    assert fav[3] in (-1, 1, 2)
    assert (saving[fav >= 0] > 0).all()


def test_boundary_bytes_by_hand():
    # order 0,1,2 with edges 0->1 (1 B), 0->2 (2 B), 2->1 (4 B)
    g = CompGraph.build(3, [(0, 1), (0, 2), (2, 1)], edge_bytes=[1.0, 2.0, 4.0])
    c = uniform_cluster(2)
    prob = make_problem(g, c, Simulator(g, c))
    IN, OUT = boundary_bytes(prob)
    order = prob.order.tolist()
    assert order == [0, 2, 1]  # topological: 0, 2, 1
    # stage = position 1 only (node 2): in from node 0 (2 B), out to node 1 (4 B)
    assert IN[1, 1] == pytest.approx(2.0) and OUT[1, 1] == pytest.approx(4.0)
    # stage = positions 1..2 (nodes 2, 1): in 1 + 2 B, nothing after
    assert IN[1, 2] == pytest.approx(3.0) and OUT[1, 2] == 0.0


def test_device_chain_dgx1_uses_bonded_nvlinks():
    from graphs import clusters

    c = clusters.load("dgx1_v100_8")
    chain = device_chain(c)
    bw = c.bandwidth_matrix()
    assert sorted(chain) == list(range(8))
    assert min(bw[a, b] for a, b in itertools.pairwise(chain)) == pytest.approx(50e9)


def test_oracle_for_another_graph_is_refused():
    g, c = chain6(), uniform_cluster(2)
    other = chain6(param=1.0)
    with pytest.raises(ValueError, match="another graph"):
        run("round_robin", g, c, Simulator(other, c))


# ------------------------------------------------------ property: every plan
@st.composite
def instances(draw):
    n = draw(st.integers(2, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.4]
    fwd = CompGraph.build(
        n,
        edges,
        flops=rng.uniform(1e9, 1e11, n),
        bytes_accessed=rng.uniform(1e6, 1e8, n),
        out_bytes=rng.uniform(1e5, 1e8, n),
        param_bytes=rng.uniform(0, 4e8, n) * (rng.random(n) < 0.7),
        act_bytes=rng.uniform(0, 2e8, n),
        meta={"name": "rand", "bytes_per_param": 16},
    )
    g = with_backward(fwd)
    D = draw(st.integers(2, 4))
    state = float(g.param_bytes.sum() + g.act_bytes.sum())
    mem_scale = draw(st.sampled_from([0.3, 0.5, 0.8, 100.0]))
    devs = tuple(
        Device(f"g{i}", "x", float(rng.uniform(5e12, 2e13)), 5e11, state * mem_scale + 1e7)
        for i in range(D)
    )
    links = tuple(
        Link(a, b, float(rng.uniform(5e9, 5e10)), 1e-6)
        for a in range(D)
        for b in range(D)
        if a != b
    )
    M = draw(st.sampled_from([1, 2]))
    # in_order: the op-level runtime's order; its plans carry it (they used to be refused)
    sched = draw(st.sampled_from(["gpipe", "1f1b", "in_order"]))
    objective = draw(st.sampled_from(["makespan", "max_load"]))
    return g, Cluster("rc", devs, links), M, sched, mem_scale, objective


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(instances())
def test_every_plan_respects_colocation_and_memory(inst):
    g, c, M, sched, mem_scale, objective = inst
    for name in OP:
        sim = Simulator(g, c, microbatches=M, schedule=sched, objective=objective)
        try:
            plan = run(name, g, c, sim)
        except InfeasiblePlanError:
            # allowed when memory is tight, never when it is plentiful
            assert mem_scale < 100.0, f"{name}: infeasible although memory is plentiful"
            if name == "ilp":  # the exact model is complete: nothing fits the memory model
                prob = make_problem(g, c, sim, act_fraction=1.0)  # the ILP's memory model
                U, D = prob.num_units, c.num_devices
                assert not any(
                    prob.fits(np.array(up)) for up in itertools.product(range(D), repeat=U)
                )
            continue
        plan.check(g, c)
        assert plan.colocation_violations(g) == []
        res = Simulator(g, c, microbatches=M, schedule=sched, objective=objective).evaluate(plan)
        assert not res.oom
        assert np.all(res.peak_memory <= c.memory)
        assert np.isfinite(res.step_time)
        assert plan.meta["algorithm"] == name
        assert plan.meta["step_time"] == pytest.approx(res.step_time)
        assert plan.meta["oracle_calls"] >= 1
        assert plan.meta["search_seconds"] >= 0
        assert plan.microbatches == M and plan.schedule == sched
    # the options of the exact planners and the annealer's time limit keep the same guarantees
    for name, opts in VARIANTS:
        sim = Simulator(g, c, microbatches=M, schedule=sched, objective=objective)
        try:
            plan = B.get(name)(g, c, sim, BUDGET.get(name), **opts)
        except InfeasiblePlanError:
            assert mem_scale < 100.0, f"{name} {opts}: infeasible although memory is plentiful"
            continue
        assert plan.colocation_violations(g) == []
        res = Simulator(g, c, microbatches=M, schedule=sched, objective=objective).evaluate(plan)
        assert not res.oom and np.all(res.peak_memory <= c.memory), (name, opts)
        assert plan.meta["step_time"] == pytest.approx(res.step_time)


#: Non-default options checked by the feasibility property above.
VARIANTS = [
    ("ideal_dp", {"isolated": "keep"}),
    ("ilp", {"time_limit": 2.0, "symmetry": True}),
    ("anneal", {"time_limit": 0.05}),
]


# ------------------------------------------------------- default experiment
@pytest.mark.slow
def test_every_baseline_on_gpt2_xl_dgx1():
    import graphs

    g = graphs.zoo.build("gpt2-xl", max_groups=256)
    c = graphs.clusters.load("dgx1_v100_8")
    found = []
    for name in OP:
        sim = Simulator(g, c, microbatches=8, schedule="1f1b")
        kw = {"ilp": {"time_limit": 5.0}}.get(name, {})  # warm-started: feasible at once
        try:
            plan = B.get(name)(g, c, sim, {"anneal": 30, "random": 10}.get(name), **kw)
        except InfeasiblePlanError:
            continue  # reported as infeasible, never returned (see docs/baselines.md)
        assert plan.colocation_violations(g) == []
        res = Simulator(g, c, microbatches=8, schedule="1f1b").evaluate(plan)
        assert not res.oom and np.isfinite(res.step_time), name
        found.append(name)
    # 24.9 GB of persistent state cannot fit one 16 GiB V100; every other baseline must
    # return a memory-feasible plan (55 GB of activations fit 8 devices)
    assert set(found) == set(OP) - {"single"}


# ------------------------------------------------------------ anneal moves
def test_anneal_moves_keep_memory_and_do_what_they_say():
    from agents.baselines.anneal import MOVES, propose, unit_neighbours

    g, c = chain6(), uniform_cluster(3)
    prob = make_problem(g, c, Simulator(g, c))
    up = np.array([0, 0, 1, 1, 2, 2])
    use = prob.memory_use(up)
    nbrs = unit_neighbours(prob)
    rng = np.random.default_rng(0)
    for kind in MOVES:
        for _ in range(25):
            new, k = propose(prob, up, use, rng, nbrs, kind=kind)
            changed = np.flatnonzero(new != up)
            assert k == kind and prob.fits(new) and len(changed) >= 1
            if kind == "boundary":  # still three (or fewer) contiguous runs along the chain
                seq = new[prob.order]
                assert all(
                    len(set(np.flatnonzero(seq == d))) == 0
                    or np.ptp(np.flatnonzero(seq == d)) == len(np.flatnonzero(seq == d)) - 1
                    for d in range(3)
                )
            elif kind == "neighbour":
                (u,) = changed
                assert new[u] in {int(up[v]) for v in nbrs[u]}
            elif kind == "swap":
                assert len(changed) == 2 and sorted(new) == sorted(up)
            else:
                assert len(changed) == 1


def test_chain_dp_is_pipedream_dp():
    g, c = chain6(), uniform_cluster(3)
    a = run("chain_dp", g, c, Simulator(g, c))
    b = run("pipedream_dp", g, c, Simulator(g, c))
    assert a.placement.tolist() == b.placement.tolist()
    assert (a.meta["algorithm"], b.meta["algorithm"]) == ("chain_dp", "pipedream_dp")


@pytest.mark.parametrize("name", ["anneal", "random"])
@pytest.mark.parametrize("budget", [2.5, True, 0, -1])
def test_a_budget_that_is_not_a_whole_number_of_calls_is_refused(name, budget):
    """2.5 used to be cut to 2 calls and True taken as 1, without a word."""
    g, c = chain6(), uniform_cluster(3)
    with pytest.raises(ValueError, match=f"{name}: budget must be an integer >= 1 evaluation"):
        B.get(name)(g, c, Simulator(g, c), budget)
    assert B.get(name)(g, c, Simulator(g, c), np.int64(2)).meta["oracle_calls"] <= 2


def test_chain_dp_costs_stages_after_a_unit_that_cannot_run_on_the_device() -> None:
    """A unit that cannot run on a device (time inf) made the prefix sums inf from there on,
    so every later stage on that device cost inf - inf = nan and was never chosen: on this
    chain pipedream_dp put everything on device a (21 ms) instead of 0 -> a, 1-2 -> b
    (3 ms; found by fuzzing, 29 Nov 2026, through a RuntimeWarning on a hetero cluster)."""
    import warnings

    from graphs.cluster import Cluster, Device, Link
    from placement_env.oracles.simulator import Simulator

    g = CompGraph.build(
        3, [(0, 1), (1, 2)], flops=[1.0] * 3, out_bytes=[1.0] * 3, meta={"name": "c3"},
        times={"a": [1000.0, 10000.0, 10000.0], "b": [np.inf, 1000.0, 1000.0]},
    )  # fmt: skip
    devs = (Device("a0", "a", 1e12, 1e11, 1e9), Device("b0", "b", 1e12, 1e11, 1e9))
    cl = Cluster("ab", devs, (Link(0, 1, 1e9, 1e-6), Link(1, 0, 1e9, 1e-6)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no inf - inf
        p = B.get("pipedream_dp")(g, cl, Simulator(g, cl))
    assert p.placement.tolist() == [0, 1, 1]
    assert p.meta["step_time"] == pytest.approx(0.003001001)


TINY_ACC_PLANNERS = ["single", "metis", "m_etf", "m_topo", "m_sct", "round_robin", "anneal",
                     "random", "chain_dp", "pipedream_dp", "expert", "ideal_dp",
                     "ideal_dp_makespan", "ilp"]  # fmt: skip


def acc_beside_host() -> Cluster:
    """10 B of accelerator memory beside an unbounded host CPU, 100x slower."""
    acc = Device("acc0", "acc", 1e12, 1e12, 10.0)
    cpu = Device("cpu0", "cpu", 1e10, 1e10, float("inf"))
    return Cluster("acc+cpu", (acc, cpu), (Link(0, 1, 1e12, 0.0), Link(1, 0, 1e12, 0.0)))


@pytest.mark.parametrize("name", TINY_ACC_PLANNERS)
def test_an_accelerator_smaller_than_one_transient_is_left_to_the_host(name):
    """Found by fuzzing: 10 B of accelerator memory beside an unbounded host CPU, nodes with
    no state but 100 B outputs. The transient reserve clamped the accelerator's capacity at
    0 B, where units without state "fitted"; every plan then ran out of memory in the
    simulator and the planners reported no plan. A unit now cannot go where its own state and
    largest transient exceed the memory: the plan is the host's."""
    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=[1e9] * 3, out_bytes=100.0)
    c = acc_beside_host()
    sim = Simulator(g, c)
    assert np.isinf(make_problem(g, c, sim).time[:, 0]).all()
    plan = B.get(name)(g, c, sim, 20 if name in ("anneal", "random") else None)
    assert plan.placement.tolist() == [1, 1, 1]
    assert not Simulator(g, c).evaluate(plan).oom


@pytest.mark.parametrize("name", ["chain_dp", "pipedream_dp", "ideal_dp", "ideal_dp_makespan",
                                  "ilp", "anneal", "expert"])  # fmt: skip
def test_a_first_unit_larger_than_the_accelerator_goes_to_the_host(name):
    """Only unit 0's 100 B output exceeds the 10 B accelerator. The exact planners let the
    stateless unit through their memory rule, put it on the accelerator and then reported
    the oracle's OOM as "no plan"; the chain planners had to put their first stage on the
    chain's head, the accelerator, and found no split (fuzzing, 30 Nov 2026). By hand: unit 0
    on the host (1e9 FLOP at 1e10 FLOP/s = 100 ms), units 1-2 on the accelerator (1 ms each)
    gives 102 ms, the optimum (all on the host: 300 ms; unit 0 cannot go on the accelerator).
    `expert`'s equal-cost rule need not find it; it must return a plan that fits."""
    g = CompGraph.build(3, [(0, 1), (1, 2)], flops=[1e9] * 3, out_bytes=[100.0, 1.0, 1.0])
    c = acc_beside_host()
    plan = B.get(name)(g, c, Simulator(g, c), 50 if name == "anneal" else None)
    res = Simulator(g, c).evaluate(plan)
    assert not res.oom
    if name == "expert":
        assert plan.placement[0] == 1
    else:
        assert plan.placement.tolist() == [1, 0, 0]
        assert res.step_time == pytest.approx(0.102, rel=1e-6)


@pytest.mark.parametrize(
    "name, budget, kw, says",
    [
        ("single", 2.5, {}, "single: budget must be an integer >= 1"),  # ran with 2
        ("single", 0, {}, "single: budget must be an integer >= 1"),  # "budget spent"
        ("single", "x", {}, "single: budget must be an integer >= 1"),  # int('x')
        ("anneal", 10, {"seed": -1}, "anneal: seed must be an integer >= 0, got -1"),
        ("metis", None, {"seed": 1.5}, "metis: seed must be an integer >= 0"),  # METIS TypeError
        ("metis", None, {"seed": -1}, "metis: seed must be an integer >= 0"),  # was taken
        ("metis", None, {"seed": 2**70}, r"at most 2\*\*63-1"),  # pybind11's TypeError
        ("random", 5, {"seed": 1.5}, "random: seed must be an integer >= 0"),
        ("ilp", None, {"symmetry": "yes"}, "ilp: symmetry must be true or false"),  # truthy
        ("ilp", None, {"warm_start": "no"}, "ilp: warm_start must be true or false"),
    ],
)
def test_budgets_seeds_and_flags_are_checked_by_name(name, budget, kw, says):
    """Found by fuzzing the Python API (the CLI already refused these options)."""
    g, c = chain6(), uniform_cluster(3)
    with pytest.raises(ValueError, match=says):
        B.get(name)(g, c, Simulator(g, c), budget, **kw)
