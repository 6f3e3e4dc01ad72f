"""Numba kernels of the Simulator: the discrete-event makespan loop and the max-load sum."""

from __future__ import annotations

import numpy as np
from numba import njit

# Event types, packed as ``id * 4 + type`` in the event heap payload.
_TASK_DONE, _HOP_DONE, _DELIVER = 0, 1, 2

# The hot loop calls no helper functions: numba increments and decrements the
# (atomic) reference count of every array handed to a called or inlined function,
# which on the heap operations of this loop cost a quarter of the run time. Each
# heap therefore has exactly one push site and one pop site, written out in place.


@njit(cache=True)
def prepare_tasks(M, sched, kind, permb, topo_pos, pend0):
    """Placement-independent run tables of the makespan kernel.

    Node ``i`` has runs ``base[i] .. base[i+1]-1`` (``M`` for per-microbatch nodes,
    else one; run ``base[i]+m`` is microbatch ``m``); ``inst_node`` maps a run to its
    node; ``pkey`` is the run's schedule priority (smaller runs first); ``gated``
    marks the runs the schedule may hold back (gpipe backwards, 1f1b forwards);
    ``pend`` is the number of notifications a run waits for. ``sched`` 2
    (``in_order``) orders runs per placement inside the kernel: ``pkey`` is then the
    gpipe key and nothing is gated.
    """
    n = kind.shape[0]
    base = np.empty(n + 1, np.int64)
    base[0] = 0
    for i in range(n):
        base[i + 1] = base[i] + (M if permb[i] else 1)
    T = base[n]
    inst_node = np.empty(T, np.int64)
    pkey = np.empty(T, np.int64)
    gated = np.zeros(T, np.bool_)
    pend = np.empty(T, np.int64)
    nM = n * M
    for i in range(n):
        k = np.int64(kind[i])
        if k == 2:
            cls = 2
        elif sched == 0 or sched == 2:
            cls = k
        else:
            cls = 1 - k
        gate = (sched == 0 and k == 1) or (sched == 1 and k == 0)
        for t in range(base[i], base[i + 1]):
            inst_node[t] = i
            pkey[t] = cls * nM + (t - base[i]) * n + topo_pos[i]
            gated[t] = gate
            pend[t] = pend0[i]
    return base, inst_node, pkey, gated, pend


@njit(cache=True)
def placement_sums(p, D, param_bytes, act_bytes, transient):
    """Per device: summed param bytes and act bytes (in node order, as ``np.bincount``) and
    the largest transient (at least 0)."""
    params = np.zeros(D, np.float64)
    act = np.zeros(D, np.float64)
    trans = np.zeros(D, np.float64)
    for i in range(p.shape[0]):
        d = p[i]
        params[d] += param_bytes[i]
        act[d] += act_bytes[i]
        if transient[i] > trans[d]:
            trans[d] = transient[i]
    return params, act, trans


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


