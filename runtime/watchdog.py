"""Hang detection: each rank publishes its progress in the job's store; a stuck job names the rank that hangs."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

#: Python files whose frames mean "waiting on communication" when innermost on the main thread.
COMM_PATHS = (f"torch{os.sep}distributed{os.sep}",)
KEY = "devplace/watchdog/{}"


class RankHang(RuntimeError):
    """A rank stopped making progress outside communication (or stopped responding)."""


@dataclass
class RankState:
    """What a rank last published: when it pulsed, when it last progressed, where it is."""

    rank: int
    pulse: float  # time of the last heartbeat of its watchdog thread
    beat: float  # time of its last progress (step start/end, a pipeline chunk done)
    step: int
    phase: str
    comm: bool  # its main thread is inside torch.distributed (waiting on peers)
    where: str  # innermost frame of its main thread: file:line function


def _innermost(frame: Any) -> tuple[bool, str]:
    if frame is None:
        return False, "?"
    comm = any(p in (frame.f_code.co_filename or "") for p in COMM_PATHS)
    return (
        comm,
        f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}",
    )


def suspects(states: list[RankState], now: float, hang_s: float) -> list[RankState]:
    """The ranks to blame for a stuck job, worst first.

    A rank hangs if its watchdog stopped pulsing for ``hang_s`` (the process is frozen or
    gone) or if it has not progressed for ``hang_s`` while its main thread is outside
    communication (computing, sleeping, stuck in its own code) -- its peers are then
    all waiting on it. If every stuck rank waits on communication (a mismatched
    collective), the one that progressed least recently is named.
    """
    frozen = [s for s in states if now - s.pulse > hang_s]
    busy = [s for s in states if now - s.beat > hang_s and not s.comm and s not in frozen]
    if frozen or busy:
        return sorted(frozen, key=lambda s: s.pulse) + sorted(busy, key=lambda s: s.beat)
    stuck = [s for s in states if now - s.beat > hang_s]
    return sorted(stuck, key=lambda s: s.beat)[:1]


def describe(s: RankState, now: float, hang_s: float) -> str:
    """One line naming rank ``s.rank``, what it stopped doing, and where."""
    if now - s.pulse > hang_s:
        what = f"stopped responding (no heartbeat for {now - s.pulse:.0f} s)"
    else:
        what = f"made no progress for {now - s.beat:.0f} s outside communication"
    return f"rank {s.rank} hangs: {what} in step {s.step} ({s.phase}) at {s.where}"


class Watchdog:
    """A daemon thread per rank: publishes ``RankState`` in ``store`` every ``interval_s``;
    when this rank has not progressed for ``hang_s``, reads every rank's state, and if some
    rank hangs (:func:`suspects`) calls ``on_hang(culprit_rank, message)`` once (which
    records the error and ends the process: the launcher then stops the job).

    ``beat(step, phase)`` marks progress. The main thread's innermost Python frame tells
    whether the rank waits on peers (inside ``torch.distributed``) or not.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        hang_s: float,
        on_hang: Callable[[int, str], None],
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.store, self.rank, self.world = store, rank, world_size
        self.hang_s, self.interval_s, self.on_hang = float(hang_s), float(interval_s), on_hang
        self.step, self.phase = -1, "setup"
        self._beat = time.time()
        self.armed = False  # checks only between arm() and disarm(): set-up may take long
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="devplace-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._publish()
        self._thread.start()
        atexit.register(self.stop)  # also when the rank leaves by an uncaught exception
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread and wait for it (at most ``timeout_s``).

        It must be stopped before the process group and its store are torn down: a thread
        still inside a store call while the interpreter finalises aborts the process
        (SIGABRT at exit, seen rarely under load)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def arm(self) -> None:
        self.beat()
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        self._beat = time.time()
        if step is not None:
            self.step = step
        if phase is not None:
            self.phase = phase

    def _state(self) -> RankState:
        comm, where = _innermost(sys._current_frames().get(self._main))
        return RankState(self.rank, time.time(), self._beat, self.step, self.phase, comm, where)

    def _publish(self) -> None:
        self.store.set(KEY.format(self.rank), json.dumps(self._state().__dict__))

    def read(self) -> list[RankState]:
        out = []
        for r in range(self.world):
            try:
                raw = self.store.get(KEY.format(r))
            except Exception:  # noqa: BLE001 - a missing key means that rank never started
                out.append(RankState(r, 0.0, 0.0, -1, "not started", False, "?"))
                continue
            out.append(RankState(**json.loads(raw)))
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
                now = time.time()
                if not self.armed or now - self._beat <= self.hang_s:
                    continue
                bad = suspects(self.read(), now, self.hang_s)
                if bad and not self._stop.is_set():
                    msg = "; ".join(describe(s, now, self.hang_s) for s in bad)
                    self._stop.set()
                    self.on_hang(bad[0].rank, f"{msg} (seen by rank {self.rank})")
                    return
            except Exception:  # noqa: BLE001 - the store went away: the job is ending
                if self._stop.is_set():
                    return
                continue


def default_store() -> Any:
    """The job's key-value store (torchrun's rendezvous store, shared by every node)."""
    return dist.distributed_c10d._get_default_store()
