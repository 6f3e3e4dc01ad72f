"""Validate the hybrid model's memory per GPU against torchtitan's and Megatron-LM's published measurements; write the tables into docs/hybrid.md.

Usage: ``python scripts/validate_hybrid_memory.py [--no-write]``.

Source: ``benchmarks/llama3_h100_202412_torchtitan.md`` of pytorch/torchtitan (commit
9dec370, 2024-12-26; the same runs as Liang et al., "TorchTitan", ICLR 2025): Llama 3.1 8B /
70B / 405B on H100 (96 GB HBM2e) with FSDP2 (ZeRO-3: fp32 master weights, gradients and Adam
state sharded, bf16 compute), sequence 8,192 unless said, "Memory(GiB)" = the CUDA caching
allocator's peak *reserved* memory (torchtitan logs ``max_reserved_gib``), the maximum over
GPUs. Each row is predicted three times: with the model's Megatron-style defaults
(materialised attention scores, 4 bytes per logit), with FlashAttention and the eager loss
only (``flash_attention=True``, ``loss_logit_bytes=12``), and with every mechanism of
torchtitan's stack that ``ModelDims`` can switch on (:data:`TORCHTITAN`, plus 16 bytes per
logit under TP's ``loss_parallel``; the Table 1 and 3 rows with torchtitan's op-level
selective activation checkpointing, ``op_level_sac``, where the first two predictions use
Korthikanti et al.'s selective recomputation). A third table compares Megatron-LM runs whose
published figure is peak *allocated* memory (:data:`MEGATRON_RUNS`). Writes between ``<!-- memory-validation:start -->`` /
``<!-- memory-validation:end -->``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graphs import clusters, zoo  # noqa: E402
from graphs.plan import Plan  # noqa: E402
from placement_env.oracles import Simulator  # noqa: E402

DOC = ROOT / "docs" / "hybrid.md"
START, END = "<!-- memory-validation:start -->", "<!-- memory-validation:end -->"
GiB = 2**30

#: Llama 3.1 shapes (Meta's model cards / torchtitan's llama3 flavors).
LLAMA31 = {
    "8B": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256),
    "70B": dict(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=128256),
    "405B": dict(hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248, vocab=128256),
}

#: (label, torchtitan table and row, model, seq, nodes, layout, published GiB); in the op-level
#: SAC rows ``recompute="selective"`` is Korthikanti et al.'s in the first two predictions and
#: torchtitan's op-level policy (``op_level_sac``) in the third
ROWS = [
    ("8B, FSDP 8, seq 32,768, local batch 1, full AC", "Table 2, row 1 (+ compile, Float8)",
     "8B", 32768, 1, dict(dp=8, tp=1, pp=1, microbatch_size=1, global_batch=8,
                          recompute="full", zero=3), 83.9),
    ("8B, FSDP 8, local batch 2, op-level selective AC", "Table 1, row FSDP (bf16, eager)",
     "8B", 8192, 1, dict(dp=8, tp=1, pp=1, microbatch_size=2, global_batch=16,
                         recompute="selective", zero=3), 82.4),
    ("8B, FSDP 128, local batch 2, op-level selective AC", "Table 3, row FSDP (bf16, eager)",
     "8B", 8192, 16, dict(dp=128, tp=1, pp=1, microbatch_size=2, global_batch=256,
                          recompute="selective", zero=3), 67.0),
    ("70B, FSDP 32 x TP 8, local batch 16, full AC", "Table 4, row 2D (+ compile, Float8)",
     "70B", 8192, 32, dict(dp=32, tp=8, pp=1, microbatch_size=16, global_batch=512,
                           recompute="full", zero=3, sequence_parallel=True), 71.9),
    ("405B, FSDP 8 x TP 8 x PP 8, local batch 32, 1F1B, full AC",
     "Table 5, row 1F1B (+ compile, Float8, AsyncTP)", "405B", 8192, 64,
     dict(dp=8, tp=8, pp=8, microbatch_size=4, global_batch=256, recompute="full", zero=3,
          sequence_parallel=True), 82.5),
]  # fmt: skip


#: Mechanisms of torchtitan's stack (each a ModelDims field, docs/hybrid.md cites the code):
#: SDPA/FlashAttention keeps no scores; FSDP2's root stays gathered; under PP, FSDP keeps the
#: stage gathered and accumulates unsharded fp32 gradients; DTensor SP saves the gathered
#: inputs of the column-parallel linears; the pipeline stage keeps its outputs in flight,
#: and allocates its receive buffers (and keeps the last stage's logits) for the whole step.
TORCHTITAN = dict(
    flash_attention=True,
    fsdp_root_unsharded=True,
    fsdp_pipeline_unsharded=True,
    sp_saves_gathered_input=True,
    pp_keeps_stage_output=True,
    pp_step_buffers=True,
    op_level_sac=True,
)

#: Llama 2 shapes (Touvron et al. 2023, Table 1 and the released configs), sequence 4,096.
LLAMA2 = {
    "13B": dict(hidden=5120, layers=40, heads=40, kv_heads=40, ffn=13824, vocab=32000),
    "70B": dict(hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672, vocab=32000),
}

#: torchtitan's ``docs/performance.md`` (pytorch/torchtitan, the file as stored at commit
#: 0413364): Llama 3 (sequence 8,192) and Llama 2 (sequence 4,096) with FSDP2 on 64 A100
#: 80GB, local batch ``b``, no TP or PP. It gives throughput, not memory, but which runs fit:
#: every row of its two tables ran, and its footnote says Llama 2 70B with selective
#: (op-level) activation checkpointing at local batch 2 "will cause an OOM error". (label,
#: shapes, seq, local batch, recompute, ran). "selective layer" rows (every second block
#: checkpointed) are left out: the model has no such policy.
A100_RUNS = [
    ("Llama 3 8B, local batch 1, selective op AC", LLAMA31["8B"], 8192, 1, "selective", True),
    ("Llama 3 70B, local batch 1, full AC", LLAMA31["70B"], 8192, 1, "full", True),
    ("Llama 2 13B, local batch 2, no AC", LLAMA2["13B"], 4096, 2, "none", True),
    ("Llama 2 13B, local batch 2, selective op AC", LLAMA2["13B"], 4096, 2, "selective", True),
    ("Llama 2 70B, local batch 1, selective op AC", LLAMA2["70B"], 4096, 1, "selective", True),
    ("Llama 2 70B, local batch 2, full AC", LLAMA2["70B"], 4096, 2, "full", True),
    ("Llama 2 70B, local batch 2, selective op AC", LLAMA2["70B"], 4096, 2, "selective", False),
]  # fmt: skip


def a100_run(shapes: dict, seq: int, batch: int, recompute: str) -> tuple[float, bool]:
    """(peak GiB per GPU, OOM flag) of one ``A100_RUNS`` row: FSDP 64 on 8 DGX A100 80GB
    nodes with every torchtitan mechanism (no TP: 12 bytes per logit)."""
    layout = dict(dp=64, tp=1, pp=1, microbatch_size=batch, global_batch=64 * batch,
                  recompute=recompute, zero=3)  # fmt: skip
    kw = dict(TORCHTITAN, loss_logit_bytes=12.0)
    return peak_memory(shapes, seq, kw, "dgx_a100_80g", 8, layout)


def a100_table() -> tuple[str, int]:
    """The fits / OOM check on torchtitan's A100 runs; (markdown, rows that agree)."""
    lines = [
        "| torchtitan run (FSDP 64, A100 80GB) | published | predicted (GiB) | predicted | agrees |",
        "| --- | --- | ---: | --- | --- |",
    ]
    agree = 0
    for label, shapes, seq, batch, recompute, ran in A100_RUNS:
        gib, oom = a100_run(shapes, seq, batch, recompute)
        agree += oom != ran
        lines.append(
            f"| {label} | {'ran' if ran else 'OOM'} | {gib:.1f} | {'OOM' if oom else 'fits'} | "
            f"{'yes' if oom != ran else '**no**'} |"
        )
    lines.append("")
    lines.append(f"Fits or OOM as published: {agree} of {len(A100_RUNS)} runs (capacity 80 GiB).")
    return "\n".join(lines) + "\n", agree


