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