# ------------------------------------------------------- in_order (op-level runtime) order
@njit(cache=True)
def in_order_ranks(p, M, D, kind, permb, base, inst_node, topo, topo_pos, sptr, sidx, fwd_of):
    """Static per-device run order of ``runtime.oplevel.OpLevelRunner`` for placement ``p``.

    Forward runs by key ``(m, depth, topo position)`` with ``depth`` the cross-device
    depth (most device changes on a forward path reaching the node), then backward
    runs by ``(M-1-m, maxdepth - depth of their forward node, topo position)``, then
    optimizer runs by topo position. Returns ``rank`` (position of each run in its
    device's order), ``dorder`` (runs of device ``d`` in order at
    ``doff[d]..doff[d+1]-1``), ``doff`` and ``pfirst`` (the first run of each run's
    partition: consecutive runs of a device with the same class, microbatch and depth).
    """
    n = p.shape[0]
    T = base[n]
    depth = np.zeros(n, np.int64)
    maxd = 0
    for r in range(n):
        i = topo[r]
        if kind[i] != 0:
            continue
        if depth[i] > maxd:
            maxd = depth[i]
        for e in range(sptr[i], sptr[i + 1]):
            j = sidx[e]
            if kind[j] == 0:
                c = depth[i] + (1 if p[j] != p[i] else 0)
                if c > depth[j]:
                    depth[j] = c
    nd = maxd + 1
    pkey = np.empty(T, np.int64)  # partition key (class, microbatch, depth) of each run
    okey = np.empty(T, np.int64)
    for t in range(T):
        i = inst_node[t]
        k = np.int64(kind[i])
        if k == 0:
            part = (t - base[i]) * nd + depth[i]
        elif k == 1:
            f = fwd_of[i]
            dp = maxd - (depth[f] if f >= 0 else 0)
            part = (M + M - 1 - (t - base[i])) * nd + dp
        else:
            part = 2 * M * nd
        pkey[t] = part
        okey[t] = part * n + topo_pos[i]
    order = np.argsort(okey)
    doff = np.zeros(D + 1, np.int64)
    for t in range(T):
        doff[p[inst_node[t]] + 1] += 1
    for d in range(D):
        doff[d + 1] += doff[d]
    cnt = np.zeros(D, np.int64)
    rank = np.empty(T, np.int64)
    dorder = np.empty(T, np.int64)
    pfirst = np.empty(T, np.int64)
    for q in range(T):
        t = order[q]
        d = p[inst_node[t]]
        r = cnt[d]
        cnt[d] = r + 1
        rank[t] = r
        dorder[doff[d] + r] = t
        if r > 0 and pkey[dorder[doff[d] + r - 1]] == pkey[t]:
            pfirst[t] = pfirst[dorder[doff[d] + r - 1]]
        else:
            pfirst[t] = t
    return rank, dorder, doff, pfirst


