"""Static-order pipeline schedules (GPipe, 1F1B, interleaved 1F1B) simulated for one pipeline replica (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

#: Schedule name -> kernel code.
PIPELINE_SCHEDULES = {"gpipe": 0, "1f1b": 1, "interleaved": 2}


@njit(cache=True)
def rank_order(
    code: int, r: int, P: int, v: int, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The op order of pipeline rank ``r``: arrays ``(is_bwd, chunk, microbatch)``.

    ``gpipe``: all forwards then all backwards, microbatch order. ``1f1b``
    (PipeDream-flush, Narayanan et al. 2021): ``min(P - r - 1, m)`` warm-up forwards, then
    alternate one forward and one backward, then the remaining backwards.
    ``interleaved`` (Megatron-LM ``forward_backward_pipelining_with_interleaving``): the
    ``m v`` virtual microbatches in groups of ``P`` per model chunk, warm-up
    ``min(2 (P - r - 1) + (v - 1) P, m v)``, then 1F1B; backwards visit the chunks in
    reverse. Chunk ``k`` of rank ``r`` is global chunk ``k P + r``.
    """
    n = m * v
    fc = np.empty(n, np.int64)
    fm = np.empty(n, np.int64)
    bc = np.empty(n, np.int64)
    for k in range(n):
        if code == 2:
            grp = k // P
            cl = grp % v
            mb = (k // (P * v)) * P + k % P
            fc[k] = cl * P + r
            bc[k] = (v - 1 - cl) * P + r
            fm[k] = mb
        else:
            fc[k] = r
            bc[k] = r
            fm[k] = k
    if code == 0:
        w = n
    elif code == 1:
        w = min(P - r - 1, n)
    else:
        w = min(2 * (P - r - 1) + (v - 1) * P, n)
    isb = np.empty(2 * n, np.int8)
    ch = np.empty(2 * n, np.int64)
    mbs = np.empty(2 * n, np.int64)
    j = 0
    for k in range(w):
        isb[j], ch[j], mbs[j] = 0, fc[k], fm[k]
        j += 1
    for i in range(n - w):
        isb[j], ch[j], mbs[j] = 0, fc[w + i], fm[w + i]
        j += 1
        isb[j], ch[j], mbs[j] = 1, bc[i], fm[i]
        j += 1
    for i in range(n - w, n):
        isb[j], ch[j], mbs[j] = 1, bc[i], fm[i]
        j += 1
    return isb, ch, mbs


def simulate_pipeline(
    code: int,
    P: int,
    v: int,
    m: int,
    fdur: np.ndarray,
    bdur: np.ndarray,
    p2p_f: np.ndarray,
    p2p_b: np.ndarray,
    act: np.ndarray,
    bwd_extra: np.ndarray | None = None,
    bwd_persist: np.ndarray | None = None,
    return_kept: bool = False,
) -> tuple:
    """Run every rank's static order with cross-rank dependencies.

    Chunk ``c`` (of ``C = P v``) runs on rank ``c % P``; its forward of microbatch ``i``
    waits for chunk ``c - 1``'s forward plus ``p2p_f[c - 1]``; its backward waits for
    its own forward and for chunk ``c + 1``'s backward plus ``p2p_b[c]``. ``fdur`` /
    ``bdur`` are per-chunk op times (s), ``act`` the activation bytes one microbatch of a
    chunk keeps from its forward until its backward. ``bwd_extra[c]`` (default 0) is what a
    backward of chunk ``c`` adds, at its own peak, to the bytes held when it starts
    (the layer being recomputed, less what the backward has freed by then; may be < 0):
    the rank's peak is the maximum over the ends of its forwards and these backward peaks.
    ``bwd_persist[c]`` (default 0) bytes become resident on the rank when chunk ``c``'s
    first backward ends and stay to the end of the step (gradients accumulated unsharded
    across microbatches).

    Returns ``(makespan, rank_end[P], rank_busy[P], chunk_last_bwd[C, 2] (start, end of the
    last backward op of each chunk), peak_act[P])``, with ``return_kept`` also
    ``peak_kept[P]`` (the peak of the ``act`` terms alone); makespan ``-1`` on deadlock.
    """
    if bwd_extra is None:
        bwd_extra = np.zeros(P * v)
    if bwd_persist is None:
        bwd_persist = np.zeros(P * v)
    out = _simulate_pipeline(
        code,
        P,
        v,
        m,
        np.asarray(fdur, np.float64),
        np.asarray(bdur, np.float64),
        np.asarray(p2p_f, np.float64),
        np.asarray(p2p_b, np.float64),
        np.asarray(act, np.float64),
        np.asarray(bwd_extra, np.float64),
        np.asarray(bwd_persist, np.float64),
    )
    return out if return_kept else out[:5]


@njit(cache=True)
def _simulate_pipeline(
    code: int,
    P: int,
    v: int,
    m: int,
    fdur: np.ndarray,
    bdur: np.ndarray,
    p2p_f: np.ndarray,
    p2p_b: np.ndarray,
    act: np.ndarray,
    bwd_extra: np.ndarray,
    bwd_persist: np.ndarray,
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    C = P * v
    fin_f = np.full((C, m), -1.0)
    fin_b = np.full((C, m), -1.0)
    ptr = np.zeros(P, np.int64)
    free = np.zeros(P)
    busy = np.zeros(P)
    cur = np.zeros(P)
    peak = np.zeros(P)
    kept = np.zeros(P)  # the act terms alone
    peak_kept = np.zeros(P)
    last_b = np.full((C, 2), -1.0)
    nops = 2 * m * v
    isb_all = np.empty((P, nops), np.int8)
    ch_all = np.empty((P, nops), np.int64)
    mb_all = np.empty((P, nops), np.int64)
    for r in range(P):
        a, b, c = rank_order(code, r, P, v, m)
        isb_all[r] = a
        ch_all[r] = b
        mb_all[r] = c
    done = 0
    total = P * nops
    while done < total:
        progressed = False
        for r in range(P):
            while ptr[r] < nops:
                k = ptr[r]
                c = ch_all[r, k]
                i = mb_all[r, k]
                if isb_all[r, k] == 0:
                    if c == 0:
                        ready = 0.0
                    else:
                        if fin_f[c - 1, i] < 0:
                            break
                        ready = fin_f[c - 1, i] + p2p_f[c - 1]
                    start = max(free[r], ready)
                    end = start + fdur[c]
                    fin_f[c, i] = end
                    cur[r] += act[c]
                    if cur[r] > peak[r]:
                        peak[r] = cur[r]
                    kept[r] += act[c]
                    if kept[r] > peak_kept[r]:
                        peak_kept[r] = kept[r]
                else:
                    if fin_f[c, i] < 0:
                        break
                    ready = fin_f[c, i]
                    if c < C - 1:
                        if fin_b[c + 1, i] < 0:
                            break
                        ready = max(ready, fin_b[c + 1, i] + p2p_b[c])
                    start = max(free[r], ready)
                    end = start + bdur[c]
                    fin_b[c, i] = end
                    if cur[r] + bwd_extra[c] > peak[r]:
                        peak[r] = cur[r] + bwd_extra[c]
                    cur[r] -= act[c]
                    kept[r] -= act[c]
                    if last_b[c, 1] < 0:  # the chunk's first backward
                        cur[r] += bwd_persist[c]
                        if cur[r] > peak[r]:
                            peak[r] = cur[r]
                    if end > last_b[c, 1]:
                        last_b[c, 0] = start
                        last_b[c, 1] = end
                    busy[r] += bdur[c]
                if isb_all[r, k] == 0:
                    busy[r] += fdur[c]
                free[r] = end
                ptr[r] += 1
                done += 1
                progressed = True
        if not progressed:
            return -1.0, free, busy, last_b, peak, peak_kept
    return float(free.max()), free, busy, last_b, peak, peak_kept


def bubble_fraction(P: int, v: int, m: int) -> float:
    """Pipeline bubble over ideal time for uniform stages: ``(P - 1) / (v m)``."""
    return (P - 1) / (v * m)


__all__ = ["PIPELINE_SCHEDULES", "bubble_fraction", "rank_order", "simulate_pipeline"]
