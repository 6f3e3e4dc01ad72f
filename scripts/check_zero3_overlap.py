"""How much a hybrid plan's predicted step rests on ZeRO-3's assumed overlap: per-layer compute vs collectives, and the step with nothing overlapped.

Usage: ``python scripts/check_zero3_overlap.py``. Prints, for GPT-3 175B on 1,024 A100 80GB
(the ``megatron_grid`` winner and the published-style layout) and for torchtitan's Llama 3.1
8B FSDP runs on 8 and 128 H100s: the step time, one layer's forward / backward (the model's
``max(compute, collective)``), its compute alone, the ZeRO all-gather and reduce-scatter of
one layer, and the step if no ZeRO collective overlapped compute. The figures are quoted in
``docs/hybrid.md`` ("ZeRO-3 overlap").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphs import clusters, zoo  # noqa: E402
from graphs.layout import model_dims  # noqa: E402
from graphs.plan import Plan  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402
from placement_env.oracles.collectives import Topology  # noqa: E402
from placement_env.oracles.hybrid import HybridModel  # noqa: E402

CASES = [
    ("GPT-3 175B, 1,024 A100, megatron_grid's layout",
     dict(name="gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048),
     ("dgx_a100_80g", 128),
     dict(dp=256, tp=4, pp=1, microbatch_size=2, global_batch=1536, recompute="selective",
          sequence_parallel=True, zero=3)),
    ("GPT-3 175B, 1,024 A100, published-style layout",
     dict(name="gpt", hidden=12288, layers=96, heads=96, vocab=51200, seq=2048),
     ("dgx_a100_80g", 128),
     dict(dp=16, tp=8, pp=8, microbatch_size=1, global_batch=1536, recompute="full", zero=0)),
    ("Llama 3.1 8B, FSDP on 8 H100 (torchtitan Table 1 shape, full AC)",
     dict(name="llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
          seq=8192),
     ("dgx_h100", 1),
     dict(dp=8, tp=1, pp=1, microbatch_size=2, global_batch=16, recompute="full", zero=3)),
    ("Llama 3.1 8B, FSDP on 128 H100 (torchtitan Table 3 shape, full AC)",
     dict(name="llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
          seq=8192),
     ("dgx_h100", 16),
     dict(dp=128, tp=1, pp=1, microbatch_size=2, global_batch=256, recompute="full", zero=3)),
]  # fmt: skip


def main() -> None:
    for label, mkw, (cname, nodes), lay in CASES:
        mkw = dict(mkw)
        g = zoo.build(mkw.pop("name"), **mkw)
        cl = clusters.load(cname, nodes=nodes)
        plan = Plan.hybrid(g, cl, **lay)
        res = Simulator(g, cl).evaluate(plan)
        L, d = plan.layout, model_dims(g)
        grp = np.array([L.rank(0, j, 0) for j in range(L.dp)])
        topo = Topology.from_cluster(cl)
        lp = d.layer_params() / L.tp * 2.0  # bf16 bytes of one layer's TP shard
        ag = topo.allgather(lp, grp) if L.dp > 1 else 0.0
        rs = topo.reduce_scatter(lp, grp) if L.dp > 1 else 0.0
        # the layer's compute alone: the same layout without ZeRO traffic (ZeRO-0, dp kept)
        bare = HybridModel(g, cl).evaluate(type(L).from_dict({**L.to_dict(), "zero": 0}))
        fwd_c, bwd_c = bare.breakdown["layer_fwd"], bare.breakdown["layer_bwd"]
        b = res.breakdown
        line = (
            f"{label}: step {res.step_time:.3f} s (MFU {res.mfu:.3f}); one layer and microbatch: "
            f"fwd {b['layer_fwd'] * 1e3:.1f} ms (compute {fwd_c * 1e3:.1f}), "
            f"bwd {b['layer_bwd'] * 1e3:.1f} ms (compute {bwd_c * 1e3:.1f}); "
            f"all-gather {ag * 1e3:.1f} ms, reduce-scatter {rs * 1e3:.1f} ms"
        )
        if L.zero >= 3 and L.dp > 1:
            hidden = (
                L.num_microbatches
                * d.layers
                * (fwd_c + ag - b["layer_fwd"] + bwd_c + ag + rs - b["layer_bwd"])
            )
            line += f"; nothing overlapped: +{hidden:.2f} s -> {res.step_time + hidden:.2f} s"
        print(line)


if __name__ == "__main__":
    main()
