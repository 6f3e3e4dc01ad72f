"""Benchmark the hybrid step model: evaluations/s of hybrid plans at 64, 1,024 and 6,144 GPUs.

Usage: ``python scripts/bench_hybrid.py [--seconds 3] [--no-write]``.

For each row (a Megatron-style layout of a GPT model on DGX A100 80GB or DGX H100
nodes) it times ``Simulator.evaluate(plan)`` (the plan carries its ``HybridLayout``)
after one warm-up call (the search time of ``megatron_grid`` is measured by
``scripts/validate_hybrid.py``, not here). Rates are
per second of CPU time of this process (``time.process_time``, one core: numba kernels
are not parallel) and per second of wall time. Prints a Markdown table and writes it
into ``docs/hybrid.md`` between ``<!-- bench:start -->`` / ``<!-- bench:end -->``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphs import clusters, zoo  # noqa: E402
from graphs.plan import Plan  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402

DOC = ROOT / "docs" / "hybrid.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"

#: (label, model kwargs, cluster, nodes, layout kwargs)
ROWS = [
    (
        "GPT 18.4B, 64 x A100",
        dict(name="gpt", hidden=6144, layers=40, heads=48, vocab=51200, seq=2048),
        "dgx_a100_80g", 8,
        dict(dp=8, tp=8, pp=1, microbatch_size=1, global_batch=512, recompute="full"),
    ),
    (
        "GPT-3 175B, 1,024 x A100",
        dict(name="gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048),
        "dgx_a100_80g", 128,
        dict(dp=16, tp=8, pp=8, microbatch_size=1, global_batch=1536, recompute="full"),
    ),
    (
        "GPT 1T, 3,072 x A100",
        dict(name="gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048),
        "dgx_a100_80g", 384,
        dict(dp=6, tp=8, pp=64, microbatch_size=1, global_batch=3072, recompute="full"),
    ),
    (
        "GPT 1T, 6,144 x H100 (interleaved v=2)",
        dict(name="gpt", hidden=25600, layers=128, heads=160, vocab=51200, seq=2048),
        "dgx_h100", 768,
        dict(dp=12, tp=8, pp=64, microbatch_size=1, global_batch=6144, virtual_stages=2,
             recompute="selective", sequence_parallel=True),
    ),
]  # fmt: skip


def bench(seconds: float) -> list[dict]:
    out = []
    for label, mkw, cname, nodes, lkw in ROWS:
        mkw = dict(mkw)
        g = zoo.build(mkw.pop("name"), **mkw)
        t = time.perf_counter()
        cl = clusters.load(cname, nodes=nodes)
        load_s = time.perf_counter() - t
        sim = Simulator(g, cl)
        plan = Plan.hybrid(g, cl, **lkw)
        res = sim.evaluate(plan)  # warm-up (numba cache, topology)
        n, c0, w0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - w0 < seconds or n < 3:
            sim.evaluate(plan)
            n += 1
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        out.append(
            dict(
                label=label,
                gpus=cl.num_devices,
                evals=n,
                per_cpu_s=n / cpu,
                per_wall_s=n / wall,
                ms=1e3 * wall / n,
                load_s=load_s,
                tflops=res.model_flops_per_device / 1e12,
                mfu=res.mfu,
                mem=float(res.peak_memory.max()) / 2**30,
            )
        )
        print(out[-1], flush=True)
    return out


def table(rows: list[dict]) -> str:
    head = (
        "| plan | GPUs | evaluations/s (CPU) | evaluations/s (wall) | ms / evaluation | "
        "cluster load (s) | TFLOP/s per GPU | MFU | memory per GPU (GiB) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    body = "".join(
        f"| {r['label']} | {r['gpus']:,} | {r['per_cpu_s']:.0f} | {r['per_wall_s']:.0f} | "
        f"{r['ms']:.2f} | {r['load_s']:.2f} | {r['tflops']:.1f} | {r['mfu']:.3f} | {r['mem']:.1f} |\n"
        for r in rows
    )
    return (
        head
        + body
        + f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, one process.\n"
    )


def main() -> None:
    from scripts.argtypes import positive_float

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=positive_float, default=3.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    md = table(bench(args.seconds))
    print(md)
    if not args.no_write and DOC.exists():
        text = DOC.read_text()
        if START in text and END in text:
            a, b = text.index(START) + len(START), text.index(END)
            DOC.write_text(text[:a] + "\n" + md + text[b:])
            print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
