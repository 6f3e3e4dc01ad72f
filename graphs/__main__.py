"""Command line: ``python -m graphs info NAME_OR_FILE`` prints a summary of a training graph."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from graphs.coarsening import node_seconds
from graphs.compgraph import BWD, FWD, OPT, CompGraph


def critical_path(graph: CompGraph, cost: np.ndarray) -> float:
    """Longest path through the DAG where each node costs ``cost[i]`` and edges are free."""
    finish = np.zeros(graph.num_nodes)
    start = np.zeros(graph.num_nodes)
    preds: list[list[int]] = [[] for _ in range(graph.num_nodes)]
    for s, d in zip(graph.src.tolist(), graph.dst.tolist()):
        preds[d].append(s)
    for i in graph.topo_order.tolist():
        start[i] = max((finish[p] for p in preds[i]), default=0.0)
        finish[i] = start[i] + cost[i]
    return float(finish.max()) if graph.num_nodes else 0.0


def fmt_bytes(b: float) -> str:
    """``b`` bytes in binary units, named as such: ``512 B``, ``1.50 KiB`` ... ``2.00 TiB``.

    Binary, like the clusters' device memory (a V100 has 16 GiB = 16 x 2**30 bytes).
    """
    if abs(b) < 1024:
        return f"{b:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        b /= 1024
        if abs(b) < 1024 or unit == "TiB":
            break
    return f"{b:.2f} {unit}"


def summary(graph: CompGraph, device: str | None = None, cluster: str | None = None) -> str:
    """Multi-line text summary; critical path in seconds on ``device`` kind of ``cluster``, else FLOPs."""
    lines = [
        f"graph            {graph.meta.get('name', '?')}  (hash {graph.content_hash()})",
        f"nodes            {graph.num_nodes}  (fwd {(graph.kind == FWD).sum()}, "
        f"bwd {(graph.kind == BWD).sum()}, opt {(graph.kind == OPT).sum()})",
        f"edges            {graph.num_edges}  ({fmt_bytes(float(graph.edge_bytes.sum()))} moved if all cut)",
        f"groups           {graph.num_groups}",
        f"TFLOPs           {graph.total_flops() / 1e12:.3f}  (fwd {graph.total_flops(FWD) / 1e12:.3f}, "
        f"bwd {graph.total_flops(BWD) / 1e12:.3f}, opt {graph.total_flops(OPT) / 1e12:.3f})",
        f"parameters       {graph.num_params / 1e6:.2f} M  ({graph.bytes_per_param:g} bytes/param)",
        f"parameter state  {fmt_bytes(float(graph.param_bytes.sum()))}",
        f"activations      {fmt_bytes(float(graph.act_bytes.sum()))} kept for backward",
    ]
    if "batch" in graph.meta:
        lines.insert(1, f"batch            {graph.meta['batch']}")
    if device is not None or cluster is not None:
        from graphs import clusters

        cl = clusters.load(cluster or "dgx1_v100_8")
        devs = [d for d in cl.devices if device is None or d.kind == device]
        if not devs:
            raise ValueError(
                f"no device of kind {device!r} in cluster {cl.name!r}; "
                f"kinds there: {sorted({d.kind for d in cl.devices})}"
            )
        d = devs[0]
        t = node_seconds(graph, d.peak_flops, d.mem_bw, d.efficiency, d.launch_overhead)
        if d.kind in graph.times:
            measured = graph.times[d.kind]
            t = np.where(np.isnan(measured), t, measured * 1e-6)
        lines.append(
            f"critical path    {critical_path(graph, t) * 1e3:.3f} ms on one {d.kind} "
            f"(sum of work {float(t.sum()) * 1e3:.3f} ms)"
        )
    else:
        lines.append(
            f"critical path    {critical_path(graph, graph.flops) / 1e12:.3f} TFLOPs "
            "(use --device/--cluster for seconds)"
        )
    return "\n".join(lines)


def _load(args: argparse.Namespace) -> CompGraph:
    from graphs import zoo

    target = args.target
    # a folder of a zoo model's name in the current folder (`bert-base/`, a run's output)
    # read as a graph file: "bert-base: cannot read file (Is a directory)" (4 Dec 2026)
    is_file = Path(target).is_file() or (Path(target).exists() and target not in zoo.names())
    if Path(target).suffix == ".json" or is_file:
        from graphs import io

        ignored = [f for f, v in (("--batch", args.batch), ("--seq", args.seq),
                                  ("-c/--config", args.config)) if v]  # fmt: skip
        if ignored:  # they were ignored without a word for a file (found by fuzzing)
            raise ValueError(
                f"only zoo models take {' and '.join(ignored)}; {target!r} is a graph file, "
                "whose batch, sequence and configuration are fixed"
            )
        graph = io.load(target)
        if args.max_groups is not None:
            from graphs.coarsening import coarsen

            graph = coarsen(graph, args.max_groups)
        return graph
    if target not in zoo.names() and target != "gpt":  # "gpt": the parametric GPT (-c hidden=...)
        raise ValueError(
            f"{target!r} is neither a file nor a zoo model; zoo models: "
            f"{', '.join(zoo.names())}, and gpt (parametric: -c hidden=H -c layers=L ...)"
        )
    config = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
        flag = {"batch": "--batch", "seq": "--seq", "max_groups": "--max-groups",
                "cache": "--no-cache"}.get(key)  # fmt: skip
        if flag is not None:  # zoo.build's TypeError "got multiple values" (found by fuzzing)
            raise ValueError(f"-c {key}=...: give it as {flag}, not as a model config key")
        config[key] = yaml.safe_load(value)
    return zoo.build(
        target,
        batch=args.batch,
        seq=args.seq,
        max_groups=args.max_groups,
        cache=not args.no_cache,
        **config,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarise a zoo model or a graph JSON file")
    info.add_argument("target", help="zoo model name (e.g. gpt2-xl) or path to a graph .json")
    info.add_argument("--max-groups", type=int, default=None, help="coarsen to at most K groups")
    info.add_argument("--batch", type=int, default=None, help="global batch (zoo models)")
    info.add_argument("--seq", type=int, default=None, help="sequence length (zoo models)")
    info.add_argument("--device", default=None, help="device kind for the critical path in seconds")
    info.add_argument(
        "--cluster", default=None, help="cluster preset holding --device (default dgx1_v100_8)"
    )
    info.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="model config override, e.g. -c n_layer=2 (repeatable)",
    )
    info.add_argument("--no-cache", action="store_true", help="rebuild, bypassing the graph cache")
    args = parser.parse_args(argv)
    try:
        graph = _load(args)
        text = summary(graph, device=args.device, cluster=args.cluster)
    except ValueError as exc:  # a bad file, model, option or value: one line, exit 2
        print(f"error: graphs info: {exc}", file=sys.stderr)  # the runners' "error:" form
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