#: Megatron-LM pull request #482 (NVIDIA/Megatron-LM, ``tools/get_training_info/README.md``,
#: the file as stored at commit 18247cb): Megatron-LM's GPTModel with ``--swiglu
#: --use-flash-attn --use-distributed-optimizer --bf16`` (the tool asserts all four), hidden
#: 4,096, 32 layers, 32 heads, SwiGLU width int(4h * 2/3 / 64) * 64 = 10,880, tied
#: embeddings, learned positions, on one 8 x H800 machine; "Peak_Memory_Actual" is
#: ``torch.cuda.max_memory_allocated()`` reported by Megatron's ``report_memory`` after
#: several iterations (allocated bytes, not reserved), in GiB. Sequence 2,048 and GPT-2's
#: 50,257-token vocabulary (padded by Megatron to a multiple of 128 x TP) are not in the
#: table: they are the tool's example settings, and its published estimates follow from
#: them (55.5, 49.5 and 28.6 GiB exactly, 69.0 against 68.8 for the first row).
#: (label, layout, published max allocated GiB, the tool's published estimate GiB)
MEGATRON_RUNS = [
    ("DP 8, micro-batch 2, global batch 2,048",
     dict(dp=8, tp=1, pp=1, microbatch_size=2, global_batch=2048), 69.1, 68.8),
    ("DP 4 x TP 2, micro-batch 4, global batch 512",
     dict(dp=4, tp=2, pp=1, microbatch_size=4, global_batch=512), 55.7, 55.5),
    ("DP 4 x PP 2, micro-batch 2, global batch 2,048",
     dict(dp=4, tp=1, pp=2, microbatch_size=2, global_batch=2048), 49.8, 49.5),
    ("TP 8, micro-batch 4, global batch 128",
     dict(dp=1, tp=8, pp=1, microbatch_size=4, global_batch=128), 28.8, 28.6),
]  # fmt: skip

