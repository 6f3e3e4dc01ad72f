"""What the runtime's data-parallel wrappers cost in CPU time on one process, beyond the plain module.

Usage: ``python -m scripts.measure_dp_wrappers [--repeats 10] [--microbatch 2]``.

The hybrid CPU model (``placement_env.oracles.hybrid_cpu``) takes each segment's forward /
backward time and Adam's time per parameter from measurements of plain modules; the runtime
wraps data-parallel chunks in FSDP2 (``fully_shard`` per block and chunk, ZeRO 1-3) or
``replicate`` (ZeRO 0), whose parameters are DTensors. This script measures, on a 1-rank
gloo group (no communication, so no time sharing between processes), the model of
``scripts/fidelity_hybrid.py`` (a 4-layer GPT-2) with one thread: the median CPU time of one
microbatch's forward + backward for the plain module, ``fully_shard`` with and without
resharding after forward, and ``replicate``; and of one Adam step over the plain and the
``fully_shard`` parameters. The differences are what the model's segment and optimizer
figures leave out for data-parallel plans (``docs/fidelity.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def fwd_bwd_seconds(rm: Any, repeats: int, b: int) -> float:
    """Median CPU seconds of one forward + backward of ``b`` samples (after 3 warm-ups)."""
    x = tuple(t[:b] for t in rm.example_inputs)
    out = []
    for i in range(3 + repeats):
        c0 = time.process_time()
        rm.loss_fn(rm.module(*x[:1]), *x).backward()
        if i >= 3:
            out.append(time.process_time() - c0)
    return _median(out)


def adam_seconds(module: Any, repeats: int) -> float:
    """Median CPU seconds of one ``torch.optim.Adam`` step over ``module``'s parameters."""
    import torch

    opt = torch.optim.Adam(module.parameters(), lr=1e-4)
    for p in module.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    out = []
    for _ in range(repeats):
        c0 = time.process_time()
        opt.step()
        out.append(time.process_time() - c0)
    return _median(out)


def measure(repeats: int = 10, b: int = 2, port: int = 29541) -> dict[str, float]:
    """The figures (seconds) described in the module docstring, on a fresh 1-rank gloo group."""
    import torch
    import torch.distributed as dist
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from runtime.model import load_model
    from scripts.fidelity_hybrid import MODEL

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))

        def sharded(reshard: bool) -> Any:
            rm = load_model(MODEL)
            for sub in rm.module.modules():
                if type(sub).__name__.endswith("Block"):
                    fully_shard(sub, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(rm.module, mesh=mesh, reshard_after_forward=reshard)
            return rm

        plain = load_model(MODEL)
        rep = load_model(MODEL)
        replicate(rep.module, mesh=mesh)
        z3, z12 = sharded(True), sharded(False)
        out = {
            "plain_fwd_bwd": fwd_bwd_seconds(plain, repeats, b),
            "fully_shard_fwd_bwd": fwd_bwd_seconds(z3, repeats, b),
            "fully_shard_no_reshard_fwd_bwd": fwd_bwd_seconds(z12, repeats, b),
            "replicate_fwd_bwd": fwd_bwd_seconds(rep, repeats, b),
            "plain_adam": adam_seconds(plain.module, repeats),
            "fully_shard_adam": adam_seconds(z3.module, repeats),
        }
        out["param_tensors"] = float(len(list(plain.module.parameters())))
        return out
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--microbatch", type=int, default=2)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.microbatch < 1:
        raise SystemExit("--repeats and --microbatch must be >= 1")
    m = measure(args.repeats, args.microbatch)
    base_fb, base_opt = m["plain_fwd_bwd"], m["plain_adam"]
    print(f"one microbatch of {args.microbatch} sequences, forward + backward (CPU ms):")
    for key in ("plain_fwd_bwd", "fully_shard_fwd_bwd", "fully_shard_no_reshard_fwd_bwd",
                "replicate_fwd_bwd"):  # fmt: skip
        print(f"  {key:32s} {1e3 * m[key]:7.2f}  ({1e3 * (m[key] - base_fb):+.2f})")
    print(f"one Adam step over {int(m['param_tensors'])} parameter tensors (CPU ms):")
    for key in ("plain_adam", "fully_shard_adam"):
        print(f"  {key:32s} {1e3 * m[key]:7.2f}  ({1e3 * (m[key] - base_opt):+.2f})")


if __name__ == "__main__":
    main()
