"""Train the shipped generalist placer: label the corpus with teachers, clone them, export.

Reproduce the shipped file (CPU, 1 torch thread; every stage resumes from WORK):

    python scripts/train_generalist.py --work runs/generalist --corpus-seeds 0 2 --steps 1500 \
        --out agents/pretrained/generalist.pt

(``--out`` defaults to ``WORK/generalist.pt``: the shipped file is replaced only when named.)

Stages: ``label`` (teacher plans of every training problem of every corpus draw,
``WORK/labels.jsonl`` for corpus seed 0, ``WORK/labels.seedS.jsonl`` for seed S),
``train`` (behaviour cloning, ``WORK/bc.ckpt`` for seed 0, ``WORK/bc.seedS.ckpt`` for
seed S), ``export`` (the policy file, with the corpus, config, git commit, steps and this
command recorded in its ``meta``). Several ``--seed`` values clone one network per seed on
the same labels and export their product-of-experts ensemble
(:class:`agents.policies.GDPEnsemble`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

from agents import generalist as G
from agents.policies import GDPEnsemble


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


#: ``--net`` keys and their types (``GDPNet``'s constructor arguments).
NET_KEYS = {"hidden": int, "num_layers": int, "attn_layers": int, "heads": int, "dropout": float}


def parse_net(items: list[str]) -> dict[str, int | float]:
    """``["hidden=128", "dropout=0.1"]`` -> ``{"hidden": 128, "dropout": 0.1}``; a bad item
    exits naming it."""
    out: dict[str, int | float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in NET_KEYS:
            raise SystemExit(f"--net {item!r}: expected KEY=VALUE with KEY one of {list(NET_KEYS)}")
        try:
            out[key] = NET_KEYS[key](value)
        except ValueError:
            raise SystemExit(
                f"--net {item!r}: {value!r} is not "
                + ("an integer" if NET_KEYS[key] is int else "a number")
            ) from None
        ok = 0 <= out[key] < 1 if key == "dropout" else out[key] >= 1
        if not ok:
            expected = "in [0, 1)" if key == "dropout" else "at least 1"
            raise SystemExit(f"--net {item!r}: {key} must be {expected}")
    try:  # before the corpus is built and labelled: GDPNet's own checks (hidden % heads)
        G.new_network(out)
    except ValueError as e:
        raise SystemExit(f"--net {' '.join(items)}: {e}") from None
    return out


def one_or_list(xs: list) -> object:
    """A value per cloned network: the value itself when there is one network."""
    return xs[0] if len(xs) == 1 else xs


def output_path(work: Path, out: Path | None) -> Path:
    """Where the policy is exported: ``out``, else ``WORK/generalist.pt`` (the shipped file
    used to be the default, so a careless run that reached the export replaced it)."""
    return work / "generalist.pt" if out is None else out


def check_arguments(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad numbers, stages and teachers before labelling starts (minutes to hours):
    ``--steps 0``, ``--lr nan``, ``--stages bogus`` were taken, ``--teachers nope`` labelled
    every problem with an error and then failed in ``collate``."""
    from agents import baselines

    def bad(flag: str, value: object, want: str) -> None:
        ap.error(f"{flag} must be {want}, got {value!r}")

    for flag, v in (("--steps", args.steps), ("--batch-size", args.batch_size)):
        if v < 1:
            bad(flag, v, "an integer >= 1")
    if args.anneal_calls < 0:
        bad("--anneal-calls", args.anneal_calls, "an integer >= 0")
    if not (math.isfinite(args.lr) and args.lr > 0):
        bad("--lr", args.lr, "a finite number > 0")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        bad("--weight-decay", args.weight_decay, "a finite number >= 0")
    for flag, v in (
        ("--teacher-seconds", args.teacher_seconds),
        ("--max-minutes", args.max_minutes),
    ):
        if v is not None and not (math.isfinite(v) and v > 0):
            bad(flag, v, "a finite number > 0")
    for flag, vs in (("--seed", args.seed), ("--corpus-seeds", args.corpus_seeds)):
        if any(v < 0 for v in vs):
            bad(flag, vs, "integers >= 0")
    stages = ("label", "train", "export")
    if not args.stages or any(x not in stages for x in args.stages):
        bad("--stages", args.stages, f"among {list(stages)}")
    ops = [n for n in baselines.names() if n not in baselines.HYBRID_PLANNERS]
    if not args.teachers or any(t not in ops for t in args.teachers):
        bad("--teachers", args.teachers, f"op-placement baselines ({', '.join(ops)})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/generalist"))
    ap.add_argument(
        "--out", type=Path, default=None,
        help="the exported policy (default WORK/generalist.pt; the shipped file is "
        "agents/pretrained/generalist.pt, overwritten only when named here)",
    )  # fmt: skip
    ap.add_argument("--steps", type=int, default=1500, help="behaviour-cloning gradient steps")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--weight-decay", type=float, default=0.0,
        help="decoupled weight decay of behaviour cloning (AdamW); 0: Adam, as shipped",
    )  # fmt: skip
    ap.add_argument(
        "--net", nargs="+", default=[], metavar="KEY=VALUE",
        help="network settings over agents.generalist.NET_CONFIG, e.g. hidden=128 dropout=0.1 "
        f"(keys: {', '.join(NET_KEYS)})",
    )  # fmt: skip
    ap.add_argument("--anneal-calls", type=int, default=300, help="annealing from the best teacher")
    ap.add_argument("--teachers", nargs="+", default=list(G.DEFAULT_TEACHERS))
    ap.add_argument(
        "--teacher-seconds", type=float, default=None,
        help="time limit of the exact planners among the teachers (ideal_dp, ilp); "
        "default: their own (60 s)",
    )  # fmt: skip
    ap.add_argument(
        "--student", default=None, metavar="POLICY",
        help="a policy (file or shipped name) whose zero-shot plan (1024 chain samples) "
        "competes with the teachers for each label: one round of expert iteration",
    )  # fmt: skip
    ap.add_argument(
        "--labels", default="best", choices=list(G.LABEL_MODES),
        help="best: the teacher fastest before annealing, annealed (as shipped); each: every "
        "teacher's plan annealed, the fastest; near: also every other annealed plan within "
        "--label-tolerance of it, one sample each",
    )  # fmt: skip
    ap.add_argument(
        "--label-tolerance", type=float, default=0.05,
        help="--labels near: relative step-time tolerance (default 0.05)",
    )  # fmt: skip
    ap.add_argument("--max-minutes", type=float, default=None, help="stop training early")
    ap.add_argument("--stages", nargs="+", default=["label", "train", "export"])
    ap.add_argument(
        "--seed", type=int, nargs="+", default=[0],
        help="behaviour-cloning seed; several: one network each, exported as their ensemble",
    )  # fmt: skip
    ap.add_argument(
        "--corpus-seeds", type=int, nargs="+", default=[0, 2],
        help="corpus draws to label and train on (seed 1 is the validation draw of "
        "scripts/validate_generalist.py: keep it out)",
    )  # fmt: skip
    ap.add_argument(
        "--corpus", default="shipped", choices=sorted(G.CORPORA),
        help="shipped: agents.generalist.CORPUS; transfer: its nested split TRANSFER_CORPUS "
        "(for choosing settings by transfer to unseen families and cluster kinds)",
    )  # fmt: skip
    ap.add_argument(
        "--canonical-labels", type=float, nargs="?", const=1e-9, default=None,
        metavar="TOLERANCE",
        help="rename equal devices in each label in order of first use where that keeps its "
        "step time within 1 + TOLERANCE (default 1e-9; agents.generalist.canonical_units)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    try:
        G.check_label_mode(args.labels, args.label_tolerance)
    except ValueError as e:
        raise SystemExit(f"--label-tolerance: {e}") from None
    check_arguments(ap, args)
    args.out = output_path(args.work, args.out)
    net_config = parse_net(args.net)
    torch.set_num_threads(1)
    base = G.corpus_named(args.corpus)
    cmd = "python " + " ".join(shlex.quote(a) for a in sys.argv)

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    student = None
    if args.student is not None:
        from agents import load_policy

        student = load_policy(args.student)
    t0 = time.perf_counter()
    problems: list[G.Problem] = []
    labels: list[dict] = []
    for cs in args.corpus_seeds:
        corpus = dataclasses.replace(base, seed=cs)
        draw = G.corpus_instances(corpus, split="train", log=log)
        log(f"corpus seed {cs}: {len(draw)} training problems")
        cache = args.work / ("labels.jsonl" if cs == 0 else f"labels.seed{cs}.jsonl")
        labels += G.label_corpus(
            draw, cache, teachers=args.teachers, anneal_calls=args.anneal_calls, log=log,
            teacher_seconds=args.teacher_seconds, student=student, mode=args.labels,
            tolerance=args.label_tolerance,
        )  # fmt: skip
        problems += draw
    label_seconds = time.perf_counter() - t0
    if "train" not in args.stages:
        return
    pairs = G.label_pairs(problems, labels)
    renamed = 0
    if args.canonical_labels is not None:
        for i, (pb, units) in enumerate(pairs):
            units, changed = G.canonical_units(pb, units, args.canonical_labels)
            pairs[i] = (pb, units)
            renamed += changed
        log(f"canonical labels: {renamed} of {len(pairs)} renamed")
    samples = [G.make_sample(pb, units) for pb, units in pairs]
    log(
        f"{len(samples)} labelled samples of {sum('units' in r for r in labels)} problems "
        f"({label_seconds:.0f} s to build and label)"
    )
    if len(set(args.seed)) != len(args.seed):
        raise SystemExit(f"--seed {args.seed}: each seed once")
    nets, runs = [], []
    for seed in args.seed:
        net, stats = G.train_bc(
            samples,
            steps=args.steps,
            checkpoint=args.work / ("bc.ckpt" if seed == 0 else f"bc.seed{seed}.ckpt"),
            batch_size=args.batch_size,
            lr=args.lr,
            seed=seed,
            net_config=net_config,
            weight_decay=args.weight_decay,
            log=log,
            max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
        )
        nets.append(net)
        runs.append(stats)
    net = nets[0] if len(nets) == 1 else GDPEnsemble.of(nets)
    if "export" not in args.stages:
        return
    teachers_used: dict[str, int] = {}
    for r in labels:
        if "teacher" in r:
            teachers_used[r["teacher"]] = teachers_used.get(r["teacher"], 0) + 1
    meta = {
        "name": "generalist",
        "training": "behaviour cloning of teacher plans (agents.generalist.train_bc)",
        "corpus": base.to_dict(),
        "corpus_name": args.corpus,
        "corpus_seeds": list(args.corpus_seeds),
        "problems": sum("units" in r for r in labels),
        "samples": len(samples),
        "max_units": max(int(s.obs["node_mask"].sum()) for s in samples),
        "max_devices": max(int(s.obs["device_mask"].sum()) for s in samples),
        "teachers": args.teachers,
        "anneal_calls": args.anneal_calls,
        "teacher_seconds": args.teacher_seconds,
        "student": args.student,
        "teacher_labels": teachers_used,
        "label_mode": args.labels,
        "label_tolerance": args.label_tolerance if args.labels == "near" else None,
        "canonical_labels": args.canonical_labels,
        "labels_renamed": renamed,
        "net_config": {**G.NET_CONFIG, **net_config},
        "bc": {
            "steps": runs[0]["steps"],
            "batch_size": args.batch_size,
            "lr": args.lr,
            "weight_decay": args.weight_decay,
            "seed": args.seed[0] if len(args.seed) == 1 else list(args.seed),
        },
        "ensemble": len(nets) > 1,
        "final_loss": one_or_list([r["history"][-1][1] if r["history"] else None for r in runs]),
        "final_unit_accuracy": one_or_list(
            [r["history"][-1][2] if r["history"] else None for r in runs]
        ),
        "train_seconds": sum(r["seconds"] for r in runs),
        "git_commit": git_commit(),
        "command": cmd,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    G.save_generalist(net, args.out, meta=meta)
    log(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
