"""runtime.execute: run a Plan (one process per device, forked from a fork server or under
torchrun) and measure it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphs.cluster import Cluster
from graphs.compgraph import CompGraph
from graphs.plan import Plan
from runtime.launch import (
    RankFailure,
    first_failure,
    kill_tree,
    read_error_files,
    run_folder,
    spawn,
    torchrun_failures,
    with_silent_exits,
)
from runtime.spec import RunSpec, make_run_spec


@dataclass
class ExecResult:
    """Measured execution of a plan.

    Attributes:
        step_time: median over timed steps of the slowest rank's step wall time, seconds.
        step_times: per timed step, the slowest rank's wall time.
        compute, comm, idle: per rank, mean seconds per step (see ``runtime.timers``).
        cpu: per rank, mean CPU seconds per step (``time.process_time``: every thread of the
            rank's process, gloo's included; below the wall time when the rank waits or
            shares a core). Empty for results saved before it was measured.
        loss: loss of the first step.
        devices: cluster device of each rank.
        mode, world_size, microbatches, schedule, plan_hash: what ran.
        peak_memory: per rank, bytes at the process's peak (CPU: peak resident set of the
            whole process, Python and torch included; CUDA: peak allocation); empty for
            results saved before it was measured. Under ``run_specs`` a process's peak
            covers the specs it ran before too.
        base_memory: per rank, bytes resident once this run's model, runner and optimizer
            were built, before the first step (CPU: ``VmRSS``, the process baseline --
            Python, torch, gloo -- included; CUDA: allocated bytes).
        step_memory: per rank, bytes the steps add: this run's peak (CPU: ``VmHWM``, reset
            when the run starts, so not covering earlier specs of a ``run_specs`` launch)
            minus ``base_memory`` -- gradients, optimizer state, activations,
            communication buffers and allocator slack (``runtime.worker.StepMemory``).
        run_peak: per rank, this run's own peak (``base_memory + step_memory`` when the
            build itself peaks lower than the steps). Empty where not measured.
    """

    step_time: float
    step_times: list[float]
    compute: list[float]
    comm: list[float]
    idle: list[float]
    loss: float
    devices: list[int]
    mode: str
    world_size: int
    microbatches: int
    schedule: str
    plan_hash: str
    extra: dict[str, Any] = field(default_factory=dict)
    peak_memory: list[float] = field(default_factory=list)
    base_memory: list[float] = field(default_factory=list)
    step_memory: list[float] = field(default_factory=list)
    run_peak: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_ranks(cls, spec: RunSpec, records: list[dict[str, Any]]) -> ExecResult:
        """Combine the per-rank records written by :func:`runtime.worker.run_rank`."""
        records = sorted(records, key=lambda r: r["rank"])
        if len(records) != spec.world_size:
            raise ValueError(f"expected {spec.world_size} rank records, got {len(records)}")
        walls = np.array([[s["wall"] for s in r["steps"]] for r in records])
        per_step = walls.max(axis=0)

        def mean(key: str) -> list[float]:
            return [float(np.mean([s[key] for s in r["steps"]])) for r in records]

        extra: dict[str, Any] = {}
        if any("grads" in r for r in records):  # RunSpec.capture_grads: first holder of each
            grads: dict[str, Any] = {}
            for r in records:
                for name, g in r.get("grads", {}).items():
                    grads.setdefault(name, g)
            extra["grads"] = grads
        return cls(
            step_time=float(np.median(per_step)),
            step_times=[float(x) for x in per_step],
            compute=mean("compute"),
            comm=mean("comm"),
            idle=mean("idle"),
            loss=float(records[0].get("loss", float("nan"))),
            devices=list(spec.devices),
            mode=spec.mode,
            world_size=spec.world_size,
            microbatches=spec.microbatches,
            schedule=spec.schedule,
            plan_hash=spec.plan_hash,
            extra=extra,
            peak_memory=[float(r.get("peak_memory", 0.0)) for r in records],
            base_memory=[float(r.get("base_memory", 0.0)) for r in records],
            step_memory=[float(r.get("step_memory", 0.0)) for r in records],
            run_peak=[float(r.get("run_peak", 0.0)) for r in records],
            cpu=mean("cpu") if all("cpu" in s for r in records for s in r["steps"]) else [],
        )


def torchrun_command(nproc: int, spec_path: Path, out_dir: Path) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node=N -m runtime.worker ...``."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--monitor-interval=0.1",
        "-m",
        "runtime.worker",
        "--spec",
        str(spec_path),
        "--out",
        str(out_dir),
    ]


#: The records a launch writes into its folder (removed before the next launch there).
STALE_RECORD = re.compile(r"(error_rank|rank|result_rank)\d+\.json|rank\d+\.log")

#: How plans are launched on this host: ``"local"`` (:func:`runtime.launch.spawn`: ranks
#: forked from a server that imported torch once) or ``"torchrun"`` (``python -m
#: torch.distributed.run``: a fresh interpreter per rank, 2-3 s of CPU each on this
#: project's CPU machines). Both run :func:`runtime.worker.run_rank` per rank with the same
#: environment variables and blame the same rank when one fails.
LAUNCHERS = ("local", "torchrun")


def _local_rank(spec_path: str, out_dir: str) -> None:
    """One rank of a ``"local"`` launch (the body of ``python -m runtime.worker``)."""
    from runtime.worker import main

    main(["--spec", spec_path, "--out", out_dir])


def _launch(
    text: str, nproc: int, threads: int, folder: Path, timeout_s: float, launcher: str = "local"
) -> list[Any]:
    """Run ``runtime.worker`` on spec file text, one process per rank (``launcher``, one of
    :data:`LAUNCHERS`); the per-rank JSON records (``folder/rank{r}.json``). Each rank's
    output goes to ``folder/rank{r}.log`` (local) or ``folder/torchrun.log``.

    Raises :class:`RankFailure` with the first rank's root-cause error, or on timeout
    (every rank is killed).
    """
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < float("inf")):
        raise ValueError(f"timeout_s {timeout_s!r}: expected a finite number of seconds > 0")
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}: expected one of {list(LAUNCHERS)}")
    # an earlier run's records in the same folder (output_dir=...) would be read as this
    # run's: its error reported instead of this one's, its ranks counted as finished
    # (exact names: "rank*.json" also deleted a user's ranked_plan.json, found by fuzzing)
    for stale in folder.iterdir() if folder.is_dir() else ():
        if STALE_RECORD.fullmatch(stale.name) and stale.is_file():
            stale.unlink(missing_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(text)
    timeout = f"plan execution did not finish within {timeout_s} s"
    if launcher == "local":
        try:
            spawn(
                _local_rank, nproc, (str(spec_path), str(folder)), timeout_s=timeout_s,
                env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))},
                folder=folder, logs=True,
            )  # fmt: skip
        except RankFailure as exc:
            if exc.error_type == "timeout" and exc.rank == -1:
                raise RankFailure(-1, "timeout", timeout, "", exc.exit_codes) from None
            raise
        # spawn's own markers (the records are rank{r}.json, as under torchrun)
        for done in folder.glob("result_rank*.json"):
            done.unlink(missing_ok=True)
        return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", str(threads))
    # torchrun's own log folder (--log-dir, read from PET_LOG_DIR): without one it makes a
    # $TMPDIR/torchelastic_* folder per launch and leaves it; its output is torchrun.log here
    with run_folder("devplace_torchrun_") as elastic_logs:
        env.setdefault("PET_LOG_DIR", elastic_logs)
        proc = subprocess.Popen(
            torchrun_command(nproc, spec_path, folder),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
        )
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # the workers run in sessions of their own: killing torchrun's group alone left
            # them running, and communicate() waited for them (2 min past a 30 s limit)
            kill_tree(proc.pid)
            log, _ = proc.communicate()
            raise RankFailure(-1, "timeout", timeout) from None
        except BaseException:  # SIGTERM (SystemExit), Ctrl-C: no orphaned workers
            kill_tree(proc.pid)
            proc.wait()
            raise
    (folder / "torchrun.log").write_text(log or "")
    if proc.returncode != 0:
        records = read_error_files(folder)
        finished = {r for r in range(nproc) if (folder / f"rank{r}.json").exists()}
        exits = with_silent_exits(torchrun_failures(log or ""), nproc, records, finished)
        failure = first_failure(records, exits)
        if failure is not None:
            raise failure
        raise RankFailure(
            -1, "exit", f"torchrun exited with {proc.returncode}:\n{(log or '')[-3000:]}"
        )
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(nproc)]


def run_spec(
    spec: RunSpec,
    *,
    timeout_s: float = 600.0,
    out_dir: str | Path | None = None,
    launcher: str = "local",
) -> ExecResult:
    """Launch ``spec`` (one process per rank, see :data:`LAUNCHERS`) and collect the result;
    raises :class:`RankFailure` on error.

    If any rank fails, the launcher terminates the others; the first root-cause error
    written by a rank is re-raised here. The whole job is killed after ``timeout_s``.
    """
    spec.validate()
    with run_folder("devplace_exec_") as tmp:
        folder = Path(out_dir) if out_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        records = _launch(
            spec.to_json(), spec.world_size, spec.threads, folder, timeout_s, launcher
        )
        result = ExecResult.from_ranks(spec, records)
        if out_dir:
            result.save(folder / "result.json")
        return result


def run_specs(
    specs: list[RunSpec],
    *,
    timeout_s: float = 600.0,
    out_dir: str | Path | None = None,
    launcher: str = "local",
) -> list[ExecResult]:
    """Run several specs of one world size and backend in one launch (see :data:`LAUNCHERS`),
    in order.

    The processes start, import torch and form the process group once; each spec is
    then built (seeded) and run exactly as :func:`run_spec` would, one after another.
    This saves the launch cost (seconds per plan on CPU), so many plans can be
    measured close together in time. One failing spec fails the whole launch.
    """
    if not specs:
        return []
    for spec in specs:
        spec.validate()
    sizes = sorted({(s.world_size, str(s.backend)) for s in specs})
    if len(sizes) > 1:
        raise ValueError(
            f"run_specs launches one process group: every spec needs the same world size "
            f"and backend, got (world size, backend) {sizes}; use execute_many to group them"
        )
    with run_folder("devplace_exec_") as tmp:
        folder = Path(out_dir) if out_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps([json.loads(s.to_json()) for s in specs])
        per_rank = _launch(text, specs[0].world_size, specs[0].threads, folder, timeout_s, launcher)
        results = [
            ExecResult.from_ranks(spec, [rec["records"][i] for rec in per_rank])
            for i, spec in enumerate(specs)
        ]
        if out_dir:
            Path(folder, "results.json").write_text(
                json.dumps([r.to_dict() for r in results], indent=1)
            )
        return results


class WrongMachine(ValueError):
    """A plan made for accelerators that this machine cannot run (or rehearse) as asked."""


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _available_memory() -> int:
    """Bytes of memory available to new processes on this machine (``MemAvailable``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def rehearsal_memory(spec: RunSpec) -> int:
    """Bytes a CPU rehearsal of ``spec`` needs, roughly: every rank builds the whole model
    in fp32 (weights, then gradients and optimizer state of its part), so about
    ``world_size x 3 x 4 bytes x parameters`` (activations of small batches are extra)."""
    from runtime.model import load_model

    params = sum(p.numel() for p in load_model(spec.model, device="meta").module.parameters())
    return int(spec.world_size * 3 * 4 * params)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else ('es' if noun.endswith('s') else 's')}"


