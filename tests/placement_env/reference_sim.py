"""A small, obviously-correct pure-Python reference for the Simulator's rules (tests only).

It re-derives every quantity from the graph and cluster with plain Python loops,
dicts and ``heapq`` and follows the rules of ``docs/simulator.md`` literally. The
fast numba Simulator must give identical results.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph


def _run_time(graph: CompGraph, cluster: Cluster, i: int, d: int, s: float) -> float:
    """Seconds of one run of node i on device d (s = runs per step that share the batch)."""
    dev = cluster.devices[d]
    t = graph.times.get(dev.kind)
    if t is not None and not math.isnan(float(t[i])):
        return float(t[i]) * 1e-6 / s
    flops = float(graph.flops[i]) / s
    nbytes = float(graph.bytes_accessed[i]) / s
    return max(flops / (dev.peak_flops * dev.efficiency), nbytes / dev.mem_bw) + dev.launch_overhead


def _pairs(graph: CompGraph) -> dict[tuple[int, int], tuple[float, float]]:
    """(src, dst) -> (largest edge bytes, largest explicit edge time or NaN) over parallel edges."""
    out: dict[tuple[int, int], tuple[float, float]] = {}
    for e in range(graph.num_edges):
        key = (int(graph.src[e]), int(graph.dst[e]))
        b = float(graph.edge_bytes[e])
        t = float(graph.edge_time[e]) if graph.edge_time is not None else math.nan
        ob, ot = out.get(key, (0.0, math.nan))
        nt = ot if math.isnan(t) else (t if math.isnan(ot) else max(ot, t))
        out[key] = (max(ob, b), nt)
    return out


def reference_simulate(
    graph: CompGraph,
    cluster: Cluster,
    placement: Any,
    *,
    microbatches: int = 1,
    schedule: str = "gpipe",
) -> dict[str, Any]:
    """Makespan objective. Returns step_time, busy, peak_memory, link_bytes, inflight, starts."""
    p = [int(x) for x in placement]
    n, D, M = graph.num_nodes, cluster.num_devices, microbatches
    L = len(cluster.links)
    kind = [int(k) for k in graph.kind]
    permb = [k != 2 for k in kind]
    s = [float(M) if permb[i] else 1.0 for i in range(n)]
    runs = {i: (list(range(M)) if permb[i] else [-1]) for i in range(n)}
    pos = {int(v): k for k, v in enumerate(graph.topo_order)}
    pairs = _pairs(graph)
    succ: dict[int, list[int]] = {i: [] for i in range(n)}
    preds: dict[int, list[int]] = {i: [] for i in range(n)}
    for i, j in sorted(pairs):
        succ[i].append(j)
        preds[j].append(i)

    dur = {i: _run_time(graph, cluster, i, p[i], s[i]) for i in range(n)}
    for i in range(n):
        if math.isinf(dur[i]):
            return {"step_time": math.inf}
    in_order = schedule == "in_order"

    # a task waits for one notification per producer run it depends on
    pending: dict[tuple[int, int], int] = {}
    for j in range(n):
        for m in runs[j]:
            pending[(j, m)] = sum(M if permb[i] and not permb[j] else 1 for i in preds[j])

    def consumers_of(i: int, m: int, j: int) -> list[tuple[int, int]]:
        if permb[i] and permb[j]:
            return [(j, m)]
        return [(j, mm) for mm in runs[j]]

    # 1F1B cap: 1 + most device changes on a forward path from a forward node, <= M
    changes: dict[int, int] = {}
    for i in reversed([int(v) for v in graph.topo_order]):
        if kind[i] == 0:
            changes[i] = max(
                [changes[j] + (p[j] != p[i]) for j in succ[i] if kind[j] == 0], default=0
            )
    cap = []
    for d in range(D):
        ks = [changes[i] + 1 for i in range(n) if kind[i] == 0 and p[i] == d]
        cap.append(min(M, max(ks)) if ks else M)

    # in_order: cross-device depth of forward nodes; a backward node joins its forward node's
    depth: dict[int, int] = {}
    for i in [int(v) for v in graph.topo_order]:
        if kind[i] == 0:
            depth[i] = max([depth[u] + (p[u] != p[i]) for u in preds[i] if kind[u] == 0], default=0)
    maxd = max(depth.values(), default=0)
    names = [str(x) for x in graph.name]

    def fwd_node(i: int) -> int:
        if names[i].startswith("bwd:") and names[i][4:] in names:
            return names.index(names[i][4:])
        (f,) = [j for j in range(n) if kind[j] == 0 and graph.group[j] == graph.group[i]]
        return f

    def partition(i: int, m: int) -> tuple[int, int, int, int]:
        """(device, class, microbatch order, depth order) of a run, in_order."""
        if kind[i] == 0:
            return (p[i], 0, m, depth[i])
        if kind[i] == 1:
            return (p[i], 1, M - 1 - m, maxd - depth[fwd_node(i)])
        return (p[i], 2, 0, 0)

    def priority(i: int, m: int) -> tuple[int, ...]:
        if in_order:
            return (*partition(i, m)[1:], pos[i])
        if kind[i] == 2:
            cls = 2
        elif schedule == "gpipe":
            cls = kind[i]  # fwd 0 before bwd 1
        else:
            cls = 1 - kind[i]  # bwd 0 before fwd 1
        return (cls, max(m, 0), pos[i])

    # in_order: each device's static order, its partitions, and their first runs
    order = [
        sorted((t for t in pending if p[t[0]] == d), key=lambda t: priority(*t)) for d in range(D)
    ]
    nxt = [0] * D
    members: dict[tuple, list[tuple[int, int]]] = {}
    for d in range(D):
        for t in order[d] if in_order else ():
            members.setdefault(partition(*t), []).append(t)

    def first_of(task: tuple[int, int]) -> tuple[int, int]:
        return members[partition(*task)][0] if in_order else task

    if in_order:  # a partition waits for every remote input of its runs before its first run
        for j in range(n):
            for m in runs[j]:
                for i in preds[j]:
                    if p[i] != p[j] and first_of((j, m)) != (j, m):
                        c = M if permb[i] and not permb[j] else 1
                        pending[(j, m)] -= c
                        pending[first_of((j, m))] += c

    # endpoint cost: sender once per (run, destination device); receiver once per transfer,
    # on the first run there that needs it (in_order: the first run of its partition)
    ovh = [cluster.devices[d].transfer_overhead for d in range(D)]
    ovh_in = [ovh[d] + cluster.devices[d].receive_overhead for d in range(D)]
    extra = {t: 0.0 for t in pending}
    for i in range(n):
        dests = sorted({p[j] for j in succ[i]} - {p[i]})
        for m in runs[i]:
            extra[(i, m)] += len(dests) * ovh[p[i]]
            for b in dests:
                needs = [t for j in succ[i] if p[j] == b for t in consumers_of(i, m, j)]
                extra[first_of(min(needs, key=lambda t: priority(*t)))] += ovh_in[b]

    def gated(i: int) -> bool:
        return (schedule == "gpipe" and kind[i] == 1) or (schedule == "1f1b" and kind[i] == 0)

    ready: list[list[tuple[int, int]]] = [[] for _ in range(D)]
    for (j, m), c in pending.items():
        if c == 0:
            ready[p[j]].append((j, m))

    per_mb_nodes = [sum(1 for i in range(n) if permb[i] and p[i] == d) for d in range(D)]
    left = {(d, m): per_mb_nodes[d] for d in range(D) for m in range(M)}
    fwd_left = [M * sum(1 for i in range(n) if kind[i] == 0 and p[i] == d) for d in range(D)]
    started: set[tuple[int, int]] = set()
    inflight = [0] * D
    peak = [0] * D

    def complete_prefix(d: int) -> int:
        c = 0
        while c < M and left[(d, c)] == 0:
            c += 1
        return c

    def eligible(d: int, i: int, m: int) -> bool:
        if not gated(i):
            return True
        if schedule == "gpipe":
            return fwd_left[d] == 0
        return m < complete_prefix(d) + cap[d]

    events: list[tuple[float, int, str, Any]] = []
    seq = 0
    dev_busy = [False] * D
    link_busy = [False] * L
    queue: list[deque] = [deque() for _ in range(L)]
    busy = [0.0] * D
    link_bytes = [0.0] * L
    starts: dict[tuple[int, int], float] = {}
    total = len(pending)
    done = 0
    now = 0.0
    makespan = 0.0
    lift = False

    def notify(i: int, m: int, j: int) -> None:
        for task in consumers_of(i, m, j):
            if in_order and p[i] != p[j]:
                task = first_of(task)
            pending[task] -= 1
            if pending[task] == 0:
                ready[p[task[0]]].append(task)

    def send(i: int, m: int, a: int, now: float, arrivals: list) -> None:
        """Run (i, m) on device a sends one transfer to every other device holding a consumer."""
        nonlocal seq
        # destinations in the order of their first consumer (label-free)
        dests = sorted(
            {p[j] for j in succ[i]} - {a}, key=lambda b: min(j for j in succ[i] if p[j] == b)
        )
        for rank, b in enumerate(dests):
            there = [j for j in succ[i] if p[j] == b]
            nbytes = max(pairs[(i, j)][0] / s[i] for j in there)
            times = [pairs[(i, j)][1] * 1e-6 / s[i] for j in there]
            times = [t for t in times if not math.isnan(t)]
            tr = {
                "src": (i, m),
                "dst": b,
                "bytes": nbytes,
                "route": list(cluster.route(a, b)),
                "hop": 0,
                "rank": rank,
            }
            if times:
                heapq.heappush(events, (now + max(times), seq, "deliver", tr))
                seq += 1
            else:
                arrivals.append((tr["route"][0], (i, m), rank, tr))

    def start_hop(lk: int, now: float) -> None:
        """The link serves the transfer at the head of its queue from now."""
        nonlocal seq
        tr = queue[lk].popleft()
        ln = cluster.links[lk]
        link_busy[lk] = True
        link_bytes[lk] += tr["bytes"]
        heapq.heappush(events, (now + (ln.latency + tr["bytes"] / ln.bandwidth), seq, "hop", tr))
        seq += 1

    while True:
        # links: first in, first out
        for lk in range(L):
            if not link_busy[lk] and queue[lk]:
                start_hop(lk, now)
        # devices: highest-priority eligible ready task
        for d in range(D):
            if dev_busy[d]:
                continue
            if in_order:  # only the next run of the device's static order may start
                cands = [t for t in ready[d] if nxt[d] < len(order[d]) and t == order[d][nxt[d]]]
            else:
                cands = [t for t in ready[d] if lift or eligible(d, *t)]
            if not cands:
                continue
            i, m = min(cands, key=lambda t: priority(*t))
            ready[d].remove((i, m))
            nxt[d] += 1
            starts[(i, m)] = now
            took = dur[i] + extra[(i, m)]
            busy[d] += took
            dev_busy[d] = True
            heapq.heappush(events, (now + took, seq, "task", (i, m)))
            seq += 1
            if permb[i] and (d, m) not in started:
                started.add((d, m))
                inflight[d] += 1
                peak[d] = max(peak[d], inflight[d])
        lift = False
        if not events:
            if done == total:
                break
            assert any(ready), "reference: deadlock with nothing ready"
            lift = True
            continue
        now = events[0][0]
        arrivals = []
        while events and events[0][0] == now:
            _, _, what, payload = heapq.heappop(events)
            if what == "task":
                i, m = payload
                a = p[i]
                dev_busy[a] = False
                done += 1
                makespan = max(makespan, now)
                if permb[i]:
                    left[(a, m)] -= 1
                    if left[(a, m)] == 0:
                        inflight[a] -= 1
                    if kind[i] == 0:
                        fwd_left[a] -= 1
                for j in succ[i]:
                    if p[j] == a:
                        notify(i, m, j)
                senders = [(i, m)]
                if in_order:  # a partition's runs send when its last run finishes
                    part = members[partition(i, m)]
                    senders = part if (i, m) == part[-1] else []
                for i, m in senders:
                    send(i, m, a, now, arrivals)
            else:
                tr = payload
                if what == "hop":
                    lk = tr["route"][tr["hop"]]
                    link_busy[lk] = False
                    tr["hop"] += 1
                    # the next transfer already waiting starts the instant the link frees; a
                    # zero-length hop then ends in this same instant, before any device picks
                    # its next run (the kernel reserves the link when the transfer arrives)
                    if queue[lk]:
                        start_hop(lk, now)
                if what == "hop" and tr["hop"] < len(tr["route"]):
                    arrivals.append((tr["route"][tr["hop"]], tr["src"], tr["rank"], tr))
                else:
                    i, m = tr["src"]
                    for j in succ[i]:
                        if p[j] == tr["dst"]:
                            notify(i, m, j)
        # same-instant arrivals join a link queue ordered by (producer run, destination's
        # rank among the run's destinations, by first consumer: no device label)
        arrivals.sort(key=lambda a: (a[0], _run_index(a[1], permb, M), a[2]))
        for lk, _, _, tr in arrivals:
            queue[lk].append(tr)

    params = [0.0] * D
    act = [0.0] * D
    transient = [0.0] * D
    for i in range(n):
        params[p[i]] += float(graph.param_bytes[i])
        act[p[i]] += float(graph.act_bytes[i])
        transient[p[i]] = max(transient[p[i]], float(graph.out_bytes[i]) / s[i])
    memory = [params[d] + act[d] / M * peak[d] + transient[d] for d in range(D)]
    return {
        "step_time": makespan,
        "busy": busy,
        "peak_memory": memory,
        "link_bytes": link_bytes,
        "inflight": peak,
        "starts": starts,
        "oom": any(memory[d] > cluster.devices[d].memory for d in range(D)),
    }


def _run_index(run: tuple[int, int], permb: list[bool], M: int) -> int:
    """Global index of a producer run: nodes in graph order, each with M runs (fwd/bwd) or 1 (opt)."""
    i, m = run
    before = sum(M if permb[k] else 1 for k in range(i))
    return before + max(m, 0)


def reference_max_load(graph: CompGraph, cluster: Cluster, placement: Any) -> dict[str, Any]:
    """Max-load objective: per-device loads in the graph's units (microseconds as written)."""
    p = [int(x) for x in placement]
    D = cluster.num_devices
    pairs = _pairs(graph)
    compute = [0.0] * D
    comm = [0.0] * D
    for i in range(graph.num_nodes):
        dev = cluster.devices[p[i]]
        t = graph.times.get(dev.kind)
        if t is not None and not math.isnan(float(t[i])):
            compute[p[i]] += float(t[i])
        else:
            compute[p[i]] += _run_time(graph, cluster, i, p[i], 1.0) * 1e6
    for i in range(graph.num_nodes):
        a = p[i]
        costs = {}
        for (u, j), (nbytes, et) in sorted(pairs.items()):
            if u != i or p[j] == a:
                continue
            b = p[j]
            costs.setdefault(b, []).append((nbytes, et))
        if not costs:
            continue
        own = 0.0
        for b, lst in costs.items():
            explicit = [et for _, et in lst if not math.isnan(et)]
            if explicit:
                c = max(explicit)
            else:
                nbytes = max(x for x, _ in lst)
                c = 0.0
                for lk in cluster.route(a, b):
                    ln = cluster.links[lk]
                    c += ln.latency + nbytes / ln.bandwidth
                c *= 1e6
            own = max(own, c)
            if cluster.devices[b].kind != "cpu":
                comm[b] += c
        if cluster.devices[a].kind != "cpu":
            comm[a] += own
    loads = [compute[d] + comm[d] for d in range(D)]
    return {"load": max(loads), "loads": loads, "compute": compute, "comm": comm}
