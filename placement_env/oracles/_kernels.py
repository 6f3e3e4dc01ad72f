"""Numba kernels of the Simulator: the discrete-event makespan loop and the max-load sum."""

from __future__ import annotations

import numpy as np
from numba import njit

# Event types, packed as ``id * 3 + type`` in the event heap payload.
_TASK_DONE, _HOP_DONE, _DELIVER = 0, 1, 2


# ----------------------------------------------------------------- heaps
@njit(cache=True, inline="always")
def _fheap_push(keys, vals, size, key, val):
    """Push (float key, int val) on a min-heap stored in keys[:size]; returns the new size."""
    k = size
    keys[k] = key
    vals[k] = val
    while k > 0:
        parent = (k - 1) >> 1
        if keys[parent] <= keys[k]:
            break
        keys[parent], keys[k] = keys[k], keys[parent]
        vals[parent], vals[k] = vals[k], vals[parent]
        k = parent
    return size + 1


@njit(cache=True, inline="always")
def _fheap_pop(keys, vals, size):
    """Remove the minimum of keys[:size] (caller reads it first); returns the new size."""
    size -= 1
    keys[0] = keys[size]
    vals[0] = vals[size]
    k = 0
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and keys[c + 1] < keys[c]:
            c += 1
        if keys[k] <= keys[c]:
            break
        keys[c], keys[k] = keys[k], keys[c]
        vals[c], vals[k] = vals[k], vals[c]
        k = c
    return size


@njit(cache=True, inline="always")
def _iheap_push(keys, vals, off, size, key, val):
    """Push on the int-keyed min-heap living in keys[off:off+size]; returns the new size."""
    k = size
    keys[off + k] = key
    vals[off + k] = val
    while k > 0:
        parent = (k - 1) >> 1
        if keys[off + parent] <= keys[off + k]:
            break
        keys[off + parent], keys[off + k] = keys[off + k], keys[off + parent]
        vals[off + parent], vals[off + k] = vals[off + k], vals[off + parent]
        k = parent
    return size + 1


@njit(cache=True, inline="always")
def _iheap_pop(keys, vals, off, size):
    size -= 1
    keys[off] = keys[off + size]
    vals[off] = vals[off + size]
    k = 0
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and keys[off + c + 1] < keys[off + c]:
            c += 1
        if keys[off + k] <= keys[off + c]:
            break
        keys[off + c], keys[off + k] = keys[off + k], keys[off + c]
        vals[off + c], vals[off + k] = vals[off + k], vals[off + c]
        k = c
    return size


@njit(cache=True, inline="always")
def _notify(i, m, dev, p, sptr, sidx, base, permb, pending, gated, pkey, rkeys, rvals, hoff, hsz):
    """Count down the runs on ``dev`` waiting for run ``m`` of node ``i``; True if one became ready."""
    pushed = False
    for e in range(sptr[i], sptr[i + 1]):
        j = sidx[e]
        if p[j] != dev:
            continue
        for tj in range(base[j], base[j + 1]):
            if permb[i] and permb[j] and tj - base[j] != m:
                continue
            pending[tj] -= 1
            if pending[tj] == 0:
                h = 2 * dev + (1 if gated[tj] else 0)
                hsz[h] = _iheap_push(rkeys, rvals, hoff[h], hsz[h], pkey[tj], tj)
                pushed = True
    return pushed


# ------------------------------------------------------- 1F1B cap
@njit(cache=True)
def inflight_cap(p, M, D, kind, topo, sptr, sidx):
    """Per-device 1F1B cap: 1 + most device changes on a forward path from a forward node there, <= M."""
    n = p.shape[0]
    chg = np.zeros(n, np.int64)
    K = np.zeros(D, np.int64)
    for r in range(n - 1, -1, -1):
        i = topo[r]
        if kind[i] != 0:
            continue
        best = 0
        for e in range(sptr[i], sptr[i + 1]):
            j = sidx[e]
            if kind[j] == 0:
                c = chg[j] + (1 if p[j] != p[i] else 0)
                if c > best:
                    best = c
        chg[i] = best
        if best + 1 > K[p[i]]:
            K[p[i]] = best + 1
    for d in range(D):
        if K[d] == 0 or K[d] > M:
            K[d] = M
    return K