def check_machine(spec: RunSpec, cluster: Cluster, *, rehearse: bool) -> str | None:
    """Refuse, or describe, running ``spec`` (made for ``cluster``) on this machine.

    A plan for CPU processes (``cpu_N``) runs as it is. A plan whose devices are
    accelerators needs ``world_size`` CUDA devices; without them it is refused with
    one :class:`WrongMachine` message that says how to run it, unless ``rehearse`` is
    set: then it runs on gloo CPU processes (the same program, placement and
    schedule, not the accelerators' speed) if :func:`rehearsal_memory` fits in the
    memory available, and the returned note says it is a rehearsal.
    """
    if spec.backend == "nccl" and _cuda_devices() < spec.world_size:
        raise WrongMachine(
            f"backend=nccl needs {_count(spec.world_size, 'CUDA device')} (one per process), "
            f"this machine has {_cuda_devices()}; leave backend unset (nccl on GPUs, else "
            "gloo) or set backend=gloo"
        )
    kinds = sorted({cluster.devices[d].kind for d in spec.devices})
    if kinds == ["cpu"]:
        return None
    gpus = _cuda_devices()
    if gpus >= spec.world_size and spec.backend != "gloo":
        return None
    what = f"{spec.world_size} x {'/'.join(kinds)} of cluster {cluster.name!r}"
    if not rehearse:
        raise WrongMachine(
            f"this plan runs on {what}, but this machine has {gpus} CUDA device(s). Run it on a "
            f"machine with {_count(spec.world_size, 'GPU')} (the same command picks nccl there), "
            f"or rehearse it here on {_count(spec.world_size, 'gloo CPU process')} with "
            "rehearse=true"
        )
    need, have = rehearsal_memory(spec), _available_memory()
    if need > have:
        raise WrongMachine(
            f"a CPU rehearsal of this plan ({what}) needs about {need / 2**30:.1f} GiB "
            f"({spec.world_size} processes each building the model in fp32) but only "
            f"{have / 2**30:.1f} GiB is available; run it on a machine with {spec.world_size} GPUs"
        )
    return (
        f"rehearsal: the plan for {what} runs on {spec.world_size} gloo CPU processes of this "
        "machine; its step time is this machine's, not the accelerators'"
    )


