"""How many ideals a precedence DAG has: what `ideal_dp`'s DP over ideals would have to visit.

An *ideal* is a downward-closed item set (:mod:`agents.baselines.ideal_dp`). Counting them
is #P-hard in general (Provan & Ball, SIAM J. Comput. 1983), but the DAGs of DNN graphs are
close to series-parallel, where the count follows their decomposition:

* *series*: the items comparable with every other item of a set ``S`` form a chain ``c_1 <
  ... < c_r`` cutting ``S`` into segments ``A_0 < c_1 < A_1 < ... < c_r < A_r``; an ideal
  holds ``c_1 .. c_i`` and everything before ``c_i``, plus an ideal of ``A_i``, so
  ``N(S) = sum_i N(A_i)``;
* *parallel*: the weakly connected components of ``S`` are independent, so ``N(S)`` is the
  product of theirs;
* otherwise, on a minimal item ``m``: the ideals without ``m`` are those of ``S`` minus
  ``m`` and everything above it, the ideals with ``m`` are ``m`` plus an ideal of ``S - m``.

Sets are Python integers used as bitsets; counts of sub-sets are memoised. A time limit
stops the count (``None``): the third rule branches, so a DAG far from series-parallel can
take long.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from graphs.schema import is_number, is_whole


class _Stop(Exception):
    pass


def count_ideals(succ: Sequence[Sequence[int]], *, time_limit: float | None = None) -> int | None:
    """The number of ideals (the empty set and the whole set included) of the DAG whose
    successor lists are ``succ`` (items ``0 .. B-1`` numbered topologically: every edge
    goes from a smaller to a larger number); ``None`` when ``time_limit`` seconds pass
    first."""
    if time_limit is not None and not is_number(time_limit, 0, lo_open=True):
        raise ValueError(
            f"count_ideals: time_limit must be a finite number of seconds > 0 or None (no "
            f"limit), got {time_limit!r}"
        )
    if isinstance(succ, (str, bytes)) or not isinstance(succ, (Sequence, np.ndarray)):
        raise ValueError(f"count_ideals: succ must be a list of successor lists, got {succ!r}")
    B = len(succ)
    for v, ws in enumerate(succ):
        if isinstance(ws, (str, bytes)) or not isinstance(ws, (Sequence, np.ndarray, set)):
            raise ValueError(f"count_ideals: succ[{v}] must be a list of item numbers, got {ws!r}")
        for w in ws:
            if not is_whole(w):
                raise ValueError(f"count_ideals: succ[{v}] holds {w!r}, not an item number")
            if not v < int(w) < B:
                raise ValueError(
                    f"count_ideals: edge {v} -> {w} is not from a smaller to a larger item "
                    f"number of {B}"
                )
    pred: list[list[int]] = [[] for _ in range(B)]
    for v, ws in enumerate(succ):
        for w in ws:
            pred[int(w)].append(v)
    desc = [0] * B
    for v in range(B - 1, -1, -1):
        m = 0
        for w in succ[v]:
            m |= (1 << int(w)) | desc[int(w)]
        desc[v] = m
    anc = [0] * B
    for v in range(B):
        m = 0
        for u in pred[v]:
            m |= (1 << u) | anc[u]
        anc[v] = m
    nbr = [[int(w) for w in succ[v]] + pred[v] for v in range(B)]
    deadline = None if time_limit is None else time.perf_counter() + float(time_limit)
    memo: dict[int, int] = {}

    def members(S: int) -> list[int]:
        out = []
        while S:
            low = S & -S
            out.append(low.bit_length() - 1)
            S ^= low
        return out

    def count(S: int) -> int:
        if S == 0:
            return 1
        hit = memo.get(S)
        if hit is not None:
            return hit
        if deadline is not None and time.perf_counter() > deadline:
            raise _Stop
        items = members(S)
        cuts = [c for c in items if ((anc[c] | desc[c] | (1 << c)) & S) == S]
        if cuts:  # series: segments between the items comparable with all others
            total, below = 0, 0
            for c in cuts:  # increasing numbers = increasing in the chain
                total += count(anc[c] & S & ~below)
                below |= anc[c] | (1 << c)
            total += count(S & ~below)
        else:
            comps, rest = [], S
            while rest:
                low = rest & -rest
                seed = low.bit_length() - 1
                comp, stack = low, [seed]
                while stack:
                    v = stack.pop()
                    for w in nbr[v]:
                        bit = 1 << w
                        if S & bit and not comp & bit:
                            comp |= bit
                            stack.append(w)
                comps.append(comp)
                rest &= ~comp
            if len(comps) > 1:  # parallel: independent components
                total = 1
                for comp in comps:
                    total *= count(comp)
            else:  # branch on a minimal item
                m = next(v for v in items if not anc[v] & S)
                total = count(S & ~((1 << m) | desc[m])) + count(S & ~(1 << m))
        memo[S] = total
        return total

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * B + 1000))
    try:
        return count((1 << B) - 1)
    except _Stop:
        return None
    finally:
        sys.setrecursionlimit(limit)


__all__ = ["count_ideals"]
