"""The launcher: one rank raises, every rank exits with that rank's error in bounded time."""

from __future__ import annotations

import time

import pytest

from runtime.launch import RankFailure, spawn
from tests.runtime import _workers

pytestmark = pytest.mark.timeout(90)


def test_one_rank_raises_all_exit_with_its_error():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as info:
        spawn(_workers.raise_on_rank1, 2, timeout_s=60, grace_s=1.0)
    elapsed = time.monotonic() - t0
    err = info.value
    assert err.rank == 1
    assert err.error_type == "ValueError"
    assert "boom on rank 1" in str(err)
    assert "raise_on_rank1" in err.remote_traceback
    assert all(c is not None and c != 0 for c in err.exit_codes)  # the blocked rank was killed too
    assert elapsed < 45  # far below the 300 s process-group timeout the survivor would wait


def test_spawn_rejects_zero_ranks():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        spawn(_workers.raise_on_rank1, 0)