def execute(
    plan: Plan,
    graph: CompGraph,
    cluster: Cluster,
    *,
    model: dict[str, Any] | None = None,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
    backend: str | None = None,
    nproc: int | None = None,
    timeout_s: float = 600.0,
    out_dir: str | Path | None = None,
    rehearse: bool | None = None,
    echo: Callable[[str], None] | None = None,
    launcher: str = "local",
    **options: Any,
) -> ExecResult:
    """Execute ``plan`` for ``graph`` on ``cluster``: ``warmup`` then ``steps`` timed steps.

    The plan is checked before anything is launched: made for this graph and
    cluster (hashes), device indices in range, tensor-parallel sizes divisible, and
    ``nproc`` (if given) equal to the number of processes the plan needs (one per
    device; a pipeline with ``tp_degree`` t needs stages x t). ``model`` defaults to
    ``plan.meta["model"]``. The processes are started by ``launcher`` (:data:`LAUNCHERS`:
    forked from a fork server that imported torch once, or ``torchrun --standalone``); gloo
    on CPU, nccl on CUDA. ``capture_grads=True`` puts the first step's gradients in
    ``result.extra["grads"]``. With ``out_dir`` the spec, per-rank records and logs
    (``rank{r}.log``, or ``torchrun.log``) and ``result.json`` are kept there.
    ``rehearse`` (True/False) first checks that this
    machine can run the plan's devices (:func:`check_machine`; ``None`` skips the check);
    a rehearsal's note is in ``result.extra["note"]`` and is passed to ``echo`` (if given)
    before the launch.
    """
    spec = make_run_spec(
        plan,
        graph,
        cluster,
        model,
        steps=steps,
        warmup=warmup,
        seed=seed,
        backend=backend,
        **options,
    )
    if nproc is not None and nproc != spec.world_size:
        raise ValueError(
            f"plan uses {spec.world_size} devices {spec.devices} but {nproc} processes were requested; "
            "the world size must equal the number of devices in the plan"
            + (
                f" (pipeline stages x tp_degree {spec.tp_degree})"
                if spec.mode == "pipeline" and spec.tp_degree > 1
                else ""
            )
        )
    note = None if rehearse is None else check_machine(spec, cluster, rehearse=rehearse)
    if note is not None:
        spec = dataclasses.replace(spec, backend="gloo")
        if echo is not None:
            echo(note)
    result = run_spec(spec, timeout_s=timeout_s, out_dir=out_dir, launcher=launcher)
    if note is not None:
        result.extra["note"] = note
        if out_dir:
            result.save(Path(out_dir) / "result.json")
    return result


