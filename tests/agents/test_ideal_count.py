"""count_ideals: the number of downward-closed item sets, against enumeration."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.baselines.ideal_count import count_ideals


def _enumerate(succ) -> int:
    B = len(succ)
    n = 0
    for mask in range(1 << B):
        if all(not (mask >> w) & 1 or (mask >> v) & 1 for v in range(B) for w in succ[v]):
            n += 1
    return n


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 12).flatmap(
    lambda B: st.tuples(
        st.just(B),
        st.sets(st.tuples(st.integers(0, max(B - 1, 0)), st.integers(0, max(B - 1, 0)))),
    )
))  # fmt: skip
def test_count_equals_enumeration_on_random_dags(case):
    B, pairs = case
    succ = [sorted({w for v2, w in pairs if v2 == v and v < w}) for v in range(B)]
    assert count_ideals(succ) == _enumerate(succ)


def test_chains_antichains_and_series_parallel_by_hand():
    assert count_ideals([]) == 1
    assert count_ideals([[1], [2], [3], []]) == 5  # a chain of 4: its 5 prefixes
    assert count_ideals([[] for _ in range(10)]) == 2**10  # an antichain: every subset
    # a diamond 0 -> {1, 2} -> 3: {}, {0}, {0,1}, {0,2}, {0,1,2}, all
    assert count_ideals([[1, 2], [3], [3], []]) == 6
    # two chains of 3 side by side: 4 x 4
    assert count_ideals([[1], [2], [], [4], [5], []]) == 16
    # an N (0 -> 2, 1 -> 2, 1 -> 3): not series-parallel
    succ = [[2], [2, 3], [], []]
    assert count_ideals(succ) == _enumerate(succ) == 8


def test_wide_graphs_count_fast_and_the_time_limit_gives_none():
    # 200 independent diamonds in parallel: 6 ** 200 ideals, counted by the decomposition
    succ = []
    for d in range(200):
        b = 4 * d
        succ += [[b + 1, b + 2], [b + 3], [b + 3], []]
    assert count_ideals(succ, time_limit=10) == 6**200
    # a layered DAG far from series-parallel stops at its limit
    layers = [list(range(5 * i, 5 * i + 5)) for i in range(60)]
    succ = [[] for _ in range(300)]
    for a, b in itertools.pairwise(layers):
        for i, v in enumerate(a):
            succ[v] = [b[i], b[(i + 2) % 5]]
    assert count_ideals(succ, time_limit=1e-6) is None  # (0 is refused: not a limit)


def test_refuses_edges_that_do_not_go_forward():
    with pytest.raises(ValueError, match="edge 1 -> 0"):
        count_ideals([[], [0]])


@pytest.mark.parametrize(
    "succ, kw, says",
    [
        # -1 and 0 returned None ("timed out"), nan meant no limit, "5" and True were taken
        ([[1], [2], []], {"time_limit": -1}, "time_limit must be a finite number of seconds > 0"),
        ([[1], [2], []], {"time_limit": 0}, "time_limit must be a finite number of seconds > 0"),
        ([[1], [2], []], {"time_limit": float("nan")}, "time_limit must be a finite number"),
        ([[1], [2], []], {"time_limit": "5"}, "time_limit must be a finite number"),
        ([[1], [2], []], {"time_limit": True}, "time_limit must be a finite number"),
        ([[1.5], [2], []], {}, r"succ\[0\] holds 1.5, not an item number"),  # was cut to 1
        ([["1"], [2], []], {}, r"succ\[0\] holds '1', not an item number"),
        (None, {}, "succ must be a list of successor lists, got None"),  # was a TypeError
        ([3, [], []], {}, r"succ\[0\] must be a list of item numbers, got 3"),
    ],
)
def test_bad_arguments_are_refused_by_name(succ, kw, says):
    with pytest.raises(ValueError, match=f"count_ideals: {says}"):
        count_ideals(succ, **kw)
    assert count_ideals([[1], [2], []], time_limit=5) == 4  # a chain of 3: 4 ideals
    assert count_ideals([(1, 2), set(), []], time_limit=None) == 5


def test_count_ideals_script_refuses_a_limit_that_is_not_a_positive_number(monkeypatch):
    from tests.scripts import load_script

    c = load_script("count_ideals")
    for bad in ("nan", "-1", "0", "inf"):
        monkeypatch.setattr("sys.argv", ["count_ideals.py", "--seconds", bad, "--no-write"])
        with pytest.raises(SystemExit) as e:
            c.main()
        assert e.value.code == 2


def test_ideal_dp_reports_a_count_past_the_float_range_as_inf():
    from agents.baselines.ideal_dp import _as_float

    assert _as_float(3**1000) == float("inf") and _as_float(6**200) == float(6**200)


def test_run_growing_starts_at_the_counted_total_and_runs_once():
    from agents.baselines._ideal_kernel import STATUS_DONE, STATUS_IDEALS
    from agents.baselines.ideal_dp import run_growing

    def dp(reached):  # a DP that needs `reached` ideals: runs out below that
        calls = []

        def call(limit):
            calls.append(limit)
            status = STATUS_IDEALS if limit < reached else STATUS_DONE
            return status, None, 0.0, min(limit, reached), 10

        return call, calls

    call, calls = dp(553_270)  # bench_exact's series-parallel-s: 951,999 ideals in all
    assert run_growing(call, 5_000_000)[1] == 800_000 and calls == [200_000, 800_000]
    call, calls = dp(553_270)
    out, limit = run_growing(call, 5_000_000, 951_999)
    assert calls == [951_999] and limit == 951_999 and out[4] == 10  # stages of one run
