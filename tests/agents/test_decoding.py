"""Chain decoding (agents.decoding): Viterbi against brute force, exact samples, masks, plan()."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents import decoding


def _brute(logp: np.ndarray, penalty: float) -> tuple[float, dict[tuple[int, ...], float]]:
    """Best chain score and every path's score, by enumerating all D^U paths."""
    U, D = logp.shape
    scores = {
        p: decoding.chain_score(logp, np.array(p), penalty)
        for p in itertools.product(range(D), repeat=U)
    }
    return max(scores.values()), scores


@st.composite
def chains(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, float]:
    U = draw(st.integers(1, 5))
    D = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, size=(U, D))
    mask = rng.random((U, D)) < 0.7
    penalty = draw(st.sampled_from([0.0, 0.3, 1.0, 2.5, 10.0]))
    return logits, mask, penalty


@settings(max_examples=150, deadline=None)
@given(chains())
def test_viterbi_equals_brute_force(case: tuple[np.ndarray, np.ndarray, float]) -> None:
    logits, mask, penalty = case
    logp = decoding.masked_log_probs(logits, mask)
    path, score = decoding.viterbi(logp, penalty)
    best, _ = _brute(logp, penalty)
    assert score == pytest.approx(best, abs=1e-9)
    assert decoding.chain_score(logp, path, penalty) == pytest.approx(score, abs=1e-9)
    allowed = mask | ~mask.any(axis=1, keepdims=True)  # a fully masked unit keeps every device
    assert allowed[np.arange(len(path)), path].all()


def test_viterbi_by_hand() -> None:
    # unit 1 slightly prefers device 1: with no penalty it moves, with penalty 1 it stays
    logp = np.log(np.array([[0.9, 0.1], [0.4, 0.6], [0.9, 0.1]]))
    assert decoding.viterbi(logp, 0.0)[0].tolist() == [0, 1, 0]
    path, score = decoding.viterbi(logp, 1.0)
    assert path.tolist() == [0, 0, 0]
    assert score == pytest.approx(np.log(0.9 * 0.4 * 0.9))
    # a long run on device 1 pays one change, not one per unit
    logp = np.log(np.array([[0.9, 0.1]] + [[0.3, 0.7]] * 4))
    assert decoding.viterbi(logp, 1.0)[0].tolist() == [0, 1, 1, 1, 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 9))
def test_penalty_zero_is_the_per_unit_argmax(seed: int, U: int, D: int) -> None:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(U, D))
    mask = rng.random((U, D)) < 0.6
    logp = decoding.masked_log_probs(logits, mask)
    assert np.array_equal(decoding.viterbi(logp, 0.0)[0], logp.argmax(axis=1))


