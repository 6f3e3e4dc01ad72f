"""Worker functions for the multi-process runtime tests (importable by spawned processes)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from runtime.dist import init_distributed, teardown


def raise_on_rank1() -> str:
    """Rank 1 raises; rank 0 waits for a message that never comes (a hang without the launcher)."""
    info = init_distributed(timeout_s=300)
    try:
        if info.rank == 1:
            time.sleep(0.2)
            raise ValueError("boom on rank 1")
        buf = torch.zeros(1)
        dist.recv(buf, src=1)
        return "unreachable"
    finally:
        teardown()
