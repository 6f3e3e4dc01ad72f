"""The launcher: one rank raises, every rank exits with that rank's error in bounded time."""

from __future__ import annotations

import time

import pytest

from runtime.launch import RankFailure, spawn
from tests.runtime import _workers

pytestmark = pytest.mark.timeout(90)


def test_one_of_four_ranks_raises_all_exit_with_its_error():
    """Rank 2 raises while ranks 0, 1, 3 block in an all-reduce it never joins."""
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(_workers.raise_on_rank, 4, (2,), timeout_s=60, grace_s=1.0)
    elapsed = time.monotonic() - t0
    err = info.value
    assert (err.rank, err.error_type) == (2, "ValueError")
    assert "boom on rank 2" in str(err) and "raise_on_rank" in err.remote_traceback
    assert len(err.exit_codes) == 4
    assert all(c is not None and c != 0 for c in err.exit_codes)  # blocked ranks killed too
    assert elapsed < 50  # far below the 300 s process-group timeout the others would wait


def test_spawn_rejects_zero_ranks():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        spawn(_workers.raise_on_rank, 0, (0,))
