"""Test-session set-up shared by every test package."""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on one pytest-xdist worker per core: each worker (and the
    # CLI processes it starts) computes on one thread, or torch's default of one intra-op
    # thread per core oversubscribes the cores and spinning OpenMP threads stall each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)

# Ranks fork from the process's multiprocessing fork server (runtime.launch.rank_context).
# Whoever starts it first decides what it imports: a test's SubprocVecEnv started it bare,
# and every later rank in that worker imported torch again (seconds each under load).
from runtime.launch import preload_fork_server  # noqa: E402

preload_fork_server()


def pytest_collection_modifyitems(session, config, items) -> None:
    """The tests listed in ``tests/slow_tests.txt`` first, slowest first (the longest-job-first
    rule): ``--dist worksteal`` hands each worker a contiguous share and idle workers steal
    from the ends of the others' queues, so the last tests to run are short ones and the
    workers finish together instead of one waiting on a long test that started last."""
    from pathlib import Path

    listed = Path(__file__).with_name("slow_tests.txt").read_text().splitlines()
    rank = {nodeid: i for i, nodeid in enumerate(x for x in listed if x and x[0] != "#")}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))  # stable: the rest keep order