# ------------------------------------------------------- makespan kernel
@njit(cache=True, error_model="numpy")
def simulate_makespan(
    p,  # int64[n] placement
    M,  # microbatches
    sched,  # 0 gpipe, 1 1f1b
    kind,  # int8[n]
    permb,  # bool[n]: runs once per microbatch (fwd/bwd) vs once per step (opt)
    topo,  # int64[n] topological order
    topo_pos,  # int64[n] position in topo
    dur,  # float64[n, D] seconds per instance
    sptr,  # int64[n+1] CSR of distinct successors
    sidx,  # int64[s]
    sbytes,  # float64[s] bytes per instance (max over parallel edges)
    stime,  # float64[s] explicit transfer seconds per instance (NaN = link model)
    pend0,  # int64[n] notifications each instance of a node waits for
    rptr,  # int64[D*D+1] route CSR, index a*D+b
    rlink,  # int64[r]
    lat,  # float64[L]
    bw,  # float64[L]
    record,  # bool: also return every hop interval
):
    n = p.shape[0]
    D = dur.shape[1]
    L = lat.shape[0]

    # ---- task instances
    cnt = np.empty(n, np.int64)
    base = np.empty(n + 1, np.int64)
    base[0] = 0
    for i in range(n):
        cnt[i] = M if permb[i] else 1
        base[i + 1] = base[i] + cnt[i]
    T = base[n]
    inst_node = np.empty(T, np.int64)
    for i in range(n):
        for k in range(base[i], base[i + 1]):
            inst_node[k] = i

    # ---- remote groups: one transfer per (producer instance, destination device)
    ns = sidx.shape[0]
    gptr = np.zeros(n + 1, np.int64)
    gdev = np.empty(ns, np.int64)
    gbytes = np.empty(ns, np.float64)
    gtime = np.empty(ns, np.float64)
    mark = np.full(D, -1, np.int64)
    gc = 0
    X = 0
    H = 0
    for i in range(n):
        a = p[i]
        start = gc
        for e in range(sptr[i], sptr[i + 1]):
            b = p[sidx[e]]
            if b == a:
                continue
            g = mark[b]
            if g < start:
                g = gc
                mark[b] = g
                gdev[g] = b
                gbytes[g] = sbytes[e]
                gtime[g] = stime[e]
                gc += 1
            else:
                if sbytes[e] > gbytes[g]:
                    gbytes[g] = sbytes[e]
                if not np.isnan(stime[e]):
                    if np.isnan(gtime[g]) or stime[e] > gtime[g]:
                        gtime[g] = stime[e]
        gptr[i + 1] = gc
        X += cnt[i] * (gc - start)
        if record:
            for g in range(start, gc):
                if np.isnan(gtime[g]):
                    H += cnt[i] * (rptr[a * D + gdev[g] + 1] - rptr[a * D + gdev[g]])

    # ---- per-device bookkeeping
    tcount = np.zeros(D, np.int64)
    nmb = np.zeros(D, np.int64)  # per-microbatch nodes on each device
    fwd_left = np.zeros(D, np.int64)
    for i in range(n):
        d = p[i]
        tcount[d] += cnt[i]
        if permb[i]:
            nmb[d] += 1
            if kind[i] == 0:
                fwd_left[d] += M
    hoff = np.empty(2 * D, np.int64)
    hsz = np.zeros(2 * D, np.int64)
    acc = 0
    for d in range(D):
        hoff[2 * d] = acc
        hoff[2 * d + 1] = acc + tcount[d]
        acc += 2 * tcount[d]
    rkeys = np.empty(max(acc, 1), np.int64)
    rvals = np.empty(max(acc, 1), np.int64)

    rem = np.empty(D * M, np.int64)
    started = np.zeros(D * M, np.bool_)
    cpre = np.zeros(D, np.int64)
    for d in range(D):
        for m in range(M):
            rem[d * M + m] = nmb[d]
        if nmb[d] == 0:
            cpre[d] = M
    infl = np.zeros(D, np.int64)
    peak = np.zeros(D, np.int64)

    K = inflight_cap(p, M, D, kind, topo, sptr, sidx)

    # ---- priority keys
    nM = n * M
    pkey = np.empty(T, np.int64)
    gated = np.zeros(T, np.bool_)
    for i in range(n):
        k = kind[i]
        if k == 2:
            cls = 2
        elif sched == 0:
            cls = k
        else:
            cls = 1 - k
        for t in range(base[i], base[i + 1]):
            m = t - base[i]
            pkey[t] = cls * nM + m * n + topo_pos[i]
            gated[t] = (sched == 0 and k == 1) or (sched == 1 and k == 0)

    pending = np.empty(T, np.int64)
    for i in range(n):
        for t in range(base[i], base[i + 1]):
            pending[t] = pend0[i]

    # ---- transfers
    x_inst = np.empty(max(X, 1), np.int64)
    x_dev = np.empty(max(X, 1), np.int64)
    x_bytes = np.empty(max(X, 1), np.float64)
    x_hop = np.zeros(max(X, 1), np.int64)
    x_next = np.full(max(X, 1), -1, np.int64)
    nx = 0
    qhead = np.full(L, -1, np.int64)
    qtail = np.full(L, -1, np.int64)
    link_busy = np.zeros(L, np.bool_)
    link_bytes = np.zeros(L, np.float64)
    # arrivals of the current round: (link, key, transfer)
    arr_l = np.empty(max(X, 1), np.int64)
    arr_k = np.empty(max(X, 1), np.int64)
    arr_x = np.empty(max(X, 1), np.int64)

    rec_x = np.empty(H, np.int64)
    rec_l = np.empty(H, np.int64)
    rec_s = np.empty(H, np.float64)
    rec_e = np.empty(H, np.float64)
    nrec = 0

    # ---- events
    ecap = T + X + 1
    ekeys = np.empty(ecap, np.float64)
    evals = np.empty(ecap, np.int64)
    esz = 0

    dev_busy = np.zeros(D, np.bool_)
    busy = np.zeros(D, np.float64)
    tstart = np.full(T, np.nan)
    done = 0
    makespan = 0.0

    # sources
    for t in range(T):
        if pending[t] == 0:
            i = inst_node[t]
            h = 2 * p[i] + (1 if gated[t] else 0)
            hsz[h] = _iheap_push(rkeys, rvals, hoff[h], hsz[h], pkey[t], t)

    # resources whose state changed since they were last dispatched
    dd_list = np.arange(D)
    dd_flag = np.ones(D, np.bool_)
    ndd = D
    ld_list = np.empty(max(L, 1), np.int64)
    ld_flag = np.zeros(max(L, 1), np.bool_)
    nld = 0

    now = 0.0
    lift = False
    while True:
        # ---- dispatch idle links (FIFO)
        for u in range(nld):
            lk = ld_list[u]
            ld_flag[lk] = False
            if not link_busy[lk] and qhead[lk] >= 0:
                x = qhead[lk]
                qhead[lk] = x_next[x]
                if qhead[lk] < 0:
                    qtail[lk] = -1
                cost = lat[lk] + x_bytes[x] / bw[lk]
                link_busy[lk] = True
                link_bytes[lk] += x_bytes[x]
                esz = _fheap_push(ekeys, evals, esz, now + cost, x * 3 + _HOP_DONE)
                if record:
                    rec_x[nrec] = x
                    rec_l[nrec] = lk
                    rec_s[nrec] = now
                    rec_e[nrec] = now + cost
                    nrec += 1
        nld = 0
        # ---- dispatch idle devices (priority order, schedule gates)
        for u in range(ndd):
            d = dd_list[u]
            dd_flag[d] = False
            if dev_busy[d]:
                continue
            hA = 2 * d
            hB = hA + 1
            best = -1
            bh = -1
            if hsz[hA] > 0:
                best = rvals[hoff[hA]]
                bh = hA
            if hsz[hB] > 0:
                tb = rvals[hoff[hB]]
                ok = lift
                if not ok:
                    if sched == 0:
                        ok = fwd_left[d] == 0
                    else:
                        ok = (tb - base[inst_node[tb]]) < cpre[d] + K[d]
                if ok and (best < 0 or rkeys[hoff[hB]] < rkeys[hoff[hA]]):
                    best = tb
                    bh = hB
            if best < 0:
                continue
            hsz[bh] = _iheap_pop(rkeys, rvals, hoff[bh], hsz[bh])
            i = inst_node[best]
            dd = dur[i, d]
            tstart[best] = now
            busy[d] += dd
            dev_busy[d] = True
            esz = _fheap_push(ekeys, evals, esz, now + dd, best * 3 + _TASK_DONE)
            if permb[i]:
                m = best - base[i]
                if not started[d * M + m]:
                    started[d * M + m] = True
                    infl[d] += 1
                    if infl[d] > peak[d]:
                        peak[d] = infl[d]
        ndd = 0
        lift = False
        if esz == 0:
            if done == T:
                break
            # the schedule's gates stall every resource: lift them for one round
            lift = True
            for d in range(D):
                dd_list[d] = d
                dd_flag[d] = True
            ndd = D
            anyready = False
            for h in range(2 * D):
                if hsz[h] > 0:
                    anyready = True
            if not anyready:
                return (
                    -1.0,
                    busy,
                    peak,
                    link_bytes,
                    tstart,
                    rec_x,
                    rec_l,
                    rec_s,
                    rec_e,
                    x_inst,
                    x_dev,
                )
            continue

        # ---- process every event at the earliest time
        now = ekeys[0]
        na = 0
        while esz > 0 and ekeys[0] == now:
            v = evals[0]
            esz = _fheap_pop(ekeys, evals, esz)
            typ = v % 3
            ident = v // 3
            if typ == _TASK_DONE:
                t = ident
                i = inst_node[t]
                a = p[i]
                dev_busy[a] = False
                if not dd_flag[a]:
                    dd_flag[a] = True
                    dd_list[ndd] = a
                    ndd += 1
                done += 1
                if now > makespan:
                    makespan = now
                m = -1
                if permb[i]:
                    m = t - base[i]
                    rem[a * M + m] -= 1
                    if rem[a * M + m] == 0:
                        infl[a] -= 1
                        while cpre[a] < M and rem[a * M + cpre[a]] == 0:
                            cpre[a] += 1
                    if kind[i] == 0:
                        fwd_left[a] -= 1
                # local consumers (device a is already marked: it just finished a task)
                _notify(
                    i,
                    m,
                    a,
                    p,
                    sptr,
                    sidx,
                    base,
                    permb,
                    pending,
                    gated,
                    pkey,
                    rkeys,
                    rvals,
                    hoff,
                    hsz,
                )
                # remote consumers: one transfer per destination device
                for g in range(gptr[i], gptr[i + 1]):
                    x = nx
                    nx += 1
                    x_inst[x] = t
                    x_dev[x] = gdev[g]
                    x_bytes[x] = gbytes[g]
                    if not np.isnan(gtime[g]):
                        esz = _fheap_push(ekeys, evals, esz, now + gtime[g], x * 3 + _DELIVER)
                    else:
                        arr_l[na] = rlink[rptr[a * D + gdev[g]]]
                        arr_k[na] = t * D + gdev[g]
                        arr_x[na] = x
                        na += 1
            else:
                x = ident
                t = x_inst[x]
                i = inst_node[t]
                a = p[i]
                b = x_dev[x]
                deliver = typ == _DELIVER
                if not deliver:
                    r0 = rptr[a * D + b]
                    lk = rlink[r0 + x_hop[x]]
                    link_busy[lk] = False
                    if not ld_flag[lk]:
                        ld_flag[lk] = True
                        ld_list[nld] = lk
                        nld += 1
                    x_hop[x] += 1
                    if r0 + x_hop[x] < rptr[a * D + b + 1]:
                        arr_l[na] = rlink[r0 + x_hop[x]]
                        arr_k[na] = t * D + b
                        arr_x[na] = x
                        na += 1
                    else:
                        deliver = True
                if deliver:
                    m = t - base[i] if permb[i] else -1
                    pushed = _notify(
                        i, m, b, p, sptr, sidx, base, permb, pending, gated, pkey, rkeys, rvals,
                        hoff, hsz,
                    )  # fmt: skip
                    if pushed and not dd_flag[b]:
                        dd_flag[b] = True
                        dd_list[ndd] = b
                        ndd += 1
        # ---- this round's link arrivals join their FIFO queues in (link, key) order
        for u in range(1, na):  # insertion sort: rounds are small
            lk, kk, xx = arr_l[u], arr_k[u], arr_x[u]
            w = u - 1
            while w >= 0 and (arr_l[w] > lk or (arr_l[w] == lk and arr_k[w] > kk)):
                arr_l[w + 1] = arr_l[w]
                arr_k[w + 1] = arr_k[w]
                arr_x[w + 1] = arr_x[w]
                w -= 1
            arr_l[w + 1] = lk
            arr_k[w + 1] = kk
            arr_x[w + 1] = xx
        for u in range(na):
            lk = arr_l[u]
            x = arr_x[u]
            x_next[x] = -1
            if qtail[lk] < 0:
                qhead[lk] = x
            else:
                x_next[qtail[lk]] = x
            qtail[lk] = x
            if not ld_flag[lk]:
                ld_flag[lk] = True
                ld_list[nld] = lk
                nld += 1

    return makespan, busy, peak, link_bytes, tstart, rec_x, rec_l, rec_s, rec_e, x_inst, x_dev


