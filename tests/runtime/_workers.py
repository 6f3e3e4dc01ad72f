"""Worker functions for the multi-process runtime tests (importable by spawned processes)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from runtime.dist import init_distributed, teardown


def raise_on_rank(bad: int) -> str:
    """Rank ``bad`` raises; every other rank blocks in an all-reduce that ``bad`` never joins."""
    info = init_distributed(timeout_s=300)
    try:
        if info.rank == bad:
            time.sleep(0.2)
            raise ValueError(f"boom on rank {bad}")
        dist.all_reduce(torch.ones(1))
        return "unreachable"
    finally:
        teardown()


def tp_steps_with_comms(cases: list[tuple[dict, list[str]]]) -> list[dict]:
    """Per ``(model, module_paths)`` case, one tensor-parallel forward/backward over all ranks
    under DTensor's ``CommDebugMode``: loss, collective counts, full gradients, local shards."""
    from torch.distributed.device_mesh import init_device_mesh

    info = init_distributed(timeout_s=120)
    try:
        mesh = init_device_mesh("cpu", (info.world_size,), mesh_dim_names=("tp",))
        return [_tp_step(model, paths, mesh) for model, paths in cases]
    finally:
        teardown()


def _tp_step(model: dict, module_paths: list[str], mesh: object) -> dict:
    from torch.distributed.tensor.debug import CommDebugMode

    from runtime.dist import seed_everything
    from runtime.model import load_model
    from runtime.program import export_with_loss
    from runtime.tensor_parallel import (
        DTensorProgram,
        full_gradient,
        implicit_replication,
        parallelize_program,
        sync_grads,
    )

    seed_everything(0)
    zm = load_model(model)
    gm = export_with_loss(zm.module, zm.example_inputs, zm.loss_fn)
    plan, _ = parallelize_program(gm, mesh, module_paths)
    program = DTensorProgram(gm, mesh)
    comms = CommDebugMode()
    with comms, implicit_replication():
        out = program(*zm.example_inputs)
        loss = out[0] if isinstance(out, tuple) else out
        loss.backward()
    sync_grads(list(gm.parameters()))
    grads, local = {}, {}
    for target, p in gm.named_parameters():
        name = target.removeprefix("model.")
        grads[name] = full_gradient(name, p, plan).tolist()
        if name in plan.placements or target in plan.placements:
            local[name] = p.to_local().tolist()
    return {
        "loss": float(loss),
        "comms": {str(k): int(v) for k, v in comms.get_comm_counts().items()},
        "grads": grads,
        "local": local,
        "styles": plan.styles(),
    }


def die_on_rank(bad: int, how: str) -> str:
    """Rank ``bad`` is SIGKILLed (``how="kill"``), returns at once (``how="leave"``) or
    exits with status 0 at once (``how="exit"``) while
    every other rank waits in an all-reduce that ``bad`` never joins."""
    import os
    import signal

    info = init_distributed(timeout_s=300)
    try:
        if info.rank == bad:
            time.sleep(0.3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "exit":  # the process ends with status 0 at once (no teardown)
                os._exit(0)
            return "left"
        dist.all_reduce(torch.ones(1))
        return "unreachable"
    finally:
        teardown()


def _torchrun_main(out_dir: str, bad: int, how: str = "kill") -> None:
    """Under torchrun: rank ``bad`` is SIGKILLed (or returns, ``how="leave"``), the others
    record what they see (as ``runtime.worker`` does) and exit 1."""
    import os
    import sys
    from pathlib import Path

    from runtime.launch import write_error_file

    rank = int(os.environ["RANK"])
    try:
        die_on_rank(bad, how)
    except BaseException as exc:  # noqa: BLE001 - recorded for the launcher, as runtime.worker does
        write_error_file(Path(out_dir, f"error_rank{rank}.json"), rank, exc, time.time())
        sys.exit(1)


if __name__ == "__main__":
    import sys

    _torchrun_main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])


def environment(names: list[str]) -> dict:
    """What a rank sees: the named environment variables, its start method, and whether
    torch was already imported when this function's module was loaded (the fork server)."""
    import multiprocessing as mp
    import os
    import sys

    return {
        "env": {k: os.environ.get(k) for k in names},
        "method": mp.get_start_method(allow_none=True),
        "sys_modules_has_runtime_worker": "runtime.worker" in sys.modules,
    }