def execute_many(
    plans: list[Plan],
    graph: CompGraph,
    cluster: Cluster,
    *,
    model: dict[str, Any] | None = None,
    steps: int = 5,
    warmup: int = 2,
    seed: int = 0,
    backend: str | None = None,
    timeout_s: float = 600.0,
    out_dir: str | Path | None = None,
    launcher: str = "local",
    **options: Any,
) -> list[ExecResult]:
    """Execute several plans, one launch per world size (``launcher``: see :data:`LAUNCHERS`);
    results in the order of ``plans``.

    Every plan is checked before anything is launched, as in :func:`execute`. Plans
    that need the same number of processes run one after another, in the given
    order, in one launch (:func:`run_specs`), each with its own model build, warm-up
    and timed steps; this amortises the launch (process start, ``import torch``,
    process group) over the plans. A plan may appear more than once (repeated
    measurements). ``timeout_s`` applies to each launch; with ``out_dir`` each
    launch keeps its files in ``out_dir/world{k}``.
    """
    specs = [
        make_run_spec(
            plan, graph, cluster, model, steps=steps, warmup=warmup, seed=seed,
            backend=backend, **options,
        )
        for plan in plans
    ]  # fmt: skip
    groups: dict[int, list[int]] = {}
    for i, spec in enumerate(specs):
        groups.setdefault(spec.world_size, []).append(i)
    results: list[ExecResult | None] = [None] * len(specs)
    for k, idx in groups.items():
        folder = Path(out_dir, f"world{k}") if out_dir else None
        for i, res in zip(
            idx,
            run_specs(
                [specs[i] for i in idx], timeout_s=timeout_s, out_dir=folder, launcher=launcher
            ),
        ):
            results[i] = res
    return [r for r in results if r is not None]