# ------------------------------------------------------- max-load kernel
@njit(cache=True)
def max_load_kernel(
    p,  # int64[n]
    comp_us,  # float64[n, D] compute microseconds of each node on each device
    sptr,  # int64[n+1] CSR of distinct successors
    sidx,  # int64[s]
    sexpl_us,  # float64[s] explicit transfer microseconds (NaN = link model)
    sbytes,  # float64[s] bytes of the edge (whole batch)
    rptr,  # int64[D*D+1] route CSR
    rlink,  # int64[r]
    lat,  # float64[L]
    bw,  # float64[L]
    nocomm,  # bool[D]: device pays no transfer cost (kind "cpu")
):
    """Per-device compute and communication load (microseconds) and link bytes."""
    n = p.shape[0]
    D = comp_us.shape[1]
    L = lat.shape[0]
    compute = np.zeros(D, np.float64)
    comm = np.zeros(D, np.float64)
    link_bytes = np.zeros(L, np.float64)
    gexp = np.zeros(D, np.float64)
    gbytes = np.zeros(D, np.float64)
    seen = np.zeros(D, np.bool_)
    for i in range(n):
        a = p[i]
        compute[a] += comp_us[i, a]
        nb = 0
        for e in range(sptr[i], sptr[i + 1]):
            b = p[sidx[e]]
            if b == a:
                continue
            if not seen[b]:
                seen[b] = True
                gexp[b] = sexpl_us[e]
                gbytes[b] = sbytes[e]
                nb += 1
            else:
                if sbytes[e] > gbytes[b]:
                    gbytes[b] = sbytes[e]
                if not np.isnan(sexpl_us[e]):
                    if np.isnan(gexp[b]) or sexpl_us[e] > gexp[b]:
                        gexp[b] = sexpl_us[e]
        if nb == 0:
            continue
        own = 0.0
        for b in range(D):
            if not seen[b]:
                continue
            seen[b] = False
            if np.isnan(gexp[b]):
                c = 0.0
                for r in range(rptr[a * D + b], rptr[a * D + b + 1]):
                    lk = rlink[r]
                    c += lat[lk] + gbytes[b] / bw[lk]
                    link_bytes[lk] += gbytes[b]
                c *= 1e6
            else:
                c = gexp[b]
            if c > own:
                own = c
            if not nocomm[b]:
                comm[b] += c
        if not nocomm[a]:
            comm[a] += own
    return compute, comm, link_bytes