def test_samples_follow_the_chain_distribution() -> None:
    """Empirical frequencies of 40,000 samples against the exact chain probabilities."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, size=(3, 3))
    mask = np.ones((3, 3), dtype=bool)
    mask[1, 2] = False
    logp = decoding.masked_log_probs(logits, mask)
    for penalty in (0.0, 1.5):
        _, scores = _brute(logp, penalty)
        keys = list(scores)
        w = np.exp(np.array([scores[k] for k in keys]))
        exact = dict(zip(keys, w / w.sum()))
        n = 40_000
        s = decoding.sample_chain(logp, penalty, np.random.default_rng(0), n)
        paths, counts = np.unique(s, axis=0, return_counts=True)
        freq = {tuple(p): c / n for p, c in zip(paths.tolist(), counts)}
        for k, p in exact.items():
            # 5 standard errors; a masked path has p = 0 and must never be drawn
            assert abs(freq.get(k, 0.0) - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12, (k, p)


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(0, 1000))
def test_samples_respect_masks(case: tuple[np.ndarray, np.ndarray, float], seed: int) -> None:
    logits, mask, penalty = case
    logp = decoding.masked_log_probs(logits, mask)
    s = decoding.sample_chain(logp, penalty, np.random.default_rng(seed), 50)
    allowed = mask | ~mask.any(axis=1, keepdims=True)
    assert s.shape == (50, logits.shape[0])
    assert allowed[np.arange(logits.shape[0])[None, :], s].all()


def test_sampling_is_deterministic_for_a_seed() -> None:
    logp = decoding.masked_log_probs(np.random.default_rng(1).normal(size=(20, 4)))
    a = decoding.sample_chain(logp, 2.0, np.random.default_rng(7), 8)
    b = decoding.sample_chain(logp, 2.0, np.random.default_rng(7), 8)
    assert np.array_equal(a, b)


def test_a_large_penalty_gives_one_device_change_at_most_where_it_pays() -> None:
    # two halves that prefer devices 0 and 1 strongly: even penalty 5 keeps one change,
    # and sampling at a huge penalty draws (nearly) change-free placements
    logp = np.log(np.array([[0.99, 0.01]] * 5 + [[0.01, 0.99]] * 5))
    assert decoding.viterbi(logp, 5.0)[0].tolist() == [0] * 5 + [1] * 5
    s = decoding.sample_chain(logp, 50.0, np.random.default_rng(0), 20)
    assert ((s[:, 1:] != s[:, :-1]).sum(axis=1) <= 1).all()


def test_candidates_with_a_penalty_ladder() -> None:
    """candidates(): Viterbi of each penalty first, then samples shared out over the ladder."""
    logp = decoding.masked_log_probs(np.random.default_rng(3).normal(size=(12, 4)))
    pens = [0.0, 2.0, 50.0]
    c = decoding.candidates(logp, pens, 10, rng=np.random.default_rng(5))
    assert len(c) == 10
    for i, p in enumerate(pens):
        assert np.array_equal(c[i], decoding.viterbi(logp, p)[0])
    # 7 samples over 3 penalties: 3, 2, 2 in ladder order, the same draws as sample_chain's
    rng = np.random.default_rng(5)
    want = [*decoding.sample_chain(logp, 0.0, rng, 3), *decoding.sample_chain(logp, 2.0, rng, 2)]
    want += list(decoding.sample_chain(logp, 50.0, rng, 2))
    assert all(np.array_equal(a, b) for a, b in zip(c[3:], want, strict=True))
    # penalty 0's Viterbi is the per-unit argmax; at most `samples` Viterbi paths
    assert np.array_equal(c[0], logp.argmax(axis=1))
    assert len(decoding.candidates(logp, pens, 2, rng=np.random.default_rng(0))) == 2
    only = decoding.candidates(logp, 2.0, 4, greedy=False, rng=np.random.default_rng(9))
    assert np.array_equal(
        np.stack(only), decoding.sample_chain(logp, 2.0, np.random.default_rng(9), 4)
    )
    with pytest.raises(ValueError, match="penalties"):
        decoding.candidates(logp, [], 3, rng=np.random.default_rng(0))


def test_candidates_sample_at_a_temperature() -> None:
    """The samples (not the Viterbi paths) follow the chain model of logp / temperature."""
    rng = np.random.default_rng(4)
    logp = decoding.masked_log_probs(rng.normal(0, 2, size=(3, 3)))
    T, pen, n = 3.0, 1.0, 40_000
    c = decoding.candidates(logp, pen, n + 1, rng=np.random.default_rng(0), temperature=T)
    assert np.array_equal(c[0], decoding.viterbi(logp, pen)[0])  # Viterbi of logp itself
    # the same draws as sample_chain of the scaled log-probabilities
    want = decoding.sample_chain(logp / T, pen, np.random.default_rng(0), n)
    assert np.array_equal(np.stack(c[1:]), want)
    # and their frequencies match the tempered chain's exact probabilities (brute force)
    _, scores = _brute(logp / T, pen)
    w = np.exp(np.array(list(scores.values())))
    paths, counts = np.unique(np.stack(c[1:]), axis=0, return_counts=True)
    freq = {tuple(q): k / n for q, k in zip(paths.tolist(), counts)}
    for key, pr in zip(scores, w / w.sum()):
        assert abs(freq.get(key, 0.0) - pr) <= 5 * np.sqrt(pr * (1 - pr) / n) + 1e-12, key
    # a flatter distribution: the tempered samples are more diverse than the untempered ones
    cold = decoding.candidates(logp, pen, n + 1, rng=np.random.default_rng(0))
    assert len(np.unique(np.stack(c[1:]), axis=0)) > len(np.unique(np.stack(cold[1:]), axis=0))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            decoding.candidates(logp, pen, 3, rng=np.random.default_rng(0), temperature=bad)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="penalty"):
        decoding.viterbi(np.zeros((2, 2)), -1.0)
    with pytest.raises(ValueError, match="penalty"):
        decoding.sample_chain(np.zeros((2, 2)), -1.0, np.random.default_rng(0), 1)
    with pytest.raises(ValueError, match="mask shape"):
        decoding.masked_log_probs(np.zeros((2, 2)), np.ones((2, 3), dtype=bool))
    # NaN passed `penalty < 0` (the plan then came from independent units), inf forbade changes
    for bad in (float("nan"), float("inf"), True, "2"):
        with pytest.raises(ValueError, match="penalty must be a finite number >= 0"):
            decoding.viterbi(np.zeros((2, 2)), bad)
        with pytest.raises(ValueError, match="penalty must be a finite number >= 0"):
            decoding.sample_chain(np.zeros((2, 2)), bad, np.random.default_rng(0), 1)


def test_plan_chain_decoding_keeps_the_best_scored_placement() -> None:
    """plan(): placement 0 is the Viterbi one, at most K oracle calls, deterministic, best kept."""
    from agents import generalist as G
    from agents.export import load_policy
    from graphs import synthetic
    from placement_env.encoding import unit_graph
    from placement_env.oracles.simulator import Simulator

    g = synthetic.sample(np.random.default_rng(1), "layered", min_nodes=60, max_nodes=60)
    c = G.sample_cluster(np.random.default_rng(1), "pcie", 4, hetero=True)
    pol = load_policy("generalist")
    one = pol.plan(g, c, samples=1, seed=0, penalty=3.0)
    assert one.meta["decode"] == "chain" and one.meta["oracle_calls"] == 1
    # the single placement is the chain's Viterbi path, read off the same scores
    env = pol.make_env(g, c, Simulator(g, c, microbatches=8, schedule="1f1b"))
    obs, _ = env.reset(seed=0)
    enc = env.unwrapped.enc
    N = obs["node_mask"].shape[-1]
    logits = pol.logits({k: v[None] for k, v in obs.items()}).view(N, -1).numpy()
    mask = env.unwrapped.action_masks().reshape(N, -1)
    U, D = enc.num_units, enc.num_devices
    path, _ = decoding.viterbi(decoding.masked_log_probs(logits[:U, :D], mask[:U, :D]), 3.0)
    assert np.array_equal(one.placement, path[unit_graph(g).node_unit])
    oracle = Simulator(g, c, microbatches=8, schedule="1f1b")  # plan()'s default oracle
    a = pol.plan(g, c, samples=12, seed=4, penalty=3.0, oracle=oracle)
    assert 1 <= oracle.calls == a.meta["oracle_calls"] <= 12
    assert a.meta["step_time"] <= one.meta["step_time"] + 1e-15  # Viterbi is among the 12
    b = pol.plan(g, c, samples=12, seed=4, penalty=3.0)
    assert np.array_equal(a.placement, b.placement) and a.meta["step_time"] == b.meta["step_time"]
    # default: the ladder of DEFAULT_PENALTY; with as many samples as rungs, exactly their
    # Viterbi placements are scored and the fastest feasible one kept
    lad = pol.plan(g, c, samples=len(decoding.DEFAULT_PENALTY), seed=0)
    assert lad.meta["penalty"] == list(decoding.DEFAULT_PENALTY)
    logp = decoding.masked_log_probs(logits[:U, :D], mask[:U, :D])
    times = [
        Simulator(g, c, microbatches=8, schedule="1f1b")
        .evaluate(decoding.viterbi(logp, p)[0][unit_graph(g).node_unit])
        .step_time
        for p in decoding.DEFAULT_PENALTY
    ]
    assert lad.meta["step_time"] == pytest.approx(min(times), rel=1e-12)
    ind = pol.plan(g, c, samples=2, seed=0, decode="independent")
    assert ind.meta["decode"] == "independent"
    with pytest.raises(ValueError, match="decode"):
        pol.plan(g, c, decode="beam")
    # the sampling temperature: the default is DEFAULT_TEMPERATURE (recorded), a file's
    # meta["decode_temperature"] overrides it, a call overrides both
    assert a.meta["temperature"] == decoding.DEFAULT_TEMPERATURE
    t1 = pol.plan(g, c, samples=12, seed=4, penalty=3.0, temperature=2.5)
    assert t1.meta["temperature"] == 2.5
    pol.meta["decode_temperature"] = 2.5
    try:
        t1b = pol.plan(g, c, samples=12, seed=4, penalty=3.0)
    finally:
        del pol.meta["decode_temperature"]
    assert t1b.meta["temperature"] == 2.5 and np.array_equal(t1b.placement, t1.placement)
    with pytest.raises(ValueError, match="temperature.*chain decoding"):
        pol.plan(g, c, samples=2, decode="independent", temperature=2.0)


# ------------------------------------------------------------ window redraws (fine-tuning)
@settings(max_examples=80, deadline=None)
@given(chains(), st.integers(0, 1000), st.integers(1, 6), st.sampled_from([0.5, 1.0, 6.0]))
def test_resample_window_changes_one_window_only(case, seed: int, window: int, temp: float):
    logits, mask, penalty = case
    logp = decoding.masked_log_probs(logits, mask)
    U = logp.shape[0]
    allowed = np.isfinite(logp)
    rng = np.random.default_rng(seed)
    base = np.array([rng.choice(np.flatnonzero(allowed[u])) for u in range(U)])
    out, start, length = decoding.resample_window(
        logp, base, penalty, rng, window=window, temperature=temp
    )
    assert 1 <= length <= min(window, U) and 0 <= start <= U - length
    outside = np.ones(U, dtype=bool)
    outside[start : start + length] = False
    assert (out[outside] == base[outside]).all()
    assert allowed[np.arange(U), out].all()


def test_resample_window_follows_the_conditional_chain() -> None:
    """Per drawn window, the frequencies of 20,000 redraws against the chain model (window
    log-probabilities / temperature, device changes penalised at the window's edges too)
    conditioned on the units outside it, enumerated by brute force."""
    rng = np.random.default_rng(5)
    logp = decoding.masked_log_probs(rng.normal(0, 1.5, size=(4, 3)))
    base = np.array([0, 2, 2, 1])
    penalty, temp = 0.8, 2.0
    n = 20_000
    draws: dict[tuple[int, int], list[tuple[int, ...]]] = {}
    gen = np.random.default_rng(0)
    for _ in range(n):
        out, start, length = decoding.resample_window(
            logp, base, penalty, gen, window=2, temperature=temp
        )
        draws.setdefault((start, length), []).append(tuple(out.tolist()))
    assert set(draws) == {(s, 1) for s in range(4)} | {(s, 2) for s in range(3)}
    for (start, length), got in draws.items():
        exact = {}
        for win in itertools.product(range(3), repeat=length):
            path = base.copy()
            path[start : start + length] = win
            score = logp[np.arange(start, start + length), list(win)].sum() / temp
            score -= penalty * int((path[1:] != path[:-1]).sum())
            exact[tuple(path.tolist())] = np.exp(score)
        z = sum(exact.values())
        m = len(got)
        paths, counts = np.unique(np.array(got), axis=0, return_counts=True)
        freq = {tuple(p): c / m for p, c in zip(paths.tolist(), counts)}
        assert set(freq) <= set(exact)
        for k, w in exact.items():
            p = w / z
            assert abs(freq.get(k, 0.0) - p) <= 5 * np.sqrt(p * (1 - p) / m) + 1e-12, (k, p)


def test_resample_window_bad_inputs_are_refused() -> None:
    logp = np.log(np.full((3, 2), 0.5))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        decoding.resample_window(logp, np.zeros(3, int), 1.0, rng, window=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        decoding.resample_window(logp, np.zeros(3, int), 1.0, rng, window=2, temperature=0.0)
    with pytest.raises(ValueError, match="base has shape"):
        decoding.resample_window(logp, np.zeros(4, int), 1.0, rng, window=2)


def test_bottleneck_edges_by_hand() -> None:
    # devices along the units: 0 0 | 2 2 2 | 1 | 2 ; device 2 is the busiest it uses
    units = np.array([0, 0, 2, 2, 2, 1, 2])
    busy = np.array([1.0, 0.5, 3.0, 9.0])  # device 3 is idle in this plan: not a candidate
    assert decoding.bottleneck_edges(units, busy).tolist() == [2, 5, 6]
    busy = np.array([4.0, 0.5, 3.0, 9.0])  # now device 0: its one edge, at unit 2
    assert decoding.bottleneck_edges(units, busy).tolist() == [2]
    assert decoding.bottleneck_edges(np.array([1, 1, 1]), busy).size == 0
    assert decoding.bottleneck_edges(np.array([1]), busy).size == 0


@settings(max_examples=60, deadline=None)
@given(chains(), st.integers(0, 1000), st.integers(1, 6), st.data())
def test_resample_window_around_a_unit_holds_it(case, seed: int, window: int, data) -> None:
    logits, mask, penalty = case
    logp = decoding.masked_log_probs(logits, mask)
    U = logp.shape[0]
    around = data.draw(st.integers(0, U - 1))
    rng = np.random.default_rng(seed)
    base = np.array([rng.choice(np.flatnonzero(np.isfinite(logp[u]))) for u in range(U)])
    out, start, length = decoding.resample_window(
        logp, base, penalty, rng, window=window, temperature=2.0, around=around
    )
    assert 1 <= length <= min(window, U) and start <= around < start + length
    assert 0 <= start <= U - length
    outside = np.ones(U, dtype=bool)
    outside[start : start + length] = False
    assert (out[outside] == base[outside]).all()


def test_resample_window_around_spreads_over_the_windows_that_hold_the_unit() -> None:
    logp = np.log(np.full((6, 2), 0.5))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(400):
        _, start, length = decoding.resample_window(
            logp, np.zeros(6, int), 1.0, rng, window=3, around=4
        )
        seen.add((start, length))
    # every window of length 1-3 inside [0, 6) that contains unit 4
    assert seen == {(4, 1), (3, 2), (4, 2), (2, 3), (3, 3)}
    with pytest.raises(ValueError, match="around=6 is not a unit"):
        decoding.resample_window(logp, np.zeros(6, int), 1.0, rng, window=2, around=6)


# ------------------------------------------------------------ link-aware device changes
def _brute_w(logp: np.ndarray, penalty: float, w: np.ndarray) -> dict[tuple[int, ...], float]:
    U, D = logp.shape
    return {
        p: decoding.chain_score(logp, np.array(p), penalty, w)
        for p in itertools.product(range(D), repeat=U)
    }


@settings(max_examples=100, deadline=None)
@given(chains(), st.integers(0, 2**31 - 1))
def test_link_weighted_viterbi_equals_brute_force(case, wseed: int) -> None:
    logits, mask, penalty = case
    D = logits.shape[1]
    w = np.random.default_rng(wseed).uniform(0.2, 4.0, size=(D, D))
    logp = decoding.masked_log_probs(logits, mask)
    path, score = decoding.viterbi(logp, penalty, w)
    assert score == pytest.approx(max(_brute_w(logp, penalty, w).values()), abs=1e-9)
    assert decoding.chain_score(logp, path, penalty, w) == pytest.approx(score, abs=1e-9)
    # weights of one everywhere are the uniform penalty: the same path and score
    ones = np.ones((D, D))
    p1, s1 = decoding.viterbi(logp, penalty, ones)
    p0, s0 = decoding.viterbi(logp, penalty)
    assert np.array_equal(p1, p0) and s1 == pytest.approx(s0, abs=1e-12)


def test_link_weighted_viterbi_by_hand() -> None:
    # unit 1 prefers device 1 (0.5) over device 2 (0.4); a change 0 -> 1 costs 3 x the penalty
    # (a slow link), 0 -> 2 one penalty: the chain goes to device 2 instead
    logp = np.log(np.array([[0.98, 0.01, 0.01], [0.1, 0.5, 0.4]]))
    w = np.array([[0, 3.0, 1.0], [3.0, 0, 1.0], [1.0, 1.0, 0]])
    assert decoding.viterbi(logp, 0.5)[0].tolist() == [0, 1]
    path, score = decoding.viterbi(logp, 0.5, w)
    assert path.tolist() == [0, 2]
    assert score == pytest.approx(np.log(0.98 * 0.4) - 0.5)


def test_link_weighted_samples_follow_the_chain_distribution() -> None:
    rng = np.random.default_rng(5)
    logp = decoding.masked_log_probs(rng.normal(0, 1, size=(3, 3)))
    w = np.array([[0, 0.5, 3.0], [0.5, 0, 1.0], [3.0, 1.0, 0]])
    scores = _brute_w(logp, 1.5, w)
    keys = list(scores)
    e = np.exp(np.array([scores[k] for k in keys]))
    exact = dict(zip(keys, e / e.sum()))
    n = 40_000
    s = decoding.sample_chain(logp, 1.5, np.random.default_rng(0), n, w)
    paths, counts = np.unique(s, axis=0, return_counts=True)
    freq = {tuple(p): c / n for p, c in zip(paths.tolist(), counts)}
    for k, p in exact.items():
        assert abs(freq.get(k, 0.0) - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12, (k, p)


def test_link_weights_of_clusters() -> None:
    from graphs import clusters

    dgx1 = clusters.load("dgx1_v100_8")
    bw = dgx1.bandwidth_matrix()
    off = ~np.eye(8, dtype=bool)
    w1 = decoding.link_weights(dgx1, 1.0)
    assert np.allclose(w1[off], bw[off].max() / bw[off]) and np.all(np.diag(w1) == 0)
    assert w1[off].min() == 1.0 and w1[off].max() > 1.0  # the hybrid cube mesh is not uniform
    assert np.allclose(decoding.link_weights(dgx1, 0.5)[off], np.sqrt(w1[off]))
    assert np.all(decoding.link_weights(dgx1, 0.0)[off] == 1.0)
    with pytest.raises(ValueError, match="link exponent"):
        decoding.link_weights(dgx1, -1.0)
    with pytest.raises(ValueError, match="link weights"):
        decoding.viterbi(np.zeros((2, 3)), 1.0, np.ones((2, 2)))


def test_plan_with_link_aware_decoding() -> None:
    from agents import generalist as G
    from agents.export import load_policy
    from graphs import clusters, synthetic

    g = synthetic.sample(np.random.default_rng(1), "layered", min_nodes=60, max_nodes=60)
    pol = load_policy("generalist")
    # default: exponent 1 (recorded); 0 is the uniform penalty
    c = clusters.load("dgx1_v100_8")
    aware = pol.plan(g, c, samples=32, seed=0)
    assert aware.meta["link_exponent"] == decoding.DEFAULT_LINK_EXPONENT == 1.0
    assert aware.meta["oracle_calls"] <= 32
    again = pol.plan(g, c, samples=32, seed=0, link_exponent=1.0)
    assert np.array_equal(aware.placement, again.placement)
    base = pol.plan(g, c, samples=32, seed=0, link_exponent=0.0)
    assert base.meta["link_exponent"] == 0.0
    # on a cluster whose routes all cost the same, every change weighs 1: the same plan
    u = G.sample_cluster(np.random.default_rng(2), "nvswitch", 4, hetero=False)
    assert np.all(decoding.link_weights(u, 2.0)[~np.eye(4, dtype=bool)] == 1.0)
    assert np.array_equal(
        pol.plan(g, u, samples=16, seed=0, link_exponent=2.0).placement,
        pol.plan(g, u, samples=16, seed=0).placement,
    )
    # a file's meta["decode_link_exponent"] is the default, a call overrides it
    pol.meta["decode_link_exponent"] = 0.0
    try:
        assert np.array_equal(pol.plan(g, c, samples=32, seed=0).placement, base.placement)
        again = pol.plan(g, c, samples=32, seed=0, link_exponent=1.0)
        assert np.array_equal(again.placement, aware.placement)
    finally:
        del pol.meta["decode_link_exponent"]
    with pytest.raises(ValueError, match="link_exponent.*chain decoding"):
        pol.plan(g, c, samples=2, decode="independent", link_exponent=1.0)
    # penalty= was taken and ignored by independent decoding; oracle="sim" an AttributeError
    # (fuzzing, 2 Dec 2026)
    with pytest.raises(
        ValueError, match=r"penalty=1.0 is for chain decoding; this plan decodes 'independent'"
    ):
        pol.plan(g, c, samples=2, decode="independent", penalty=1.0)
    with pytest.raises(
        ValueError, match="oracle must be an oracle object with .evaluate .* got 'sim'"
    ):
        pol.plan(g, c, samples=2, oracle="sim")
    for bad in (True, "0.5", 0.0, float("nan")):  # True and "0.5" were taken (fuzzing)
        with pytest.raises(ValueError, match="temperature must be a finite number > 0, got"):
            pol.plan(g, c, samples=2, temperature=bad)
    # a numpy seed failed inside gymnasium's reset (fuzzing): it plans as the int does
    for decode in ("chain", "independent"):
        a = pol.plan(g, c, samples=4, seed=np.int64(3), decode=decode, greedy=False)
        b = pol.plan(g, c, samples=4, seed=3, decode=decode, greedy=False)
        assert np.array_equal(a.placement, b.placement)
