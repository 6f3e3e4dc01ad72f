"""PipeDream's DP with replicated stages beside the Megatron grid and the Alpa-style planner on the hybrid problems.

Usage: ``python -m scripts.bench_pipedream [--no-write]``.

For each problem of ``scripts/bench_alpa_submeshes.py`` (the hybrid envs of ``conf/env/``
and one small problem with heavy end stages) it runs ``agents.baselines`` ``pipedream``
(PipeDream's partitioning DP: contiguous layer ranges, each replicated on its own ``dp_p
x 1`` submesh, no tensor parallelism or ZeRO), ``alpa`` and ``megatron_grid`` on the
simulator and reports the step time, the layout, the oracle calls and the seconds of each
(``infeasible``: the planner's space holds no plan that fits). Prints a Markdown table and
writes it into ``docs/hybrid.md`` between ``<!-- pipedream:start -->`` /
``<!-- pipedream:end -->``.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents import baselines  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402
from scripts.bench_alpa_submeshes import ROWS, _layout, _problem, table_cli  # noqa: E402

DOC = ROOT / "docs" / "hybrid.md"
START, END = "<!-- pipedream:start -->", "<!-- pipedream:end -->"
PLANNERS = ("pipedream", "alpa", "megatron_grid")


def run() -> list[dict]:
    rows = []
    for label, name, config, cluster, opts in ROWS:
        g, cl = _problem(name, config, cluster)
        cells = {}
        for planner in PLANNERS:
            kw = {} if planner == "pipedream" else opts  # pipedream's space has ZeRO 0 anyway
            t = time.perf_counter()
            try:
                plan = baselines.get(planner)(g, cl, Simulator(g, cl), None, **kw)
            except baselines.InfeasiblePlanError as e:
                cells[planner] = dict(step=None, why=str(e), seconds=time.perf_counter() - t)
                continue
            cells[planner] = dict(
                step=plan.meta["step_time"],
                layout=_layout(plan.layout),
                calls=plan.meta["oracle_calls"],
                seconds=time.perf_counter() - t,
                mfu=plan.meta["mfu"],
            )
        rows.append(dict(label=label, gpus=cl.num_devices, **cells))
        print(label, cells, flush=True)
    return rows


def _cell(c: dict) -> str:
    if c["step"] is None:
        return f"infeasible | {c['seconds']:.1f} s"
    return f"{c['step']:.3f} ({c['mfu']:.1%}) | {c['calls']:,}, {c['seconds']:.1f} s"


def table(rows: list[dict]) -> str:
    lines = [
        f"<!-- python -m scripts.bench_pipedream | {platform.node()} | "
        f"{time.strftime('%Y-%m-%d %H:%M')} UTC -->",
        "| problem | GPUs | `pipedream`: step s (MFU) | calls, time | `alpa` | calls, time | "
        "`megatron_grid` | calls, time | `pipedream` / `megatron_grid` | `pipedream`'s layout |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        p, a, m = (r[k] for k in PLANNERS)
        ratio = f"{p['step'] / m['step']:.2f}x" if p["step"] and m["step"] else "-"
        lay = p.get("layout", "no layer fits a GPU without TP or ZeRO")
        lines.append(
            f"| {r['label']} | {r['gpus']:,} | {_cell(p)} | {_cell(a)} | {_cell(m)} | {ratio} "
            f"| {lay} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    table_cli(__doc__.splitlines()[0], lambda: table(run()), DOC, START, END)


if __name__ == "__main__":
    main()
