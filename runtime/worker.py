"""One rank of a plan execution: ``python -m runtime.worker --spec SPEC.json --out DIR`` under torchrun."""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.dist import init_distributed, seed_everything, teardown
from runtime.launch import write_error_file
from runtime.model import load_model
from runtime.spec import RunSpec
from runtime.timers import StepTimer
from runtime.watchdog import RankHang, Watchdog, default_store

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}


def build_runner(
    spec: RunSpec, rank: int, device: torch.device, timer: StepTimer
) -> tuple[Any, tuple]:
    """Build the model (seeded) and the runner for ``spec.mode``; returns ``(runner, inputs)``."""
    seed_everything(spec.seed)
    zm = load_model(spec.model)
    module = zm.module.to(device)
    inputs = tuple(x.to(device) for x in zm.example_inputs)
    for x in inputs:  # the same batch on every rank, whatever the factory did
        dist.broadcast(x, src=0)
    M = spec.microbatches
    if spec.mode == "hybrid":
        from runtime.hybrid import HybridSpec, make_runner

        runner = make_runner(
            module,
            zm.loss_fn,
            inputs,
            HybridSpec.from_layout(spec.hybrid),
            rank=rank,
            world_size=spec.world_size,
            timer=timer,
            device=device,
            tp_modules=spec.tp_modules or None,
        )
        return runner, inputs
    if spec.mode == "tp":
        from runtime.tensor_parallel import TensorParallelRunner

        return (
            TensorParallelRunner(
                module,
                zm.loss_fn,
                spec.tp_modules,
                inputs,
                rank=rank,
                world_size=spec.world_size,
                microbatches=M,
                timer=timer,
                device=device,
            ),
            inputs,
        )
    from runtime.program import export_with_loss

    if inputs[0].shape[0] % M:
        raise ValueError(
            f"batch of {inputs[0].shape[0]} cannot be split into {M} equal microbatches"
        )
    gm = export_with_loss(module, tuple(x.chunk(M, dim=0)[0] for x in inputs), zm.loss_fn)
    known = spec.device_of if spec.mode == "oplevel" else spec.stage_of
    names = {n.name for n in gm.graph.nodes if n.op == "call_function"}
    if known and not names & set(known):
        raise ValueError(
            "plan does not match the model: none of its forward node names "
            f"(e.g. {sorted(known)[:3]}) is an op of the exported program (e.g. {sorted(names)[:3]})"
        )
    if spec.mode == "oplevel":
        from runtime.oplevel import OpLevelRunner

        runner: Any = OpLevelRunner(
            gm,
            spec.device_of,
            rank=rank,
            world_size=spec.world_size,
            microbatches=M,
            timer=timer,
            device=device,
        )
    else:
        from runtime.pipeline import PipelineRunner

        runner = PipelineRunner(
            gm,
            spec.stage_of,
            spec.stage_rank,
            rank=rank,
            world_size=spec.world_size,
            microbatches=M,
            schedule=spec.schedule,
            timer=timer,
            device=device,
            tp_degree=spec.tp_degree,
            tp_modules=spec.tp_modules,
        )
    return runner, inputs


def local_grads(runner: Any) -> dict[str, list]:
    """Gradients of the parameters this rank holds (gathered for tensor parallel), as lists."""
    if hasattr(runner, "full_grads"):
        grads = runner.full_grads()
    else:
        grads = {n: runner.gm.get_parameter("model." + n).grad for n in runner.param_names}
    return {n: g.detach().cpu().tolist() for n, g in grads.items() if g is not None}


def inject_fault(spec: RunSpec, rank: int, step: int) -> None:
    """``spec.fault`` on this rank before ``step``: sleep for good or die by SIGKILL."""
    f = spec.fault
    if not f or f["rank"] != rank or int(f.get("step", 0)) != step:
        return
    if f["kind"] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # "hang": never returns; the watchdogs end the job
        time.sleep(3600)


def peak_memory(device: torch.device) -> float:
    """Bytes at this process's peak so far: CUDA's peak allocation, else the peak resident set.

    On CPU this is ``getrusage``'s ``ru_maxrss`` (the whole process, the Python and
    torch runtime included; KiB on Linux, bytes on macOS), 0 where it is unavailable.
    """
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return 0.0
    rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss if sys.platform == "darwin" else rss * 1024.0