#: Megatron-LM's defaults that the model's defaults do not assume: with ``--bf16`` it
#: accumulates and reduces gradients in an fp32 buffer (``arguments.py``: "bfloat16 requires
#: gradient accumulation and all-reduce to be done in fp32", so 4 bytes per parameter where
#: the model's default is fp16's 2), and it trains with dropout 0.1 (``--hidden-dropout``,
#: ``--attention-dropout``), so each layer keeps its two residual dropout masks.
MEGATRON_BF16 = dict(grad_bytes=4.0, dropout=True)


def megatron_run(layout: dict, megatron: bool = True) -> float:
    """Peak GiB per GPU of one ``MEGATRON_RUNS`` layout: the SwiGLU GPT as a tied ``llama``
    of the same shape with FlashAttention, ZeRO-1 (the distributed optimizer), no
    recomputation, on one DGX H100 node (the H800's memory system is the H100's); with
    ``megatron`` also :data:`MEGATRON_BF16`."""
    t = layout["tp"]
    vocab = -(-50257 // (128 * t)) * (128 * t)
    shapes = dict(hidden=4096, layers=32, heads=32, kv_heads=32, ffn=10880, vocab=vocab,
                  tied=True)  # fmt: skip
    kw = dict(flash_attention=True, **(MEGATRON_BF16 if megatron else {}))
    lay = dict(layout, recompute="none", zero=1, sequence_parallel=False)
    return peak_memory(shapes, 2048, kw, "dgx_h100", 1, lay)[0]


def megatron_table() -> tuple[str, list[float]]:
    """Predicted against Megatron-LM's measured peak *allocated* memory; (markdown, errors
    of the predictions with Megatron's bf16 defaults)."""
    lines = [
        "| Megatron-LM run (SwiGLU GPT 6.6B, seq 2,048, bf16, 8 x H800) | published max "
        "allocated (GiB) | the PR's own estimate (GiB) | predicted, model defaults (GiB) | "
        "predicted, Megatron's bf16 defaults (GiB) | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    errors = []
    for label, layout, pub, est in MEGATRON_RUNS:
        d, m = megatron_run(layout, False), megatron_run(layout, True)
        errors.append(m / pub - 1)
        lines.append(
            f"| {label} | {pub:.1f} | {est:.1f} | {d:.1f} | {m:.1f} | {errors[-1] * 100:+.1f} % |"
        )
    within = sum(abs(e) <= 0.10 for e in errors)
    lines.append("")
    lines.append(
        f"Megatron's bf16 defaults: {within} of {len(errors)} runs within 10 % "
        f"({sum(abs(e) <= 0.05 for e in errors)} within 5 %); errors "
        f"{', '.join(f'{e * 100:+.1f} %' for e in errors)}."
    )
    return "\n".join(lines) + "\n", errors


def loss_bytes(layout: dict) -> float:
    """torchtitan's eager ``cross_entropy(pred.float())``: 12 B per logit; with TP it runs
    under ``loss_parallel`` (on by default), whose fused backward holds 16 B per logit."""
    return 16.0 if layout.get("tp", 1) > 1 else 12.0


def predict(model: str, seq: int, nodes: int, layout: dict, mode: str) -> float:
    """Peak GiB per GPU; ``mode``: "defaults" (Megatron-style), "flash" (FlashAttention and
    the eager loss only: the previous table), "torchtitan" (every mechanism above)."""
    kw: dict = {}
    if mode in ("flash", "torchtitan"):
        kw = dict(flash_attention=True, loss_logit_bytes=12.0)
    if mode == "torchtitan":
        kw = dict(TORCHTITAN, loss_logit_bytes=loss_bytes(layout))
    return peak_memory(LLAMA31[model], seq, kw, "dgx_h100", nodes, layout)[0]


def peak_memory(
    shapes: dict, seq: int, kw: dict, cluster: str, nodes: int, layout: dict
) -> tuple[float, bool]:
    """(peak GiB per GPU, OOM flag) of a LLaMA of ``shapes`` (``ModelDims`` switches ``kw``)
    under ``layout`` on ``nodes`` nodes of the ``cluster`` preset."""
    g = zoo.build("llama", seq=seq, **shapes, **kw)
    cl = clusters.load(cluster, nodes=nodes)
    res = Simulator(g, cl).evaluate(Plan.hybrid(g, cl, **layout))
    return float(res.peak_memory.max()) / GiB, bool(res.oom)


def table() -> tuple[str, dict[str, float]]:
    lines = [
        "| torchtitan run (Llama 3.1, H100) | source | published (GiB) | predicted, defaults (GiB) "
        "| FlashAttention + eager loss only (GiB) | all torchtitan mechanisms (GiB) | error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    pred: dict[str, float] = {}
    modes = ("defaults", "flash", "torchtitan")
    for label, src, model, seq, nodes, lay, pub in ROWS:
        d, f, t = (predict(model, seq, nodes, lay, mode) for mode in modes)
        pred[label] = t
        lines.append(
            f"| {label} | {src} | {pub:.1f} | {d:.1f} | {f:.1f} | {t:.1f} | "
            f"{(t / pub - 1) * 100:+.1f} % |"
        )
    # Table 1 vs Table 3: the same run but for the FSDP degree (8 vs 128): the difference is
    # the sharded state alone, whatever the activation-checkpointing policy keeps
    a, b = ROWS[1], ROWS[2]
    diff = pred[a[0]] - pred[b[0]]
    pub = a[6] - b[6]
    lines.append(
        f"| difference of the two op-level SAC rows (FSDP 8 vs 128: sharded state only) | Tables 1, 3 | "
        f"{pub:.1f} | | | {diff:.1f} | {(diff / pub - 1) * 100:+.1f} % |"
    )
    comparable = [pred[r[0]] / r[6] - 1 for r in ROWS]
    comparable.append(diff / pub - 1)
    within = sum(abs(e) <= 0.10 for e in comparable)
    lines.append("")
    lines.append(
        f"All torchtitan mechanisms: {within} of {len(comparable)} comparable figures within 10 %; "
        f"errors {', '.join(f'{e * 100:+.1f} %' for e in comparable)}."
    )
    return "\n".join(lines) + "\n", pred


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    md, _ = table()
    md += "\n" + a100_table()[0]
    md += "\n" + megatron_table()[0]
    print(md)
    if not args.no_write:
        text = DOC.read_text()
        if START not in text or END not in text:
            raise SystemExit(f"{DOC}: no {START} / {END} markers")
        a, b = text.index(START) + len(START), text.index(END)
        DOC.write_text(text[:a] + "\n" + md + text[b:])
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
