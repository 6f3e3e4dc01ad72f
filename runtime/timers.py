"""Per-rank wall-clock accounting: compute, communication and idle seconds of a step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StepTimer:
    """Accumulates seconds spent in compute and in communication calls.

    ``comm`` counts time blocked in send/recv/collectives, which includes waiting
    for a peer that is still computing; ``idle`` is the step's remainder.
    """

    device: torch.device = torch.device("cpu")
    compute: float = 0.0
    comm: float = 0.0
    #: called after every timed block (progress for :class:`runtime.watchdog.Watchdog`)
    on_progress: Callable[[], None] | None = None

    def reset(self) -> None:
        self.compute = 0.0
        self.comm = 0.0

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        _sync(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            _sync(self.device)
            dt = time.perf_counter() - t0
            if self.on_progress is not None:
                self.on_progress()
            if what == "compute":
                self.compute += dt
            elif what == "comm":
                self.comm += dt
            else:
                raise ValueError(f"StepTimer.timed: unknown category {what!r} (compute or comm)")