# ------------------------------------------------------- makespan kernel
@njit(cache=True, error_model="numpy")
def simulate_makespan(
    p,  # int64[n] placement
    M,  # microbatches
    sched,  # 0 gpipe, 1 1f1b, 2 in_order
    kind,  # int8[n]
    permb,  # bool[n]: runs once per microbatch (fwd/bwd) vs once per step (opt)
    topo,  # int64[n] topological order
    dur,  # float64[n, D] seconds per run
    sptr,  # int64[n+1] CSR of distinct successors
    sidx,  # int64[s]
    sbytes,  # float64[s] bytes per run (max over parallel edges)
    stime,  # float64[s] explicit transfer seconds per run (NaN = link model)
    base,  # int64[n+1] first run of each node (prepare_tasks)
    inst_node,  # int64[T] node of each run
    pkey,  # int64[T] schedule priority of each run (smaller first)
    gated,  # bool[T] runs the schedule may hold back
    pend,  # int64[T] notifications each run waits for
    rptr,  # int64[D*D+1] route CSR, index a*D+b
    rlink,  # int64[r]
    lat,  # float64[L]
    bw,  # float64[L]
    ovh_send,  # float64[D] endpoint cost per transfer sent (seconds of compute stream)
    ovh_recv,  # float64[D] endpoint cost per transfer received
    fwd_of,  # int64[n] forward node whose partition a node joins (in_order; -1 none)
    topo_pos,  # int64[n] position of each node in topo
    record,  # bool: also return every run's start and duration and every hop interval
):
    n = p.shape[0]
    D = dur.shape[1]
    L = lat.shape[0]
    T = base[n]

    # ---- remote groups: one transfer per (producer run, destination device)
    ns = sidx.shape[0]
    gptr = np.zeros(n + 1, np.int64)
    gdev = np.empty(ns, np.int64)
    gbytes = np.empty(ns, np.float64)
    gtime = np.empty(ns, np.float64)
    gh = np.zeros(ns + 1, np.int64)  # CSR of each group's hops (none for explicit times)
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
        runs = base[i + 1] - base[i]
        X += runs * (gc - start)
        for g in range(start, gc):
            if np.isnan(gtime[g]):
                nh = rptr[a * D + gdev[g] + 1] - rptr[a * D + gdev[g]]
                gh[g + 1] = nh
                H += runs * nh
    # hops of each group's route: link and time (every run of the producer sends the
    # same bytes, so each hop's time is computed once here)
    for g in range(gc):
        gh[g + 1] += gh[g]
    hlink = np.empty(gh[gc], np.int64)
    hcost = np.empty(gh[gc], np.float64)
    for i in range(n):
        a = p[i]
        for g in range(gptr[i], gptr[i + 1]):
            r0 = rptr[a * D + gdev[g]]
            for k in range(gh[g + 1] - gh[g]):
                lk = rlink[r0 + k]
                hlink[gh[g] + k] = lk
                hcost[gh[g] + k] = lat[lk] + gbytes[g] / bw[lk]
    if not record:
        H = 0

    # ---- in_order: the runtime's static per-device order and its partitions
    in_order = sched == 2
    pk = pkey
    if in_order:
        pk, dorder, doff, pfirst = in_order_ranks(
            p, M, D, kind, permb, base, inst_node, topo, topo_pos, sptr, sidx, fwd_of
        )
    else:
        dorder = np.empty(0, np.int64)
        doff = np.zeros(D + 1, np.int64)
        pfirst = np.empty(0, np.int64)
    nxt = np.zeros(D, np.int64)  # in_order: rank of the next run each device may start
    ostarted = np.zeros(T if in_order else 0, np.bool_)

    # ---- endpoint costs (LogP o): the sender pays once per transfer it sends, the
    # receiver once per transfer it receives, on the first run there that needs it
    # (in_order: the first run of that run's partition, where the runtime receives)
    has_ovh = False
    for d in range(D):
        if ovh_send[d] > 0.0 or ovh_recv[d] > 0.0:
            has_ovh = True
    ext = np.zeros(T if has_ovh else 0, np.float64)
    if has_ovh:
        for i in range(n):
            a = p[i]
            ng = gptr[i + 1] - gptr[i]
            if ng == 0:
                continue
            for t in range(base[i], base[i + 1]):
                ext[t] += ng * ovh_send[a]
            for g in range(gptr[i], gptr[i + 1]):
                b = gdev[g]
                if ovh_recv[b] == 0.0:
                    continue
                for t in range(base[i], base[i + 1]):
                    m = t - base[i]
                    tbest = -1
                    for e in range(sptr[i], sptr[i + 1]):
                        j = sidx[e]
                        if p[j] != b:
                            continue
                        tj = base[j] + m if (permb[i] and permb[j]) else base[j]
                        if tbest < 0 or pk[tj] < pk[tbest]:
                            tbest = tj
                    if in_order:
                        tbest = pfirst[tbest]
                    ext[tbest] += ovh_recv[b]

    # ---- per-device bookkeeping
    tcount = np.zeros(D, np.int64)
    nmb = np.zeros(D, np.int64)  # per-microbatch nodes on each device
    fwd_left = np.zeros(D, np.int64)
    for i in range(n):
        d = p[i]
        tcount[d] += base[i + 1] - base[i]
        if permb[i]:
            nmb[d] += 1
            if kind[i] == 0:
                fwd_left[d] += M
    # two ready heaps per device, 2d: runs never held back, 2d+1: gated runs
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
    pending = pend.copy()
    if in_order:
        # a partition receives all its remote inputs before its first run starts
        for i in range(n):
            for e in range(sptr[i], sptr[i + 1]):
                j = sidx[e]
                if p[j] == p[i]:
                    continue
                c = M if (permb[i] and not permb[j]) else 1
                for tj in range(base[j], base[j + 1]):
                    if tj != pfirst[tj]:
                        pending[tj] -= c
                        pending[pfirst[tj]] += c

    # ---- transfers: x_r is the position (in hlink/hcost) of the hop in progress
    xc = max(X, 1)
    x_inst = np.empty(xc, np.int64)
    x_dev = np.empty(xc, np.int64)
    x_rank = np.empty(xc, np.int64)  # its group's position among its producer's groups
    x_bytes = np.empty(xc, np.float64)
    x_r = np.empty(xc, np.int64)
    x_rend = np.empty(xc, np.int64)
    nx = 0
    link_free = np.zeros(L, np.float64)  # end of the last hop reserved on each link
    link_bytes = np.zeros(L, np.float64)
    # link arrivals of the current round: (link, key, transfer)
    arr_l = np.empty(xc, np.int64)
    arr_k = np.empty(xc, np.int64)
    arr_x = np.empty(xc, np.int64)
    # notifications of the current round: run m of node i reached device d
    ntc = T + X + 1
    nt_i = np.empty(ntc, np.int64)
    nt_m = np.empty(ntc, np.int64)
    nt_d = np.empty(ntc, np.int64)
    rdy = np.empty(max(T, 1), np.int64)  # runs that became ready

    rec_x = np.empty(H, np.int64)
    rec_l = np.empty(H, np.int64)
    rec_s = np.empty(H, np.float64)
    rec_e = np.empty(H, np.float64)
    nrec = 0
    tstart = np.full(T if record else 0, np.nan)
    tdur = np.full(T if record else 0, np.nan)

    # ---- events: (time, id * 4 + type) sorted by decreasing time, so the earliest
    # is last (few are pending at once); new events are staged first
    ecap = D + X + 1  # at most one pending event per device and per transfer
    ekeys = np.empty(ecap, np.float64)
    evals = np.empty(ecap, np.int64)
    esz = 0
    st_k = np.empty(ecap, np.float64)
    st_v = np.empty(ecap, np.int64)
    nst = 0

    dev_busy = np.zeros(D, np.bool_)
    busy = np.zeros(D, np.float64)
    done = 0
    makespan = 0.0

    nrdy = 0
    for t in range(T):
        if pending[t] == 0:
            rdy[nrdy] = t
            nrdy += 1
    # devices whose state changed since they were last dispatched
    dd_list = np.arange(D)
    dd_flag = np.ones(D, np.bool_)
    ndd = D

    now = 0.0
    lift = False
    while True:
        # ---- runs that became ready join their device's heap (the only ready-heap push)
        for u in range(nrdy):
            t = rdy[u]
            d = p[inst_node[t]]
            h = 2 * d + (1 if gated[t] else 0)
            off = hoff[h]
            k = hsz[h]
            hsz[h] = k + 1
            key = pk[t]
            while k > 0:
                par = (k - 1) >> 1
                if rkeys[off + par] <= key:
                    break
                rkeys[off + k] = rkeys[off + par]
                rvals[off + k] = rvals[off + par]
                k = par
            rkeys[off + k] = key
            rvals[off + k] = t
            if not dd_flag[d]:
                dd_flag[d] = True
                dd_list[ndd] = d
                ndd += 1
        nrdy = 0
        # ---- idle devices start their best eligible run (priority order, schedule gates)
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
                if in_order and not lift and rkeys[hoff[hA]] != nxt[d]:
                    best = -1  # the next run in the device's static order is not ready
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
            # pop heap bh (the only ready-heap pop)
            off = hoff[bh]
            sz = hsz[bh] - 1
            hsz[bh] = sz
            key = rkeys[off + sz]
            val = rvals[off + sz]
            k = 0
            while True:
                c = 2 * k + 1
                if c >= sz:
                    break
                if c + 1 < sz and rkeys[off + c + 1] < rkeys[off + c]:
                    c += 1
                if key <= rkeys[off + c]:
                    break
                rkeys[off + k] = rkeys[off + c]
                rvals[off + k] = rvals[off + c]
                k = c
            rkeys[off + k] = key
            rvals[off + k] = val
            i = inst_node[best]
            dd = dur[i, d]
            if has_ovh:
                dd += ext[best]
            if in_order:
                ostarted[best] = True
                while nxt[d] < tcount[d] and ostarted[dorder[doff[d] + nxt[d]]]:
                    nxt[d] += 1
            if record:
                tstart[best] = now
                tdur[best] = dd
            busy[d] += dd
            dev_busy[d] = True
            st_k[nst] = now + dd
            st_v[nst] = best * 4 + _TASK_DONE
            nst += 1
            if permb[i]:
                m = best - base[i]
                if not started[d * M + m]:
                    started[d * M + m] = True
                    infl[d] += 1
                    if infl[d] > peak[d]:
                        peak[d] = infl[d]
        ndd = 0
        lift = False
        # ---- staged events join the event list (the only insertion)
        for u in range(nst):
            key = st_k[u]
            w = esz
            while w > 0 and ekeys[w - 1] < key:
                ekeys[w] = ekeys[w - 1]
                evals[w] = evals[w - 1]
                w -= 1
            ekeys[w] = key
            evals[w] = st_v[u]
            esz += 1
        nst = 0
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
                    -1.0, busy, peak, link_bytes, tstart, tdur, rec_x, rec_l, rec_s, rec_e,
                    x_inst, x_dev,
                )  # fmt: skip
            continue

        # ---- apply every event at the earliest time (the end of the list)
        now = ekeys[esz - 1]
        na = 0
        nnt = 0
        while esz > 0 and ekeys[esz - 1] == now:
            esz -= 1
            v = evals[esz]
            typ = v & 3
            ident = v >> 2
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
                # local consumers
                nt_i[nnt] = i
                nt_m[nnt] = m
                nt_d[nnt] = a
                nnt += 1
                # remote consumers: one transfer per destination device (in_order: the
                # runs of a partition send when its last run finishes, as the runtime does)
                q0 = -1
                q1 = 0
                if in_order:
                    q0 = 0
                    if t == dorder[doff[a] + pk[t]] and (
                        pk[t] + 1 == doff[a + 1] - doff[a]
                        or pfirst[dorder[doff[a] + pk[t] + 1]] != pfirst[t]
                    ):
                        q0 = doff[a] + pk[pfirst[t]]
                        q1 = doff[a] + pk[t] + 1
                for q in range(q0, q1):
                    tt = t if q < 0 else dorder[q]
                    ii = inst_node[tt]
                    mm = tt - base[ii] if permb[ii] else -1
                    for g in range(gptr[ii], gptr[ii + 1]):
                        x = nx
                        nx += 1
                        b = gdev[g]
                        x_inst[x] = tt
                        x_dev[x] = b
                        x_rank[x] = g - gptr[ii]
                        x_bytes[x] = gbytes[g]
                        if not np.isnan(gtime[g]):
                            te = now + gtime[g]
                            if te == now:  # delivered in this round
                                nt_i[nnt] = ii
                                nt_m[nnt] = mm
                                nt_d[nnt] = b
                                nnt += 1
                            else:
                                st_k[nst] = te
                                st_v[nst] = x * 4 + _DELIVER
                                nst += 1
                        else:
                            x_r[x] = gh[g]
                            x_rend[x] = gh[g + 1]
                            arr_l[na] = hlink[gh[g]]
                            arr_k[na] = tt * D + x_rank[x]
                            arr_x[na] = x
                            na += 1
            else:
                x = ident
                deliver = typ == _DELIVER
                if not deliver:
                    r = x_r[x] + 1
                    x_r[x] = r
                    if r < x_rend[x]:
                        arr_l[na] = hlink[r]
                        arr_k[na] = x_inst[x] * D + x_rank[x]
                        arr_x[na] = x
                        na += 1
                    else:
                        deliver = True
                if deliver:
                    t = x_inst[x]
                    i = inst_node[t]
                    nt_i[nnt] = i
                    nt_m[nnt] = t - base[i] if permb[i] else -1
                    nt_d[nnt] = x_dev[x]
                    nnt += 1
        # ---- notifications count down the runs waiting on that device
        # (a per-microbatch consumer waits for the same microbatch of a per-microbatch
        # producer; otherwise every run of the consumer waits)
        for u in range(nnt):
            i = nt_i[u]
            m = nt_m[u]
            dv = nt_d[u]
            for e in range(sptr[i], sptr[i + 1]):
                j = sidx[e]
                if p[j] != dv:
                    continue
                lo = base[j]
                hi = base[j + 1]
                if m >= 0 and permb[j]:
                    lo += m
                    hi = lo + 1
                for tj in range(lo, hi):
                    if in_order and dv != p[i]:
                        tj = pfirst[tj]
                    pending[tj] -= 1
                    if pending[tj] == 0:
                        rdy[nrdy] = tj
                        nrdy += 1
        # ---- this round's link arrivals, in (link, key) order, join their link's FIFO (key:
        # producer run, then the destination's rank among the run's destinations, x_rank --
        # no device index, so a symmetry of the topology leaves the schedule as it is):
        # a FIFO link serves each transfer from max(arrival, end of the one before it)
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
            cost = hcost[x_r[x]]
            s0 = link_free[lk] if link_free[lk] > now else now
            end = s0 + cost
            link_free[lk] = end
            link_bytes[lk] += x_bytes[x]
            st_k[nst] = end
            st_v[nst] = x * 4 + _HOP_DONE
            nst += 1
            if record:
                rec_x[nrec] = x
                rec_l[nrec] = lk
                rec_s[nrec] = s0
                rec_e[nrec] = end
                nrec += 1

    return (
        makespan, busy, peak, link_bytes, tstart, tdur, rec_x, rec_l, rec_s, rec_e, x_inst, x_dev,
    )  # fmt: skip


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
