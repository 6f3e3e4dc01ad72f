"""Process-group set-up and teardown for the runtime: one code path for gloo (CPU) and nccl (CUDA)."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

#: Default process-group timeout: a rank blocked on a dead peer fails after this long.
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def _env_int(name: str, default: str | None = None) -> int:
    raw = os.environ.get(name, default)
    if raw is None:
        raise RuntimeError(
            f"init_distributed: environment variable {name} is not set; launch with torchrun "
            "(python -m torch.distributed.run) or runtime.launch.spawn, which set RANK, "
            "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
        )
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(
            f"init_distributed: {name}={raw!r} is not an integer (expected e.g. {name}=0)"
        ) from None


def read_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from the torchrun variables, validated with precise errors."""
    world = _env_int("WORLD_SIZE")
    rank = _env_int("RANK")
    local = _env_int("LOCAL_RANK", str(rank))
    if world < 1:
        raise RuntimeError(f"init_distributed: WORLD_SIZE={world} must be >= 1")
    if not 0 <= rank < world:
        raise RuntimeError(
            f"init_distributed: RANK={rank} is out of range for WORLD_SIZE={world} "
            f"(expected 0 <= RANK < {world})"
        )
    if local < 0:
        raise RuntimeError(f"init_distributed: LOCAL_RANK={local} must be >= 0")
    if world > 1:
        if not os.environ.get("MASTER_ADDR"):
            raise RuntimeError(
                "init_distributed: MASTER_ADDR is not set (expected a host name or IP, "
                "e.g. MASTER_ADDR=127.0.0.1)"
            )
        port = _env_int("MASTER_PORT")
        if not 0 < port < 65536:
            raise RuntimeError(
                f"init_distributed: MASTER_PORT={port} is not a TCP port (expected 1..65535)"
            )
    return rank, world, local


def default_backend() -> str:
    """``nccl`` when CUDA is available, else ``gloo``."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init_distributed(
    backend: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DistInfo:
    """Join the process group described by the torchrun environment variables.

    Safe to call twice: a second call returns the same :class:`DistInfo`. Picks
    gloo on CPU and nccl on CUDA unless ``backend`` is given; on CUDA the local
    rank selects the GPU. Bad ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
    ``MASTER_PORT`` values raise ``RuntimeError`` naming the variable.
    """
    rank, world, local = read_env()
    if dist.is_available() and dist.is_initialized():
        be = dist.get_backend()
        if dist.get_world_size() != world or dist.get_rank() != rank:
            raise RuntimeError(
                f"init_distributed: a process group (rank {dist.get_rank()} of "
                f"{dist.get_world_size()}) already exists but the environment says "
                f"RANK={rank}, WORLD_SIZE={world}"
            )
        return DistInfo(rank, world, local, be, _device_for(be, local))
    be = backend or default_backend()
    device = _device_for(be, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(
        be,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return DistInfo(rank, world, local, be, device)


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def teardown() -> None:
    """Destroy the process group if one exists (call in ``finally``)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """One seed policy for all ranks: every rank seeds python, numpy and torch with ``seed``.

    All ranks thus build identical weights and identical data; ranks differ
    only in which part of the plan they execute.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 - global seeding is the policy
    torch.manual_seed(seed)


def free_port() -> int:
    """A TCP port that is free on this host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
