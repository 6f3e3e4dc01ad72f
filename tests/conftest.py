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


def pytest_collection_modifyitems(config, items):
    """Long tests first: the journeys (CLI chains) and the tests allowed 5 minutes or more
    (multi-process runs). Under pytest-xdist's work stealing the short tests then fill the
    gaps, instead of one long test running alone at the end while the other workers idle."""

    def long(item) -> bool:
        m = item.get_closest_marker("timeout")
        return "tests/journeys/" in item.nodeid or bool(m and m.args and m.args[0] >= 300)

    items.sort(key=lambda item: not long(item))  # stable: each group keeps its order
