"""Export a recorded SimResult schedule: Chrome-trace / Perfetto JSON and a Gantt chart PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import KIND_NAMES, CompGraph
from placement_env.oracles.base import SimResult

#: Chrome-trace process ids of the two track groups.
DEVICE_PID, LINK_PID = 0, 1
_COLORS = {"fwd": "#4C72B0", "bwd": "#DD8452", "opt": "#55A868", "link": "#8172B3"}


def _events(result: SimResult, graph: CompGraph, cluster: Cluster) -> tuple:
    """The recorded schedule, checked against the graph and cluster it is drawn with: another
    cluster wrote a trace naming devices and links it does not have, and the Gantt chart
    failed with a bare ``KeyError`` / ``IndexError`` (fuzzing, 2 Dec 2026)."""
    if result.events is None:
        raise ValueError(
            "SimResult has no schedule: evaluate the placement with record=True to export it"
        )
    D, L = len(np.asarray(result.device_busy)), len(np.asarray(result.link_bytes))
    if (D, L) != (cluster.num_devices, len(cluster.links)):
        raise ValueError(
            f"the schedule was simulated on a cluster of {D} devices and {L} links, not on "
            f"{cluster.name!r} ({cluster.num_devices} devices, {len(cluster.links)} links): "
            "pass the cluster it was evaluated on"
        )
    top = max((e.node for e in result.events), default=-1)
    if top >= graph.num_nodes:
        raise ValueError(
            f"the schedule names node {top}, but graph {graph.meta.get('name', '?')!r} has "
            f"{graph.num_nodes} nodes: pass the graph it was evaluated on"
        )
    return result.events


def _parent(path: str | Path) -> Path:
    """``path`` with its folder made (as ``graphs.io.save`` and ``export_policy`` do)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _link_name(cluster: Cluster, k: int) -> str:
    ln = cluster.links[k]
    names = cluster.node_names
    label = f" ({ln.name})" if ln.name else ""
    return f"{names[ln.src]}->{names[ln.dst]}{label}"


def chrome_trace(result: SimResult, graph: CompGraph, cluster: Cluster) -> dict[str, Any]:
    """The schedule as a Chrome-trace dict: one track per device and per directed link.

    Devices are threads of process 0 ("devices"), links threads of process 1
    ("links"); each compute or hop interval is a complete event (``ph: "X"``) with
    microsecond ``ts``/``dur`` and ``args`` naming node, kind and microbatch.
    """
    evs = _events(result, graph, cluster)
    out: list[dict[str, Any]] = [
        {"ph": "M", "pid": DEVICE_PID, "name": "process_name", "args": {"name": "devices"}},
        {"ph": "M", "pid": LINK_PID, "name": "process_name", "args": {"name": "links"}},
    ]
    for d, dv in enumerate(cluster.devices):
        out.append(
            {
                "ph": "M",
                "pid": DEVICE_PID,
                "tid": d,
                "name": "thread_name",
                "args": {"name": f"{dv.name} ({dv.kind})"},
            }
        )
    for k in range(len(cluster.links)):
        out.append(
            {
                "ph": "M",
                "pid": LINK_PID,
                "tid": k,
                "name": "thread_name",
                "args": {"name": _link_name(cluster, k)},
            }
        )
    for e in evs:
        dev = e.resource == "device"
        kind = KIND_NAMES[int(graph.kind[e.node])]
        out.append(
            {
                "ph": "X",
                "pid": DEVICE_PID if dev else LINK_PID,
                "tid": int(e.index),
                "name": e.label or graph.name[e.node],
                "cat": kind if dev else "transfer",
                "ts": e.start * 1e6,
                "dur": (e.end - e.start) * 1e6,
                "args": {"node": graph.name[e.node], "kind": kind, "microbatch": e.microbatch},
            }
        )
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "graph": str(graph.meta.get("name", "?")),
            "cluster": cluster.name,
            "step_time_s": float(result.step_time),
            "objective": result.objective,
        },
    }


def write_chrome_trace(
    result: SimResult, graph: CompGraph, cluster: Cluster, path: str | Path
) -> None:
    """Write :func:`chrome_trace` as JSON (open in https://ui.perfetto.dev or chrome://tracing)."""
    text = json.dumps(chrome_trace(result, graph, cluster))
    _parent(path).write_text(text)


def plot_gantt(
    result: SimResult,
    graph: CompGraph,
    cluster: Cluster,
    path: str | Path,
    *,
    title: str | None = None,
) -> None:
    """Draw the schedule as a Gantt chart PNG: one row per device, then one per busy link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    evs = _events(result, graph, cluster)
    used_links = sorted({e.index for e in evs if e.resource == "link"})
    rows = [("device", d) for d in range(cluster.num_devices)] + [("link", k) for k in used_links]
    row_of = {r: i for i, r in enumerate(rows)}
    bars: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for e in evs:
        cat = KIND_NAMES[int(graph.kind[e.node])] if e.resource == "device" else "link"
        r = row_of[(e.resource, e.index)]
        bars.setdefault(r, {}).setdefault(cat, []).append((e.start * 1e3, (e.end - e.start) * 1e3))
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    for r, cats in bars.items():
        for cat, spans in cats.items():
            ax.broken_barh(spans, (r - 0.4, 0.8), facecolors=_COLORS[cat], edgecolor="none")
    labels = [
        cluster.devices[i].name if kind == "device" else _link_name(cluster, i) for kind, i in rows
    ]
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"{graph.meta.get('name', 'graph')} on {cluster.name}: "
                 f"{result.step_time * 1e3:.3f} ms")  # fmt: skip
    ax.legend(handles=[Patch(color=v, label=k) for k, v in _COLORS.items()], loc="upper right")
    fig.tight_layout()
    fig.savefig(_parent(path), dpi=100)
    plt.close(fig)


__all__ = ["chrome_trace", "plot_gantt", "write_chrome_trace"]
