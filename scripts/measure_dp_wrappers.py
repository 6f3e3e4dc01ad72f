"""What the runtime's data-parallel wrappers cost in CPU time on one process, beyond the plain module.

Usage: ``python -m scripts.measure_dp_wrappers [--repeats 7] [--microbatch 2]``.

The hybrid CPU model (``placement_env.oracles.hybrid_cpu``) takes each segment's forward /
backward time and Adam's time per parameter from measurements of plain modules; the runtime
wraps data-parallel chunks in FSDP2 (``fully_shard`` per block and chunk, ZeRO 1-3) or
``replicate`` (ZeRO 0), whose parameters are DTensors. This script measures, on a 1-rank
gloo group (no communication, so no time sharing between processes), the model of
``scripts/fidelity_hybrid.py`` (a 4-layer GPT-2) with one thread
(:func:`runtime.hybrid_profile.measure_wrappers`): the median CPU time of one microbatch's
forward + backward for the plain module, ``fully_shard`` with and without resharding after
forward, and ``replicate``, interleaved round by round; and of one Adam step over the plain
and the ``fully_shard`` parameters. The differences are what the model's segment and
optimizer figures leave out for data-parallel plans (``docs/fidelity.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    from scripts.argtypes import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=positive_int, default=7)
    ap.add_argument("--microbatch", type=positive_int, default=2)
    args = ap.parse_args(argv)
    from runtime.hybrid_profile import measure_wrappers
    from scripts.fidelity_hybrid import MODEL

    m = measure_wrappers(MODEL, microbatch=args.microbatch, repeats=args.repeats)
    base_fb, base_opt = m["plain_fwd_bwd"], m["plain_adam"]
    print(f"one microbatch of {args.microbatch} sequences, forward + backward (CPU ms):")
    for key in ("plain_fwd_bwd", "fully_shard_fwd_bwd", "fully_shard_no_reshard_fwd_bwd",
                "replicate_fwd_bwd"):  # fmt: skip
        print(f"  {key:32s} {1e3 * m[key]:7.2f}  ({1e3 * (m[key] - base_fb):+.2f})")
    print(f"one Adam step over {int(m['tensors'])} parameter tensors (CPU ms):")
    for key in ("plain_adam", "fully_shard_adam"):
        print(f"  {key:32s} {1e3 * m[key]:7.2f}  ({1e3 * (m[key] - base_opt):+.2f})")


if __name__ == "__main__":
    main()
