"""Numba kernel of `ideal_dp`: the DP over ideals of a precedence DAG, max-load stage costs.

Called by :mod:`agents.baselines.ideal_dp`, which explains the model. Terms:
*items* are the DP's atoms (colocation units fused along cycles), numbered in a
topological order; an *ideal* is a downward-closed item set; a *stage* is the
difference ``I \\ J`` of two ideals ``J <= I``, placed on one device of one
*class* (identical devices). ``dp[I, k]`` is the least bottleneck over splits of
ideal ``I`` into stages using ``k`` devices of each class (``k`` a mixed-radix
index over classes).

The kernel relaxes forwards: ideals are taken in order of size; from each ``J``
it enumerates every stage ``S`` (an ideal of the items outside ``J``) by reverse
search, each exactly once (``S``'s largest item is the one added last), while
keeping ``S``'s compute, memory and transfer charges up to date, so a stage
costs O(its boundary) to score. A branch is cut when no class can hold ``S``
(memory and compute only grow with ``S``) or its compute alone exceeds the
upper bound ``UB`` (any stage of a better split costs at most ``UB``). A stage is
not relaxed when the work left after it exceeds what the free devices can do
within ``UB`` (``rate[c]`` of it per class-``c`` device), and, with ``strict``
(``UB`` is a plan's objective), when it only ties ``UB``. Candidates are kept
sorted, so in a branch every candidate passed over and every item after it stays
outside ``S``: their work is a lower bound on the work left after any stage of the
branch, and the branch is cut when it exceeds what the free devices can do within
``UB`` (this cut took bench_exact's series-parallel-s from 548.6 s to 4.4 s).

*Transfer cut* (``lbcut``). Some transfer charges of ``S`` are kept by every stage
of its branch: ``J`` never joins ``S``, nor does a *dead* item (a skipped
candidate and its successors, above). So a node ``x`` in ``S`` pays at least its
dearest consumer in ``J`` or a dead item (``lbo[x]``), and a node ``y`` in ``J`` or a
dead item, outside every extension, pays at least its dearest consumer in ``S``
(``lbi[y]``) -- both only grow as ``S`` grows and items die. On a class that pays
transfers a stage of the branch costs at least compute + ``lbsum``; the branch is
cut when no class can take it within ``UB`` (CPUs pay no transfers, so their
compute alone decides for them). On bench_exact's series-parallel-l, whose loads
are mostly transfers, this took the stages scored per ideal from millions to about
two (5.3 million stages for 2.8 million ideals in 6 s; before, 1.6e9 stages for 67
ideals in 600 s).

Ideals are created only when reached by a stage within ``UB``, keyed by a 64-bit
Zobrist hash and checked bit for bit.

*Summed* (``summed=True``, for `ideal_dp_makespan`): ``dp[I, k]`` is the least *sum* of
stage costs, ``UB`` a fixed cap on every stage (``strict``: below it) and every cut
above stays valid, as each is about one stage against ``UB``. Sums are kept only
below ``SB`` (``sb0``, then the best split of every item found); a stage's cost is at
least its work, so ``J`` is skipped when ``dp[J] + work left >= SB``.

*Position-dependent memory* (``posmem``, for `ideal_dp_makespan` under 1F1B): a stage
placed after ``p`` others holds ``mem_item`` plus ``act_extra[p]`` of its items'
``act_item``; ``mem_item`` is the least over positions (``act_extra >= 0``), so the
branch cuts on it stay valid and the position is checked when a stage is relaxed.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit
from numba import types as nbt
from numba.typed import Dict

STATUS_DONE = 0
STATUS_TIME = 1
STATUS_IDEALS = 2
STATUS_COLLISION = 3
STATUS_STACK = 4


@njit(cache=True)
def _recompute_out(x, optr, oidx, ocost, node_item, inS):
    """(largest cost of x's consumers outside S, how many consumers reach it)."""
    m = 0.0
    cnt = 0
    for e in range(optr[x], optr[x + 1]):
        if not inS[node_item[oidx[e]]]:
            if ocost[e] > m:
                m = ocost[e]
                cnt = 1
            elif ocost[e] == m:
                cnt += 1
    return m, cnt


@njit(cache=True)
def _charge(
    item, own, in_a, in_b, inptr, inidx, optr, oidx, ocost, iptr, iidx, icost, node_item,
    lb, l_node, l_kind, l_val, lbsum, ltop,
):  # fmt: skip
    """Charge for good the transfers between ``item``'s nodes and the items marked in
    ``in_a`` or ``in_b``: each node of ``item`` its dearest consumer there (row ``own`` of
    ``lb``), each producer there its dearest consumer in ``item`` (the other row).

    Item ``v`` joining S: ``own`` = 0 (``lbo``), the marked items J and the dead ones.
    Item ``d`` dying: ``own`` = 1 (``lbi``), the marked items S (``in_a = in_b = inS``)."""
    other = 1 - own
    for q in range(inptr[item], inptr[item + 1]):
        x = inidx[q]
        m = 0.0
        for e in range(optr[x], optr[x + 1]):
            it = node_item[oidx[e]]
            if (in_a[it] or in_b[it]) and ocost[e] > m:
                m = ocost[e]
        if m > lb[own, x]:
            l_node[ltop] = x
            l_kind[ltop] = own
            l_val[ltop] = lb[own, x]
            ltop += 1
            lbsum += m - lb[own, x]
            lb[own, x] = m
        for e in range(iptr[x], iptr[x + 1]):
            y = iidx[e]
            it = node_item[y]
            if (in_a[it] or in_b[it]) and icost[e] > lb[other, y]:
                l_node[ltop] = y
                l_kind[ltop] = other
                l_val[ltop] = lb[other, y]
                ltop += 1
                lbsum += icost[e] - lb[other, y]
                lb[other, y] = icost[e]
    return lbsum, ltop


@njit(cache=True)
def ideal_dp_kernel(
    B,  # number of items
    sptr,  # int64[B+1] CSR successors (precedence)
    sidx,  # int64[.]
    npred,  # int64[B] number of distinct predecessors
    pptr,  # int64[B+1] CSR predecessors
    pidx,  # int64[.]
    inptr,  # int64[B+1] CSR nodes of each item
    inidx,  # int64[.]
    node_item,  # int64[n]
    optr,  # int64[n+1] CSR consumer pairs of each node (other items only)
    oidx,  # int64[.] consumer node
    ocost,  # float64[.] transfer cost of the pair
    iptr,  # int64[n+1] CSR producer pairs of each node (other items only)
    iidx,  # int64[.] producer node
    icost,  # float64[.]
    comp_item,  # float64[B, K] compute per item per class
    work_item,  # float64[B] least compute of the item over classes (finite)
    mem_item,  # float64[B]
    cap,  # float64[K]
    pays,  # bool[K] class is charged transfers
    counts,  # int64[K] devices per class
    ub0,  # float64 upper bound on the optimum (inf = none)
    keys,  # int64[B] Zobrist keys
    max_ideals,  # int64
    deadline,  # float64 time.perf_counter() deadline
    rate,  # float64[K] most work (least compute over classes) one unit of class-c time can do
    strict,  # bool: keep only splits strictly better than the bound (it is a plan's objective)
    lbcut,  # bool: cut branches by the transfers no extension of S avoids
    summed,  # bool: dp[I, k] = least *sum* of stage costs, every stage within the cap ub0
    sb0,  # float64 (summed) keep only sums strictly below this (inf = none)
    posmem,  # bool: a stage's memory also depends on its position (see act_extra)
    act_item,  # float64[B] (posmem) activation bytes of the item, all microbatches
    act_extra,  # float64[P] (posmem) share of act_item a stage at position p adds to mem_item
):
    K = counts.shape[0]
    n = node_item.shape[0]
    W = (B + 63) // 64
    NK = 1
    stride = np.zeros(K, np.int64)
    for c in range(K):
        stride[c] = NK
        NK *= counts[c] + 1
    kc = np.zeros((NK, K), np.int64)
    for k in range(NK):
        r = k
        for c in range(K):
            kc[k, c] = r % (counts[c] + 1)
            r //= counts[c] + 1
    # position of the next stage: the devices used so far
    npos = np.zeros(NK, np.int64)
    for k in range(NK):
        for c in range(K):
            npos[k] += kc[k, c]
    # what the devices left after a stage on class c can absorb, per unit of bound
    absorb = np.zeros((NK, K))
    for k in range(NK):
        for c in range(K):
            a = 0.0
            for c2 in range(K):
                free = counts[c2] - kc[k, c2] - (1 if c2 == c else 0)
                if free > 0:
                    a += free * rate[c2]
            absorb[k, c] = a
    total_work = 0.0
    for v in range(B):
        total_work += work_item[v]
    bits = np.zeros((max_ideals, W), np.uint64)
    isize = np.zeros(max_ideals, np.int64)
    ihash = np.zeros(max_ideals, np.int64)
    dp = np.full((max_ideals, NK), np.inf)
    bJ = np.full((max_ideals, NK), -1, np.int32)
    bC = np.full((max_ideals, NK), -1, np.int8)
    nxt = np.full(max_ideals, -1, np.int64)
    head = np.full(B + 1, -1, np.int64)
    tail = np.full(B + 1, -1, np.int64)
    table = Dict.empty(key_type=nbt.int64, value_type=nbt.int64)
    table[0] = 0
    nI = 1
    dp[0, 0] = 0.0
    head[0] = 0
    tail[0] = 0
    UB = ub0
    SB = sb0  # summed: the least sum of a split of every item found so far
    stol = 1.0 - 1e-12
    # keep a value when it is <= UB * tol; with `strict` only values below UB survive
    tol = 1.0 - 1e-9 if strict else 1.0 + 1e-12
    # a branch is cut by its unavoidable transfers only past this (a hair above the relax test)
    ub_cut = UB * tol + 1e-10 * UB

    inJ = np.zeros(B, np.bool_)
    inS = np.zeros(B, np.bool_)
    missing = np.zeros(B, np.int64)
    outc = np.zeros(n)
    outn = np.zeros(n, np.int64)  # consumers outside S whose cost equals outc
    fresh = np.full(n, -1, np.int64)  # visit at which outc was recomputed with all of v inside
    inc = np.zeros(n)
    ustack_cap = 2 * n + 2 * oidx.shape[0] + 2 * iidx.shape[0] + 16
    u_node = np.empty(ustack_cap, np.int64)
    u_kind = np.empty(ustack_cap, np.int8)
    u_val = np.empty(ustack_cap, np.float64)
    u_cnt = np.empty(ustack_cap, np.int64)
    f_item = np.zeros(B + 1, np.int64)
    f_umark = np.zeros(B + 1, np.int64)
    f_cs = np.zeros(B + 1, np.int64)
    f_cl = np.zeros(B + 1, np.int64)
    f_cp = np.zeros(B + 1, np.int64)
    f_comp = np.zeros((B + 1, K))
    f_mem = np.zeros(B + 1)
    f_act = np.zeros(B + 1)
    f_comm = np.zeros(B + 1)
    f_work = np.zeros(B + 1)
    cand_cap = 64 * B + 1024
    cand = np.empty(cand_cap, np.int64)
    bitsS = np.zeros(W, np.uint64)
    costc = np.zeros(K)
    # items that can no longer join S in the current branch (skipped candidates and
    # everything after them): their work stays for the devices after this stage
    dead = np.zeros(B, np.bool_)
    d_stack = np.empty(B, np.int64)
    t_stack = np.empty(B, np.int64)
    fr = np.empty(B, np.int64)  # freed successors of the item just added, sorted
    f_dmark = np.zeros(B + 1, np.int64)
    f_dwork = np.zeros(B + 1)
    okc = np.zeros(K, np.bool_)
    # transfer charges no extension of S in this branch can avoid: lbo[x] (x in S) = x's
    # dearest consumer in J or a dead item, lbi[y] (y in J or a dead item) = y's dearest
    # consumer in S; lbsum = their total (see the module docstring)
    lb = np.zeros((2, n))  # rows: lbo, lbi
    l_node = np.empty(ustack_cap, np.int64)
    l_kind = np.empty(ustack_cap, np.int8)
    l_val = np.empty(ustack_cap, np.float64)
    f_lmark = np.zeros(B + 1, np.int64)
    f_lsum = np.zeros(B + 1)
    lbsum = 0.0
    ltop = 0
    status = STATUS_DONE
    visited = 0
    full_hash = 0
    for v in range(B):
        full_hash ^= keys[v]

    for s in range(B):
        J = head[s]
        while J != -1 and status == STATUS_DONE:
            bestJ = np.inf
            for k in range(NK):
                if dp[J, k] < bestJ:
                    bestJ = dp[J, k]
            if (bestJ == np.inf) if summed else (bestJ > UB * tol):
                J = nxt[J]
                continue
            # ---- set up J
            workJ = total_work
            for v in range(B):
                inJ[v] = (bits[J, v >> 6] >> np.uint64(v & 63)) & np.uint64(1) == np.uint64(1)
                if inJ[v]:
                    workJ -= work_item[v]
            if summed and not bestJ + workJ < SB * stol:
                # every stage costs at least its work: no split through J beats SB
                J = nxt[J]
                continue
            ncand = 0
            for v in range(B):
                if inJ[v]:
                    continue
                m = 0
                for e in range(pptr[v], pptr[v + 1]):
                    if not inJ[pidx[e]]:
                        m += 1
                missing[v] = m
                if m == 0:
                    cand[ncand] = v
                    ncand += 1
            # most work the devices left after any stage from J can absorb, per unit of bound
            amax = 0.0
            for k in range(NK):
                if (not dp[J, k] + workJ < SB * stol) if summed else (dp[J, k] > UB * tol):
                    continue
                for c in range(K):
                    if kc[k, c] < counts[c] and absorb[k, c] > amax:
                        amax = absorb[k, c]
            dtop = 0
            deadwork = 0.0
            f_dmark[0] = 0
            f_lmark[0] = 0
            f_lsum[0] = 0.0
            lbsum = 0.0
            ltop = 0
            f_dwork[0] = 0.0
            hJ = ihash[J]
            hS = 0
            sizeS = 0
            utop = 0
            depth = 0
            f_cs[0] = 0
            f_cl[0] = ncand
            f_cp[0] = 0
            for c in range(K):
                f_comp[0, c] = 0.0
            f_mem[0] = 0.0
            f_act[0] = 0.0
            f_comm[0] = 0.0
            f_work[0] = 0.0
            ctop = ncand
            while True:
                if f_cp[depth] >= f_cl[depth]:
                    # ---- pop: undo the item that opened this frame
                    while dtop > f_dmark[depth]:
                        dtop -= 1
                        dead[d_stack[dtop]] = False
                    deadwork = f_dwork[depth]
                    while ltop > f_lmark[depth]:
                        ltop -= 1
                        lb[l_kind[ltop], l_node[ltop]] = l_val[ltop]
                    lbsum = f_lsum[depth]
                    if depth == 0:
                        break
                    v = f_item[depth]
                    while utop > f_umark[depth]:
                        utop -= 1
                        if u_kind[utop] == 0:
                            outc[u_node[utop]] = u_val[utop]
                            outn[u_node[utop]] = u_cnt[utop]
                        else:
                            inc[u_node[utop]] = u_val[utop]
                    inS[v] = False
                    bitsS[v >> 6] ^= np.uint64(1) << np.uint64(v & 63)
                    hS ^= keys[v]
                    sizeS -= 1
                    for e in range(sptr[v], sptr[v + 1]):
                        missing[sidx[e]] += 1
                    ctop = f_cs[depth]
                    depth -= 1
                    continue
                if f_cp[depth] > 0:
                    # ---- the previous candidate is skipped from here on: it and everything
                    # after it stay outside S, so the work left after S is at least deadwork
                    thr = UB * amax * (1.0 + 1e-9) + 1e-9 * UB
                    x0 = cand[f_cs[depth] + f_cp[depth] - 1]
                    if not dead[x0]:
                        dead[x0] = True
                        d_stack[dtop] = x0
                        dtop += 1
                        deadwork += work_item[x0]
                        lbsum, ltop = _charge(
                            x0, 1, inS, inS, inptr, inidx, optr, oidx, ocost, iptr, iidx, icost,
                            node_item, lb, l_node, l_kind, l_val, lbsum, ltop,
                        )  # fmt: skip
                        tt = 1
                        t_stack[0] = x0
                        while tt > 0 and deadwork <= thr:
                            tt -= 1
                            x = t_stack[tt]
                            for e in range(sptr[x], sptr[x + 1]):
                                y2 = sidx[e]
                                if not dead[y2]:
                                    dead[y2] = True
                                    d_stack[dtop] = y2
                                    dtop += 1
                                    deadwork += work_item[y2]
                                    lbsum, ltop = _charge(
                                        y2, 1, inS, inS, inptr, inidx, optr, oidx, ocost, iptr,
                                        iidx, icost, node_item, lb, l_node, l_kind, l_val, lbsum,
                                        ltop,
                                    )  # fmt: skip
                                    t_stack[tt] = y2
                                    tt += 1
                    if deadwork > thr:
                        # no stage of this branch leaves little enough work: cut the siblings
                        f_cp[depth] = f_cl[depth]
                        continue
                    if depth > 0 and lbcut:
                        # no class can take S with the transfers no extension avoids
                        cut = True
                        for c in range(K):
                            if (
                                f_mem[depth] <= cap[c]
                                and f_comp[depth, c] + (lbsum if pays[c] else 0.0) <= ub_cut
                            ):
                                cut = False
                                break
                        if cut:
                            f_cp[depth] = f_cl[depth]
                            continue
                v = cand[f_cs[depth] + f_cp[depth]]
                f_cp[depth] += 1
                visited += 1
                if (visited & 0xFFFF) == 0:
                    with numba.objmode(now="float64"):
                        now = _perf_counter()
                    if now > deadline:
                        status = STATUS_TIME
                        break
                # ---- memory and compute of S + v; cut if no class can take it
                memv = f_mem[depth] + mem_item[v]
                actv = f_act[depth] + act_item[v] if posmem else 0.0
                anyok = False
                for c in range(K):
                    comp = f_comp[depth, c] + comp_item[v, c]
                    costc[c] = comp
                    okc[c] = memv <= cap[c] and np.isfinite(comp) and comp <= UB * tol
                    if okc[c]:
                        anyok = True
                if not anyok:
                    continue
                # ---- add v
                mark = utop
                lmark = ltop
                lsum0 = lbsum
                inS[v] = True
                bitsS[v >> 6] ^= np.uint64(1) << np.uint64(v & 63)
                hS ^= keys[v]
                sizeS += 1
                comm = f_comm[depth]
                for q in range(inptr[v], inptr[v + 1]):
                    y = inidx[q]
                    if inc[y] != 0.0:
                        comm -= inc[y]
                        u_node[utop] = y
                        u_kind[utop] = 1
                        u_val[utop] = inc[y]
                        utop += 1
                        inc[y] = 0.0
                for q in range(inptr[v], inptr[v + 1]):
                    y = inidx[q]
                    o, oc = _recompute_out(y, optr, oidx, ocost, node_item, inS)
                    u_node[utop] = y
                    u_kind[utop] = 0
                    u_val[utop] = outc[y]
                    u_cnt[utop] = outn[y]
                    utop += 1
                    comm += o - outc[y]
                    outc[y] = o
                    outn[y] = oc
                    for e in range(iptr[y], iptr[y + 1]):
                        x = iidx[e]
                        if inS[node_item[x]]:
                            # y was one of x's outside consumers; recompute only if it was the last at the max
                            if icost[e] != outc[x] or fresh[x] == visited:
                                continue
                            u_node[utop] = x
                            u_kind[utop] = 0
                            u_val[utop] = outc[x]
                            u_cnt[utop] = outn[x]
                            utop += 1
                            if outn[x] > 1:
                                outn[x] -= 1
                            else:
                                o2, oc2 = _recompute_out(x, optr, oidx, ocost, node_item, inS)
                                fresh[x] = visited
                                comm += o2 - outc[x]
                                outc[x] = o2
                                outn[x] = oc2
                        elif icost[e] > inc[x]:
                            u_node[utop] = x
                            u_kind[utop] = 1
                            u_val[utop] = inc[x]
                            utop += 1
                            comm += icost[e] - inc[x]
                            inc[x] = icost[e]
                # ---- transfers of S with J and the dead items: no extension avoids them
                pruned = False
                if lbcut:
                    lbsum, ltop = _charge(
                        v, 0, inJ, dead, inptr, inidx, optr, oidx, ocost, iptr, iidx, icost,
                        node_item, lb, l_node, l_kind, l_val, lbsum, ltop,
                    )  # fmt: skip
                    pruned = True
                    for c in range(K):
                        if okc[c] and costc[c] + (lbsum if pays[c] else 0.0) <= ub_cut:
                            pruned = False
                            break
                # ---- relax dp[J] -> dp[J + S]; the work left must fit the devices left
                workS = f_work[depth] + work_item[v]
                rest = workJ - workS
                Iidx = -1
                for c in range(K):
                    if not okc[c] or pruned:
                        continue
                    cost = costc[c] + (comm if pays[c] else 0.0)
                    if cost > UB * tol:
                        continue
                    for k in range(NK):
                        if kc[k, c] >= counts[c]:
                            continue
                        if posmem and memv + actv * act_extra[npos[k]] > cap[c]:
                            continue
                        if summed:
                            val = dp[J, k] + cost
                            if not val + rest < SB * stol:
                                continue
                        else:
                            val = dp[J, k] if dp[J, k] > cost else cost
                            if val > UB * tol:
                                continue
                        if rest > UB * absorb[k, c] * (1.0 + 1e-9) + 1e-9 * UB:
                            continue
                        if Iidx < 0:
                            h = hJ ^ hS
                            if h in table:
                                Iidx = table[h]
                                for w in range(W):
                                    if bits[Iidx, w] != (bits[J, w] | bitsS[w]):
                                        status = STATUS_COLLISION
                            else:
                                if nI >= max_ideals:
                                    status = STATUS_IDEALS
                                    break
                                Iidx = nI
                                nI += 1
                                table[h] = Iidx
                                for w in range(W):
                                    bits[Iidx, w] = bits[J, w] | bitsS[w]
                                sz = s + sizeS
                                isize[Iidx] = sz
                                ihash[Iidx] = h
                                if head[sz] < 0:
                                    head[sz] = Iidx
                                else:
                                    nxt[tail[sz]] = Iidx
                                tail[sz] = Iidx
                            if status != STATUS_DONE:
                                break
                        k2 = k + stride[c]
                        if val < dp[Iidx, k2]:
                            dp[Iidx, k2] = val
                            bJ[Iidx, k2] = J
                            bC[Iidx, k2] = c
                            if s + sizeS == B:
                                if summed:
                                    SB = val  # val < SB * stol was checked above
                                elif val < UB:
                                    UB = val
                                    ub_cut = UB * tol + 1e-10 * UB
                    if status != STATUS_DONE:
                        break
                if status != STATUS_DONE:
                    break
                # ---- push a frame: candidates = parent's after v, then freed successors
                depth += 1
                f_item[depth] = v
                f_umark[depth] = mark
                f_lmark[depth] = lmark
                f_lsum[depth] = lsum0
                f_dmark[depth] = dtop
                f_dwork[depth] = deadwork
                for c in range(K):
                    f_comp[depth, c] = costc[c]
                f_mem[depth] = memv
                f_act[depth] = actv
                f_comm[depth] = comm
                f_work[depth] = workS
                start = ctop
                pc = depth - 1
                if ctop + f_cl[pc] + (sptr[v + 1] - sptr[v]) > cand_cap:
                    status = STATUS_STACK
                    break
                # candidates stay sorted, so the ones before v in a frame are exactly the
                # skipped items below v: the parent's after v, merged with the freed successors
                nfr = 0
                for e in range(sptr[v], sptr[v + 1]):
                    w = sidx[e]
                    missing[w] -= 1
                    if missing[w] == 0 and not inJ[w]:
                        t = nfr
                        while t > 0 and fr[t - 1] > w:
                            fr[t] = fr[t - 1]
                            t -= 1
                        fr[t] = w
                        nfr += 1
                i0 = f_cs[pc] + f_cp[pc]
                i1 = f_cs[pc] + f_cl[pc]
                j0 = 0
                if pruned:  # no extension of S fits UB: the frame only undoes v
                    i0, nfr = i1, 0
                while i0 < i1 or j0 < nfr:
                    if j0 >= nfr or (i0 < i1 and cand[i0] < fr[j0]):
                        cand[ctop] = cand[i0]
                        i0 += 1
                    else:
                        cand[ctop] = fr[j0]
                        j0 += 1
                    ctop += 1
                f_cs[depth] = start
                f_cl[depth] = ctop - start
                f_cp[depth] = 0
            # ---- leave J clean (after an abort the arrays are discarded anyway)
            if status != STATUS_DONE:
                break
            J = nxt[J]
        if status != STATUS_DONE:
            break
    full = table[full_hash] if full_hash in table else -1
    return (
        status,
        nI,
        dp[:nI].copy(),
        bJ[:nI].copy(),
        bC[:nI].copy(),
        bits[:nI].copy(),
        full,
        visited,
    )


def _perf_counter() -> float:
    import time

    return time.perf_counter()