def _proc_status(field: str) -> float | None:
    """``/proc/self/status``'s ``field`` (e.g. ``VmRSS``, ``VmHWM``) in bytes; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


def _malloc_trim() -> None:
    """glibc's ``malloc_trim(0)`` (returns free heap pages to the system); no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (``VmHWM``) to its current size (Linux:
    ``/proc/self/clear_refs`` <- 5); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StepMemory:
    """The memory a run's steps add on this rank, measured apart from the process and model build.

    CPU (Linux): :meth:`start` collects garbage, returns free heap pages to the system
    (``malloc_trim``), resets the peak resident set (``VmHWM``) and reads the
    resident set (``VmRSS``) before the model is built; :meth:`built` reads it again once
    the runner and the optimizer exist (the process baseline -- Python, torch, gloo --
    plus the model build: weights, exported program, wrappers); :meth:`finish` reads the
    peak since :meth:`start`. ``step`` = peak - built: the gradients, optimizer state,
    activations, communication buffers and allocator slack the warm-up and timed steps
    add. CUDA: the same from ``torch.cuda`` allocation counters (``start`` resets the peak).
    Every figure is 0.0 where the platform gives none.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.before = self.after_build = 0.0

    def _now(self) -> float:
        if self.device.type == "cuda":
            return float(torch.cuda.memory_allocated(self.device))
        return _proc_status("VmRSS") or 0.0

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            _malloc_trim()  # hand freed heap (an earlier spec's) back before the baseline
            reset_peak_rss()
        self.before = self._now()

    def built(self) -> None:
        self.after_build = self._now()

    def finish(self) -> dict[str, float]:
        if self.device.type == "cuda":
            peak = float(torch.cuda.max_memory_allocated(self.device))
        else:
            peak = _proc_status("VmHWM") or 0.0
        return {
            "rss_before_build": self.before,
            "base_memory": self.after_build,
            "run_peak": peak,
            "step_memory": max(0.0, peak - self.after_build) if peak else 0.0,
        }


def run_steps(
    spec: RunSpec,
    rank: int,
    device: torch.device,
    capture_grads: bool,
    watchdog: Watchdog | None = None,
) -> dict[str, Any]:
    """Build ``spec``'s runner on this (initialised) rank and run ``warmup`` + ``steps`` steps.

    Each step starts after a barrier; its time is this rank's wall time to finish
    forward, backward and optimizer step. With ``capture_grads`` the gradients of
    the first step (before the optimizer) are included; ``peak_memory`` is this
    process's peak so far (:func:`peak_memory`), ``base_memory`` / ``step_memory`` /
    ``run_peak`` this spec's own figures (:class:`StepMemory`). A ``watchdog`` is armed during
    the steps: every timed block and step phase counts as progress.
    """
    timer = StepTimer(device, on_progress=watchdog.beat if watchdog else None)
    mem = StepMemory(device)
    mem.start()
    runner, inputs = build_runner(spec, rank, device, timer)
    params = runner.parameters()
    opt = OPTIMIZERS[spec.optimizer](params, lr=spec.lr) if params else None
    mem.built()
    rec: dict[str, Any] = {"rank": rank, "device": spec.devices[rank], "steps": []}
    if watchdog is not None:
        watchdog.arm()
    for i in range(spec.warmup + spec.steps):
        if watchdog is not None:
            watchdog.beat(i, "barrier")
        dist.barrier()
        timer.reset()
        t0, c0 = time.perf_counter(), time.process_time()
        if watchdog is not None:
            watchdog.beat(i, "forward/backward")
        inject_fault(spec, rank, i)
        loss = runner.forward_backward(inputs)
        untimed = untimed_cpu = 0.0
        if i == 0:  # the checks' loss and gradients: not part of a training step's time
            u0, uc0 = time.perf_counter(), time.process_time()
            lt = torch.tensor([loss], dtype=torch.float64)
            dist.all_reduce(lt)
            rec["loss"] = float(lt.item())
            if capture_grads:
                rec["grads"] = local_grads(runner)
            untimed, untimed_cpu = time.perf_counter() - u0, time.process_time() - uc0
        if opt is not None:  # a rank may hold only parameter-free ops
            with timer.timed("compute"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0 - untimed
        cpu = time.process_time() - c0 - untimed_cpu
        if i >= spec.warmup:
            rec["steps"].append(
                {
                    "wall": wall,
                    "cpu": cpu,
                    "compute": timer.compute,
                    "comm": timer.comm,
                    "idle": max(0.0, wall - timer.compute - timer.comm),
                }
            )
    if watchdog is not None:
        watchdog.beat(spec.warmup + spec.steps, "final barrier")
    dist.barrier()
    rec["peak_memory"] = peak_memory(device)
    rec.update(mem.finish())
    if watchdog is not None:
        watchdog.disarm()
    return rec


def _hang_handler(rank: int, out_dir: str | None) -> Callable[[int, str], None]:
    """What a rank's watchdog does when it finds a rank that hangs: record the error under
    that rank's number (in this rank's error file) and end this process."""

    def on_hang(culprit: int, message: str) -> None:
        print(f"[rank {rank}] {message}", file=sys.stderr, flush=True)
        if out_dir:
            write_error_file(
                Path(out_dir, f"error_rank{rank}.json"), culprit, RankHang(message), time.time()
            )
        os._exit(1)

    return on_hang


def run_rank(
    spec_json: str, out_dir: str | None = None, capture_grads: bool = False
) -> dict[str, Any] | list[dict[str, Any]]:
    """Run the plan(s) on this rank: for each, ``warmup`` then ``steps`` timed steps.

    ``spec_json`` is one :class:`RunSpec` (returns this rank's record, written to
    ``out_dir/rank{r}.json``) or a JSON list of RunSpecs of the same world size and
    backend, run one after another in this process group (returns the list of
    records, written as ``{"records": [...]}``); a spec's own ``capture_grads`` is used
    in the list form. On error the error is written to ``out_dir/error_rank{r}.json``
    and re-raised.
    """
    rank = -1
    watchdog = None
    try:
        many = spec_json.lstrip().startswith("[")
        specs = (
            [RunSpec.from_json(json.dumps(d)) for d in json.loads(spec_json)]
            if many
            else [RunSpec.from_json(spec_json)]
        )
        if not specs:
            raise ValueError("empty list of RunSpecs")
        for spec in specs:
            spec.validate()
        sizes = {(s.world_size, s.backend) for s in specs}
        if len(sizes) > 1:
            raise ValueError(
                f"RunSpecs launched together need one world size and backend, got {sorted(sizes, key=str)}"
            )
        spec = specs[0]
        info = init_distributed(spec.backend, timeout_s=max(s.timeout_s for s in specs))
        rank = info.rank
        if info.world_size != spec.world_size:
            raise ValueError(
                f"plan needs {spec.world_size} processes (one per device {spec.devices}), "
                f"but WORLD_SIZE={info.world_size}"
            )
        hang_s = max(s.hang_timeout_s for s in specs)
        if hang_s > 0 and info.world_size > 1:
            watchdog = Watchdog(
                default_store(), rank, info.world_size, hang_s, _hang_handler(rank, out_dir)
            ).start()
        recs = []
        for s in specs:
            if info.device.type == "cpu":
                torch.set_num_threads(max(1, s.threads))
            recs.append(
                run_steps(
                    s, rank, info.device, s.capture_grads if many else capture_grads, watchdog
                )
            )
            gc.collect()  # the previous plan's runner and optimizer state
        if out_dir:
            payload = {"records": recs} if many else recs[0]
            Path(out_dir, f"rank{rank}.json").write_text(json.dumps(payload))
        return recs if many else recs[0]
    except BaseException as exc:
        if out_dir:
            r = rank if rank >= 0 else int(os.environ.get("RANK", "0"))
            write_error_file(Path(out_dir, f"error_rank{r}.json"), r, exc, time.time())
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()
        teardown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spec", required=True, help="RunSpec JSON file")
    ap.add_argument("--out", required=True, help="folder for rank{r}.json / error_rank{r}.json")
    args = ap.parse_args(argv)
    text = Path(args.spec).read_text()
    many = text.lstrip().startswith("[")
    run_rank(text, args.out, capture_grads=False if many else RunSpec.from_json(text).capture_grads)
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
