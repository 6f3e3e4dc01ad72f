"""What per-stage submeshes and recomputation buy the Alpa-style planner: ``alpa`` with and without its inter-op DP pass.

Usage: ``python scripts/bench_alpa_submeshes.py [--no-write]``.

For each problem (the hybrid envs of ``conf/env/`` -- their ``model_config`` and cluster --
and one small problem where the end stages are heavy) it runs
``agents.baselines.alpa`` four times on the simulator: ``submeshes=False`` (pass 1 only:
every stage on the same ``dp x tp`` submesh and recomputation), ``stage_recompute=False``
(pass 1, then the inter-op DP over layer ranges x submesh shapes with a ``dp x tp`` per
stage), the default (the same DP choosing each stage's recomputation too) and
``stage_zero=True`` (each stage's ZeRO stage too), and reports
the step time, the layout, the oracle calls and the search seconds of each. GPT-2 XL is built from its
dimensions (``zoo.build("gpt", ...)``, what the hybrid model reads of the extracted graph).
Prints a Markdown table and writes it into ``docs/hybrid.md`` between
``<!-- alpa-submeshes:start -->`` / ``<!-- alpa-submeshes:end -->``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from agents.baselines.alpa import alpa  # noqa: E402
from graphs import clusters, zoo  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402

DOC = ROOT / "docs" / "hybrid.md"
START, END = "<!-- alpa-submeshes:start -->", "<!-- alpa-submeshes:end -->"

GPT2_XL = dict(hidden=1600, layers=48, heads=25, vocab=50257, seq=1024, batch=8)
ROWS = [
    # (label, model name, model config or env name, cluster, alpa options)
    ("GPT-2 XL, 8 x V100 (gpt2_8gpu_hybrid)", "gpt", GPT2_XL, "dgx1_v100_8", {}),
    (
        "GPT 3.3B (h 4096, 16 layers, 128k vocabulary), 8 x V100, batch 32, ZeRO-0",
        "gpt",
        dict(hidden=4096, layers=16, heads=32, vocab=128000, seq=2048, batch=32),
        "dgx1_v100_8",
        {"zero": (0,)},
    ),
    ("GPT-3 175B, 1,024 x A100 (gpt3_175b_a100_1024)", None, "gpt3_175b_a100_1024", None, {}),
    ("Llama-2 70B shape, 768 x H100 (llama70b_h100_768)", None, "llama70b_h100_768", None, {}),
    ("GPT 1T, 3,072 x A100 (gpt_1t_a100_3072)", None, "gpt_1t_a100_3072", None, {}),
]


def _problem(name, config, cluster):
    if name is None:  # an env of conf/env/
        env = OmegaConf.load(ROOT / "conf" / "env" / f"{config}.yaml")
        name, config, cluster = str(env.model), dict(env.model_config), str(env.cluster)
    g = zoo.build(name, **config)
    base, _, nodes = cluster.rpartition("_x")
    cl = clusters.load(base, nodes=int(nodes)) if base else clusters.load(cluster)
    return g, cl


def _layout(lay) -> str:
    rc = f"recompute [{', '.join(lay.stage_recompute)}]" if lay.stage_recompute else lay.recompute
    z = f"ZeRO [{', '.join(map(str, lay.stage_zero))}]" if lay.stage_zero else f"ZeRO-{lay.zero}"
    out = f"p={lay.pp} mbs={lay.microbatch_size} {rc} SP={lay.sequence_parallel} {z}"
    if lay.stage_meshes or lay.stage_recompute or lay.stage_zero:
        sizes = ", ".join(str(b - a) for a, b in lay.stage_layers)
        out = f"layers [{sizes}], {out}"
    if lay.stage_meshes:
        meshes = ", ".join(f"{d}x{t}" for d, t in lay.stage_meshes)
        return f"dp x tp per stage [{meshes}], {out}"
    return f"d={lay.dp} t={lay.tp} {out}"


#: the runs of each row: (key, alpa options)
VARIANTS = (
    ("pass1", {"submeshes": False}),
    ("meshes", {"stage_recompute": False}),
    ("full", {}),
    ("zero", {"stage_zero": True}),
)


def run() -> list[dict]:
    rows = []
    for label, name, config, cluster, opts in ROWS:
        g, cl = _problem(name, config, cluster)
        cells = {}
        for key, var in VARIANTS:
            t = time.perf_counter()
            plan = alpa(g, cl, Simulator(g, cl), None, **var, **opts)
            cells[key] = dict(
                step=plan.meta["step_time"],
                layout=_layout(plan.layout),
                calls=plan.meta["oracle_calls"],
                seconds=time.perf_counter() - t,
                scored=plan.meta.get("submesh_layouts_scored", 0),
            )
        rows.append(dict(label=label, gpus=cl.num_devices, **cells))
        print(label, cells, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| problem | GPUs | pass 1 only: step (s) | calls, s | + inter-op DP, submesh per "
        "stage: step (s) | calls, s | gain | + recomputation per stage: step (s) | calls, s | "
        "gain | + ZeRO stage per stage: step (s) | calls, s | gain | layout found (default) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | --- |",
    ]
    for r in rows:
        a, b, c, z = r["pass1"], r["meshes"], r["full"], r["zero"]
        lines.append(
            f"| {r['label']} | {r['gpus']:,} | {a['step']:.3f} | {a['calls']:,}, {a['seconds']:.1f} "
            f"| {b['step']:.3f} | {b['calls']:,}, {b['seconds']:.1f} | {a['step'] / b['step'] - 1:+.2%} "
            f"| {c['step']:.3f} | {c['calls']:,}, {c['seconds']:.1f} | {a['step'] / c['step'] - 1:+.2%} "
            f"| {z['step']:.3f} | {z['calls']:,}, {z['seconds']:.1f} | {a['step'] / z['step'] - 1:+.2%} "
            f"| {c['layout']} |"
        )
    return "\n".join(lines) + "\n"


def write_between(doc: Path, start: str, end: str, md: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` of ``doc`` with ``md``."""
    text = doc.read_text()
    a, b = text.index(start) + len(start), text.index(end)
    doc.write_text(text[:a] + "\n" + md + text[b:])
    print(f"wrote {doc}")


def table_cli(
    description: str, make_md: Callable[[], str], doc: Path, start: str, end: str
) -> None:
    """The command line of a benchmark that writes one table: ``make_md()`` printed, and
    written into ``doc`` between the markers unless ``--no-write``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    md = make_md()
    print(md)
    if not args.no_write:
        write_between(doc, start, end, md)


def main() -> None:
    table_cli(__doc__.splitlines()[0], lambda: table(run()), DOC, START, END)


if __name__ == "__main__":
    main()
