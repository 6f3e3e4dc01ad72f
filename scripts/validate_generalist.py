"""Early-stopping check of generalist checkpoints on a validation split drawn like training.

    python scripts/validate_generalist.py --policies A.pt B.pt --rows 12
    python scripts/validate_generalist.py --policies A.pt --penalties 0 1 2 4 8 16 --samples 16

``--penalties``: chain decoding's device-change penalty (``ExportedPolicy.plan(penalty=...)``),
one validation figure per value (how ``agents.decoding.DEFAULT_PENALTY`` was chosen);
``--temperatures``: its sampling temperature, likewise (``agents.decoding.DEFAULT_TEMPERATURE``);
``--decode independent`` plans with the per-unit episodes instead.

Validation problems: ``corpus_instances`` of the training corpus with another seed (same
families, cluster kinds and sizes as training, different draws), every ``k``-th one, so no
held-out family or cluster kind is looked at. Per-model search as in
``scripts/eval_generalist.py`` (``--reference each``, the default: annealing for
``--anneal-calls`` from each one-call plan, exact planners included; ``best``: from the best
heuristic's plan only, the validation figures before 27 Nov 2026).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from agents import generalist as G
from scripts.eval_generalist import (
    add_reference_argument,
    check_cache_keys,
    check_decoding_arguments,
    default_baselines,
    per_model_search,
    search_key,
    zero_shot,
)


def _penalty(s: str) -> float | list[float]:
    vals = [float(v) for v in s.split(",")]
    return vals[0] if len(vals) == 1 else vals


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", nargs="+", required=True)
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--anneal-calls", type=int, default=1000)
    ap.add_argument(
        "--penalties", type=_penalty, nargs="+", default=[None],
        help="chain penalties to compare: a number, or a comma-separated ladder (1,2,4,8)",
    )  # fmt: skip
    ap.add_argument(
        "--temperatures", type=float, nargs="+", default=[None],
        help="chain decoding's sampling temperatures to compare (default: the policy's)",
    )  # fmt: skip
    ap.add_argument(
        "--link-exponents", type=float, nargs="+", default=[None],
        help="link-aware chain decoding's exponents to compare (default: the policy's)",
    )  # fmt: skip
    ap.add_argument("--decode", default=None, choices=[None, "chain", "independent"])
    ap.add_argument("--cache", type=Path, default=Path("runs/generalist/validation.json"))
    add_reference_argument(ap)
    args = ap.parse_args(argv)
    check_decoding_arguments(ap, args)
    if args.rows < 1:  # 0 divided by zero, -2 ran all rows but 2
        ap.error(f"--rows must be an integer >= 1, got {args.rows}")
    if args.seed < 0:
        ap.error(f"--seed must be an integer >= 0, got {args.seed}")
    torch.set_num_threads(1)
    import agents

    probs = G.validation_instances(args.rows, seed=args.seed)
    cache = json.loads(args.cache.read_text()) if args.cache.exists() else {}
    # the validation caches of the earlier reference are keyed by row name
    keys = [
        pb.name if args.reference == "best" else search_key(pb, args.anneal_calls) for pb in probs
    ]
    check_cache_keys(probs, keys)
    for pb, key in zip(probs, keys, strict=True):
        if key not in cache:
            cache[key] = per_model_search(
                pb, default_baselines(args.reference),
                args.anneal_calls, reference=args.reference,
            )  # fmt: skip
            args.cache.parent.mkdir(parents=True, exist_ok=True)
            args.cache.write_text(json.dumps(cache, indent=1))
    for path in args.policies:
        pol = agents.load_policy(path)
        grid = [
            (p, t, e)
            for p in args.penalties
            for t in args.temperatures
            for e in args.link_exponents
        ]
        for pen, temp, expo in grid:
            ratios = []
            for pb, key in zip(probs, keys, strict=True):
                z = zero_shot(
                    pb, pol, args.samples, decode=args.decode, penalty=pen, temperature=temp,
                    link_exponent=expo,
                )  # fmt: skip
                s = cache[key].get("search_ms")
                if z["zs_ms"] is not None and s and not z["oom"]:
                    ratios.append(z["zs_ms"] / s)
            geo = math.exp(float(np.mean(np.log(ratios))))
            print(
                f"{path} decode={args.decode or 'default'} penalty={pen} "
                f"temperature={temp or 'default'} link_exponent={expo}: validation rows "
                f"{len(ratios)}/{len(probs)}, geo-mean {geo:.4f}, worst {max(ratios):.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
